"""Helpers of the engine tests: an engine driver process (engine_driver.py) and a kvscope mirror
following it, compared after every step.

Imported by name (`from enginetest import ...`: tests/engines is on the path, conftest.py)."""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from allocator.prefix.mirror import MirrorPool
from app.engines.server import free_ports, group_alive
from kvevents.follow import follow, threaded_apply

HERE = Path(__file__).parent
VOCAB = 4096
BLOCK = 32


class Driver:
    """engine_driver.py in a process group of its own; `call` sends one command and reads the
    answer (bounded wait)."""

    def __init__(self, model: Path, events_port: int, replay_port: int, log: Path, *,
                 num_blocks: int = 64, max_num_seqs: int = 8, env: dict | None = None,
                 boot_timeout: float = 240) -> None:
        self.log = log
        full_env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false",
                    **(env or {})}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "engine_driver.py"), "--model", str(model),
                 "--events-port", str(events_port), "--replay-port", str(replay_port),
                 "--num-blocks", str(num_blocks), "--max-num-seqs", str(max_num_seqs)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True, env=full_env)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.ready = self._read(boot_timeout)
        assert self.ready.get("ready"), self.ready

    def _read(self, timeout: float) -> dict:
        if not self._sel.select(timeout):
            self.kill()
            raise AssertionError(f"engine driver silent for {timeout:.0f} s; log:\n{self.tail()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"engine driver exited ({self.proc.wait()}); log:\n{self.tail()}")
        return json.loads(line)

    def call(self, cmd: dict, timeout: float = 120) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def add(self, requests: list[dict]) -> None:
        assert self.call({"op": "add", "requests": requests}) == {"ok": True}

    def step(self) -> dict:
        return self.call({"op": "step"})

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def kill(self) -> None:
        """SIGKILL the driver's whole process group; returns once nothing of it is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        deadline = time.monotonic() + 10
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def quit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


class Mirror:
    """A MirrorPool following an engine's events (with its replay socket)."""

    def __init__(self, events_port: int, replay_port: int, num_blocks: int = 256,
                 late: bool = False) -> None:
        self.late = late  # joins a running engine: nothing to compare before its first batch
        self.pool = MirrorPool(num_blocks)
        self.lock = threading.Lock()
        self.sub = follow(self.pool, f"tcp://127.0.0.1:{events_port}",
                          replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
                          apply=threaded_apply(self.lock))

    def hashes(self) -> set[int]:
        with self.lock:
            return self.pool.cached_hashes()

    def catch_up(self, answer: dict, timeout: float = 15) -> None:
        """Wait (bounded) until the mirror has applied the engine's last batch and holds what
        the engine holds; fail with the difference otherwise."""
        want, seq = set(answer["cached"]), answer["seq"]
        if self.late and self.sub.last_live is None:
            return  # a step may publish nothing; the first batch it sees triggers the replay
        deadline = time.monotonic() + timeout
        while True:
            got = self.hashes()
            if self.sub.last_seq == seq and got == want:
                with self.lock:
                    assert self.pool.check() == []
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"mirror at seq {self.sub.last_seq}, engine at {seq}: "
                    f"{len(want - got)} cached blocks missing, {len(got - want)} extra; "
                    f"subscriber {self.sub.status()}")
            time.sleep(0.005)

    def close(self) -> None:
        self.sub.stop()


def ports(n: int = 2) -> list[int]:
    return free_ports(n)


def request_batches(seed: int, batches: int, per_batch: tuple[int, int] = (3, 8)):
    """Batches of requests sharing a few system prompts, with outputs long enough that decoding
    fills blocks (those are cached too)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(4, VOCAB) for _ in range(BLOCK * rng.randint(1, 4))]
               for _ in range(5)]
    n = 0
    for _ in range(batches):
        batch = []
        for _ in range(rng.randint(*per_batch)):
            n += 1
            tokens = rng.choice(systems) + [rng.randrange(4, VOCAB)
                                             for _ in range(rng.randint(1, 120))]
            batch.append({"id": f"r{seed}-{n}", "tokens": tokens,
                          "max_tokens": rng.randint(1, 70)})
        yield batch
