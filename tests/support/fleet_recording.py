"""A fleet recording of many servers' DP ranks (what `kvscope fleet --record` writes: each batch
tagged with its engine's name), to play a 1,024-engine fleet into a real server quickly.

Server `s` rank 0 is engine `server-<s>`, rank r > 0 `server-<s>:dp<r>` (how the fleet names the
further ranks an endpoint carries). Every engine stores a first block every engine shares and one
of PROMPTS system prompts (the maps' grey trunk: each prompt is under more than 1/8 of the
fleet's blocks), under it a conversation its server's ranks share (`shared_of(s)` blocks: the same
colour on each of them) and one of its own (`own_of(s, r)` blocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from kvevents.codec import Stored, encode_batch
from kvevents.recording import Recorder

from .apputil import ROOT, PortTaken, free_port

BLOCK = 4  # tokens per block
PROMPTS = 4


def engine_name(server: int, rank: int) -> str:
    return f"server-{server}" if rank == 0 else f"server-{server}:dp{rank}"


def shared_of(server: int) -> int:
    return 6 + server % 5


def own_of(server: int, rank: int) -> int:
    return 4 + (server * 7 + rank * 5) % 30


def blocks_of(server: int, rank: int) -> int:
    """Blocks an engine holds once played."""
    return 2 + shared_of(server) + own_of(server, rank)


def write_dp_fleet(path, servers: int = 128, ranks: int = 8) -> dict[str, int]:
    """Write the recording; returns each engine's blocks held once it is played."""
    rec = Recorder(str(path), "fleet test", "")
    held, now = {}, time.time()
    for s in range(servers):
        head = [[999_999] * BLOCK, [1_000_000 + s % PROMPTS] * BLOCK]
        shared = [[2_000_000 + s * 64 + k] * BLOCK for k in range(shared_of(s))]
        for r in range(ranks):
            e = s * ranks + r
            name = engine_name(s, r)
            own = [[3_000_000 + e * 64 + k] * BLOCK for k in range(own_of(s, r))]
            first = [e * 128 + k + 1 for k in range(len(head) + len(shared))]  # the engine's own hashes
            then = [e * 128 + 64 + k for k in range(len(own))]
            batch = [Stored(first, None, [t for b in head + shared for t in b], BLOCK),
                     Stored(then, first[len(head) - 1], [t for b in own for t in b], BLOCK)]
            rec.write(now, e, name.encode(), encode_batch(batch, now, r))
            held[name] = len(first) + len(then)
            assert held[name] == blocks_of(s, r)
    rec.close()
    return held


class FleetPlayer:
    """A real `python -m app.cli fleet --play FILE --name NAME` (uvicorn, the dashboard and the
    API) on a free loopback port, once it answers /healthz and the recording is played in."""

    def __init__(self, path, name: str = "big", timeout_s: float = 90.0) -> None:
        self.name = name
        # The free port is chosen before the server binds it: another process may take it in
        # between, so a start that fails on "address already in use" tries a fresh port.
        for attempt in range(3):
            try:
                self._start(str(path), timeout_s)
                return
            except PortTaken:
                if attempt == 2:
                    raise

    def _start(self, path: str, timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "KVSCOPE_TOKEN"}
        env.update(PYTHONPATH=str(ROOT), KVSCOPE_DEVICE="cpu")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "fleet", "--play", path, "--name", self.name,
             "--port", str(self.port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s  # importing torch on a loaded machine takes a while
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode(errors="replace")
                if "address already in use" in out.lower():
                    raise PortTaken(out)
                raise RuntimeError(f"server exited: {out}")
            try:
                r = httpx.get(f"{self.url}/api/fleets/{self.name}", params={"engines_limit": 0},
                              timeout=5)
                if r.status_code == 200 and (r.json().get("playback") or {}).get("state") == "done":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the fleet was not played in {timeout_s} s")

    def summary(self) -> dict:
        r = httpx.get(f"{self.url}/api/fleets/{self.name}", params={"engines_limit": 0}, timeout=30)
        return r.json()["summary"]

    def fill(self, held: dict, unreachable: list[dict], timeout_s: float = 60.0) -> None:
        """Wait for the played engines (`held`, as `write_dp_fleet` returns) to be applied on
        the loop, then add `unreachable` (engine bodies whose endpoints nobody listens on) and
        wait until each shows unreachable."""
        end = time.monotonic() + timeout_s
        while self.summary()["engines"] < len(held):
            assert time.monotonic() < end, self.summary()
            time.sleep(0.1)
        for body in unreachable:
            r = httpx.post(f"{self.url}/api/fleets/{self.name}/engines", json=body, timeout=30)
            assert r.status_code == 201, r.text
        while self.summary()["by_state"].get("unreachable", 0) < len(unreachable):
            assert time.monotonic() < end, self.summary()
            time.sleep(0.1)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")
