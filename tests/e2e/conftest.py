"""Browser tests: a real `kvscope serve` subprocess driven by Debian's Chromium (Playwright sync API).

Never runs `playwright install`: the browser is /usr/bin/chromium. Without it the tests skip,
except under CI (env CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT_S = 60.0


def _no_browser(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k != "KVSCOPE_TOKEN"}
    full_env.setdefault("KVSCOPE_DEVICE", "cpu")
    full_env.update(env or {})
    log = log_path.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(base: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy after {timeout_s}s:\n{log_path.read_text()[-3000:]}")


def serve(log_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """A healthy `kvscope serve` on a free port: (its process, its base URL). The free port is
    chosen before the server binds it: another process may take it in between, so a start that
    fails on "address already in use" tries a fresh port."""
    for attempt in range(3):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_server(port, log_path, env)
        try:
            wait_healthy(base, proc, log_path)
            return proc, base
        except RuntimeError as exc:
            stop_server(proc)
            if attempt == 2 or "address already in use" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def server(artifacts: Path) -> Iterator[str]:
    proc, base = serve(artifacts / "e2e-server.log")
    try:
        yield base
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def api(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=10.0) as client:
        yield client


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        _no_browser(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("playwright is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# Playwright's wait_for_function runs its predicate through eval, which the page's CSP (no
# 'unsafe-eval') refuses; the behaviour tests lift the CSP for their own probes, and
# test_csp.py loads and drives the page under the server's real CSP.
BYPASS_CSP = True


class ConsoleLog:
    """Console errors and uncaught page errors seen by one page."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def attach(self, page) -> None:
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))


@pytest.fixture
def page(browser, server: str):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=server, bypass_csp=BYPASS_CSP)
    pg = context.new_page()
    console = ConsoleLog()
    console.attach(pg)
    pg.console_log = console  # type: ignore[attr-defined]
    yield pg
    context.close()


def make_pool(api: httpx.Client, name: str, **spec) -> dict:
    """Create (or re-create) a pool for one test."""
    api.delete(f"/api/pools/{name}")
    r = api.post("/api/pools", json={"name": name, **spec})
    assert r.status_code in (200, 201), r.text
    return r.json()


def open_pool(page, name: str) -> None:
    page.goto(f"/?pool={name}")
    page.wait_for_function(
        f"window.kvscope && window.kvscope.pool === {name!r} && window.kvscope.connection === 'open'"
        " && window.kvscope.lastFrame() >= 0",
        timeout=30_000,
    )
