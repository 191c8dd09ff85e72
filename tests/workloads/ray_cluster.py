"""A real Ray cluster on this machine, started the way users start one: `ray start --head` and
`ray start --address=...` for each further node, each node its own processes and temp dir.

`ray stop` is not used: it stops every Ray process of the machine, other people's too. Each
`ray start` runs in a new session, so the processes it leaves (GCS, raylet, agents) keep its
process group; the workers a raylet forks get groups of their own but are its children. `stop`
therefore freezes the groups, collects them and every descendant, and kills them all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
# What a head whose GCS port is taken says (its gcs_server log, then `ray start`'s output, which
# otherwise comes only after ray start has waited 40 s for the GCS).
PORT_TAKEN = "Failed to start the grpc server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, process group, start time) of a live process, None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def _processes() -> dict[int, tuple[int, int, int]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            out[int(entry.name)] = st
    return out


def mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text`."""
    found = []
    for pid in _processes():
        try:
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


class RayCluster:
    def __init__(self, root: Path, token: str | None = None) -> None:
        self.root = root
        self.token = token or uuid.uuid4().hex
        self.groups: list[int] = []  # one per `ray start`
        self.port: int | None = None
        self.seen: set[tuple[int, int]] = set()  # (pid, start time) of every process it had
        self.start_s: list[float] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of the cluster's processes and of a driver that has its token."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0")
        env.update(extra)
        return env

    def _ray_start(self, args: list[str], temp: Path, timeout_s: float) -> tuple[int, str]:
        """Run one `ray start`; returns (exit status, output). Stops early when the head's GCS
        cannot bind its port."""
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [str(RAY), "start", *args, "--node-ip-address=127.0.0.1", f"--temp-dir={temp}",
             "--disable-usage-stats", "--object-store-memory=100000000"],
            env=self.env(), start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, cwd=self.root)
        self.groups.append(proc.pid)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline or any(
                    PORT_TAKEN in p.read_text(errors="replace")
                    for p in temp.glob("session_*/logs/gcs_server.*") if p.is_file()):
                proc.kill()
                break
            time.sleep(0.2)
        out = proc.communicate()[0]
        self.start_s.append(time.monotonic() - t0)
        taken = PORT_TAKEN in out or any(
            PORT_TAKEN in p.read_text(errors="replace")
            for p in temp.glob("session_*/logs/gcs_server.*") if p.is_file())
        return (proc.returncode if not taken else -1), out

    def start_head(self, ports=None, attempts: int = 5, num_cpus: int = 0) -> None:
        """`ray start --head` on the first port of `ports` (default: free ports) that it can
        bind; a port taken meanwhile is given up (its processes stopped) for the next one."""
        ports = iter(ports or ())
        for attempt in range(attempts):
            port = next(ports, None) or free_port()
            temp = self.root / f"head{attempt}"
            rc, out = self._ray_start(["--head", f"--port={port}", f"--num-cpus={num_cpus}",
                                       "--include-dashboard=false"], temp, 120)
            if rc == 0:
                self.port = port
                return
            self._kill_groups(self.groups[-1:])
            if rc != -1:
                raise RuntimeError(f"ray start --head failed ({rc}):\n{out[-3000:]}")
        raise RuntimeError(f"no free port for the head after {attempts} attempts")

    def add_node(self, name: str, num_cpus: int) -> None:
        rc, out = self._ray_start([f"--address={self.address}", f"--num-cpus={num_cpus}"],
                                  self.root / name, 120)
        if rc != 0:
            raise RuntimeError(f"ray start --address failed ({rc}):\n{out[-3000:]}")

    def _tree(self, groups: list[int]) -> dict[int, tuple[int, int, int]]:
        """The groups' processes and all their descendants, now."""
        procs = _processes()
        members = {pid for pid, (_, pgrp, _) in procs.items() if pgrp in groups}
        grown = True
        while grown:
            more = {pid for pid, (ppid, _, _) in procs.items() if ppid in members} - members
            members |= more
            grown = bool(more)
        return {pid: procs[pid] for pid in members}

    def _kill_groups(self, groups: list[int], grace_s: float = 5.0) -> None:
        tree = self._tree(groups)
        self.seen |= {(pid, st[2]) for pid, st in tree.items()}
        for pid in tree:
            with _quiet():
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._tree(groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(50):  # freeze what is left (no more forks), collect, kill
            tree = self._tree(groups)
            if not tree:
                break
            self.seen |= {(pid, st[2]) for pid, st in tree.items()}
            for pid in tree:
                with _quiet():
                    os.kill(pid, signal.SIGSTOP)
            for pid in self._tree(groups):
                with _quiet():
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def stop(self) -> None:
        self._kill_groups(self.groups)

    def left(self) -> list[int]:
        """Processes of this cluster still alive: any it ever had, any in its groups, any whose
        command line names its temp dir."""
        procs = _processes()
        alive = [pid for pid, st in procs.items() if (pid, st[2]) in self.seen or st[1] in self.groups]
        return sorted((set(alive) | set(mentioning(str(self.root)))) - {os.getpid()})


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)
