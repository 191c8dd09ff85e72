"""Helpers of the server tests: an in-process app (TestClient), a real uvicorn subprocess, a
real uvicorn serving an app the test built (LiveApp), and assertions on the error shape and on
state left unchanged.

Imported as `support.apputil` (tests/support): every test folder has a `conftest` module, so
importing helpers from "conftest" picks whichever folder pytest loaded last."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import httpx

warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
from fastapi.testclient import TestClient  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

SMALL = dict(default_blocks=256, default_block_bytes=4096, max_pool_bytes=64 << 20,
             max_blocks=1 << 20, max_pools=8, max_batch=1000, max_body=1 << 20,
             max_total_bytes=1 << 30,
             # schemathesis' in-process client names the host "testserver"
             allowed_hosts=("testserver",))
# What a bodiless POST sends: the JSON media type, so a browser would have had to preflight.
JSON = {"Content-Type": "application/json"}


def make_client(**overrides) -> TestClient:
    # A loopback Host, as a browser on this machine sends (app/http/security.py checks it).
    return TestClient(create_app(Settings(**{**SMALL, **overrides})), base_url="http://localhost")


def state_of(client, pool: str = "default") -> dict:
    """What a rejected request must leave unchanged: the block map and the books."""
    stats = client.get(f"/api/pools/{pool}/stats").json()
    keep = ("used_blocks", "free_blocks", "requested_bytes", "allocated_bytes", "allocation_count",
            "blocks_by_state")
    cache = stats.get("cache") or {}
    return {
        "stats": {k: stats[k] for k in keep},
        "cache": {k: cache.get(k) for k in ("used_bytes", "pinned_bytes", "entries", "policy")},
        "runs": client.get(f"/api/pools/{pool}/blockmap").json()["runs"],
        "pools": sorted(p["name"] for p in client.get("/api/pools").json()["pools"]),
    }


def assert_ok_check(client, pool: str = "default") -> None:
    r = client.get(f"/api/pools/{pool}/check").json()
    assert r["ok"], r["problems"]


def assert_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    return body["error"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after it was chosen."""


class Server:
    """A real `python -m app.cli serve` on a free loopback port."""

    def __init__(self, env: dict | None = None, args: tuple[str, ...] = (), *,
                 command: tuple[str, ...] = (sys.executable, "-m", "app.cli"),
                 cwd: Path = ROOT) -> None:
        # The free port is chosen before the server binds it: another process may take it in
        # between, so a start that fails on "address already in use" tries a fresh port.
        self.command, self.cwd = command, cwd
        for attempt in range(3):
            try:
                self._start(env, args)
                return
            except PortTaken:
                if attempt == 2:
                    raise

    def _start(self, env: dict | None, args: tuple[str, ...]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        full_env = {**os.environ, "KVSCOPE_DEFAULT_BLOCKS": "4096", **(env or {})}
        self.proc = subprocess.Popen(
            [*self.command, "serve", "--port", str(self.port), *args],
            cwd=self.cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60  # importing torch on a loaded machine takes a while
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode(errors="replace")
                if "address already in use" in out.lower():
                    raise PortTaken(out)
                raise RuntimeError(f"server exited: {out}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not start in 60 s")

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")


class LiveApp:
    """A real uvicorn, on a thread of this process, serving an app the test built (so that the
    test can add a route or patch a pool), with the protocol and options of `kvscope serve`.
    A context manager; `url` is set inside it."""

    def __init__(self, app) -> None:
        self.app = app

    def __enter__(self) -> LiveApp:
        import uvicorn

        from app.http.protocol import SERVER_OPTIONS

        for _ in range(3):  # the port is chosen before uvicorn binds it: another may take it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                    **SERVER_OPTIONS)
            self.server = uvicorn.Server(config)
            self.thread = threading.Thread(target=self.server.run, daemon=True)
            self.thread.start()
            deadline = time.monotonic() + 30
            while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.server.started:
                return self
            self.__exit__()
        raise RuntimeError("uvicorn did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


_PROBE = """
import sys, time, threading, httpx
worst, count, stop = 0.0, 0, threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with httpx.Client(base_url=sys.argv[1], timeout=60) as h:
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        assert h.get("/healthz").status_code == 200
        worst, count = max(worst, time.perf_counter() - t0), count + 1
        time.sleep(0.02)
print(worst, count, flush=True)
"""


class HealthProbe:
    """GET /healthz every 20 ms from a process of its own until the `with` block ends; `worst`
    is the slowest answer (seconds), `count` how many there were."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.count = url, 0.0, 0

    def __enter__(self) -> HealthProbe:
        self.proc = subprocess.Popen([sys.executable, "-c", _PROBE, self.url], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("", timeout=60)
        worst, count = out.split()
        self.worst, self.count = float(worst), int(count)
