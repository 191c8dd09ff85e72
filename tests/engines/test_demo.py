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

import pytest

from app.engines.server import free_ports, group_alive

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_ports(1)[0]
        while not all(_free(self.port + k) for k in range(101, 107)):
            self.port = free_ports(1)[0]
        self.out = tmp_path / "demo.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "demo", "--port", str(self.port),
                 "--log-dir", str(tmp_path / "logs"), *args],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

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


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def assert_all_gone(pgids) -> None:
    deadline = time.monotonic() + 10
    while any(group_alive(g) for g in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [g for g in pgids if group_alive(g)], "processes left running"


def test_sigterm_stops_every_engine_it_started(engine_env, tmp_path):
    demo = Demo(tmp_path, "--engines", "2")
    try:
        pids = demo.engine_pids(2)
        demo.proc.send_signal(signal.SIGTERM)
        demo.wait()
        assert_all_gone([demo.proc.pid, *pids.values()])
        assert "stopped 2 engine(s)" in demo.text()
    finally:
        demo.cleanup()


def test_an_engine_dying_while_booting_stops_the_demo_naming_it(engine_env, tmp_path):
    demo = Demo(tmp_path, "--engines", "2")
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
    demo = None
    with socket.socket() as blocker:
        port = free_ports(1)[0]
        blocker.bind(("127.0.0.1", port + 105))  # engine-1's KV-event port (P+102+3i)
        blocker.listen()
        demo = Demo.__new__(Demo)
        demo.port, demo.out = port, tmp_path / "demo.out"
        with open(demo.out, "wb") as out:
            demo.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "demo", "--engines", "2", "--port", str(port),
                 "--log-dir", str(tmp_path / "logs")], cwd=ROOT, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert demo.wait() == 1
            text = demo.text()
            assert f"engine engine-1: events port {port + 105} already in use" in text, text
            pids = [int(p) for p in re.findall(r"started \(pid (\d+)", text)]
            assert_all_gone([demo.proc.pid, *pids])
        finally:
            demo.cleanup()
