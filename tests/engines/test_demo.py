"""`kvscope demo` starts real engine processes: SIGTERM, an engine dying while booting and a
taken port must each leave nothing running. (The engines need not finish booting for these.)"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.engines.demo import engine_specs
from app.engines.server import free_ports, group_alive

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """`kvscope demo --engines n` on a free --port P, started once its engines are started and
    its dashboard answers. The ports (P and the engines' P+101..) are chosen before the demo
    binds them: a start that fails on a port another process took meanwhile ("already in use",
    named by the demo or by uvicorn) tries a fresh P."""

    def __init__(self, tmp_path: Path, n: int) -> None:
        self.out = tmp_path / "demo.out"
        for attempt in range(3):
            self.port = free_ports(1, span=103 + 3 * (n - 1))[0]
            self.proc = launch(self.port, self.out, "--engines", str(n),
                               "--log-dir", str(tmp_path / "logs"))
            try:
                started = self._started(n)
            except BaseException:
                self.cleanup()
                raise
            if started or attempt == 2 or "already in use" not in self.text().lower():
                return
            self.cleanup()

    def _started(self, n: int, timeout: float = 90) -> bool:
        """Whether the demo started its n engines and serves its dashboard (False: it exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if len(re.findall(r"engine-\d+ started \(pid", self.text())) == n:
                try:
                    if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).is_success:
                        return True
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"the demo did not start in {timeout} s:\n{self.text()}")

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def engine_pids(self, n: int, timeout: float = 90) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = dict(re.findall(r"(engine-\d+) started \(pid (\d+)", self.text()))
            if len(pids) == n:
                return {k: int(v) for k, v in pids.items()}
            assert self.proc.poll() is None, self.text()
            time.sleep(0.1)
        raise AssertionError(f"engines not started:\n{self.text()}")

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        for pgid in [self.proc.pid, *re.findall(r"started \(pid (\d+)", self.text())]:
            try:
                os.killpg(int(pgid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def launch(port: int, out: Path, *args: str) -> subprocess.Popen:
    with open(out, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--port", str(port), *args],
                                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def assert_all_gone(pgids) -> None:
    deadline = time.monotonic() + 10
    while any(group_alive(g) for g in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [g for g in pgids if group_alive(g)], "processes left running"


def test_sigterm_stops_every_engine_it_started(engine_env, tmp_path):
    demo = Demo(tmp_path, 2)
    try:
        pids = demo.engine_pids(2)
        demo.proc.send_signal(signal.SIGTERM)
        demo.wait()
        assert_all_gone([demo.proc.pid, *pids.values()])
        assert "stopped 2 engine(s)" in demo.text()
    finally:
        demo.cleanup()


def test_an_engine_dying_while_booting_stops_the_demo_naming_it(engine_env, tmp_path):
    demo = Demo(tmp_path, 2)
    try:
        pids = demo.engine_pids(2)
        log = tmp_path / "logs" / "engine-1.log"
        deadline = time.monotonic() + 120
        while not log.read_text(errors="replace").strip() and time.monotonic() < deadline:
            time.sleep(0.2)  # booting: wait for its first log lines, then kill it
        os.killpg(pids["engine-1"], signal.SIGKILL)
        assert demo.wait() == 1
        text = demo.text()
        assert "engine engine-1: exited with code -9 while booting" in text, text
        assert "--- last lines of its log ---" in text
        assert_all_gone([demo.proc.pid, *pids.values()])
    finally:
        demo.cleanup()


def test_a_taken_port_names_the_engine_and_starts_nothing(engine_env, tmp_path):
    """The test holds (bound and listening) the exact port the demo gives engine-1's KV events
    for its --port P; the demo probes every engine port first, names that one and starts no
    engine. A P whose dashboard port another process took meanwhile (the demo's exit 2) is
    tried again with a fresh one."""
    demo = Demo.__new__(Demo)
    demo.out = tmp_path / "demo.out"
    for attempt in range(5):
        with socket.socket() as blocker:
            port = free_ports(1, span=106)[0]
            held = engine_specs(2, port, tmp_path)[1].events_port
            try:
                blocker.bind(("127.0.0.1", held))
            except OSError:
                continue  # taken already: no use as the port this test holds
            blocker.listen()
            demo.port = port
            demo.proc = launch(port, demo.out, "--engines", "2", "--log-dir", str(tmp_path / "logs"))
            try:
                code = demo.wait()
                text = demo.text()
                if code == 2 and "dashboard's port" in text and attempt < 4:
                    continue
                assert code == 1, text
                assert f"engine engine-1: events port {held} already in use" in text, text
                assert "started (pid" not in text, text  # no engine was started
                assert_all_gone([demo.proc.pid])
                return
            finally:
                demo.cleanup()
    raise AssertionError("no port to hold for engine-1's KV events")
