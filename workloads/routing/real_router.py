"""The real routers' processes: SGLang's and vLLM's router binaries, started from their Python
packages (`RouterKind`, `ROUTERS`; a missing package raises `RouterUnavailable`, one line naming
`pip install 'kvscope[routers]'`).

`RealRouter(kind, worker_urls)` starts one as a subprocess in its own process group (`sglang`:
`sglang-router`'s `smg launch`; `vllm`: `vllm-router`), on a port of its own (a port taken
meanwhile is retried with fresh ports), waits until it lists every worker as healthy, and reads
`GET /workers`: the router's own order of the workers, which differs from the command line and
between starts. Its log goes to a temporary file (appended to by the router, read through a
descriptor of our own) that `wait_log` reads line by line. `stop()` (or leaving the `with`
block) ends the whole process group; a router left running is ended at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from dataclasses import dataclass

from allocator import InvalidRequest


class RouterUnavailable(InvalidRequest):
    """The router's package is not installed."""


class RouterError(RuntimeError):
    """A router that would not start, or that did not forward a request."""


@dataclass(frozen=True)
class RouterKind:
    name: str
    package: str  # the PyPI distribution
    module: str  # its import name
    tested: str  # the version the lab's model is held to
    argv: tuple[str, ...]  # after sys.executable
    model: str  # the lab policy that models its cache_aware
    kv_model: str = ""  # ... and its kv_aware, where it has one

    def model_of(self, policy: str) -> str:
        """The lab policy that models this router's `policy` (cache_aware or kv_aware)."""
        if policy == "kv_aware" and self.kv_model:
            return self.kv_model
        if policy == "cache_aware":
            return self.model
        raise InvalidRequest(f"the lab has no model of {self.name}'s {policy!r}")


ROUTERS = {
    "sglang": RouterKind("sglang", "sglang-router", "sglang_router", "0.3.2",
                         ("-m", "sglang_router", "launch"), "sglang_cache_aware"),
    "vllm": RouterKind("vllm", "vllm-router", "vllm_router", "0.1.17",
                       ("-m", "vllm_router.launch_router"), "vllm_cache_aware", "vllm_kv_aware"),
}


def router_kind(name: str) -> RouterKind:
    """The router called `name` (sglang or vllm), installed. Raises InvalidRequest for an
    unknown name, RouterUnavailable (one line naming the extra) for a missing package."""
    kind = ROUTERS.get(name)
    if kind is None:
        raise InvalidRequest(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    return require(kind)


def require(kind: RouterKind) -> RouterKind:
    """`kind`, once its package is found; else RouterUnavailable naming the extra."""
    if importlib.util.find_spec(kind.module) is None:
        raise RouterUnavailable(
            f"the real {kind.name} router needs the {kind.package} package ({kind.tested}): "
            f"pip install 'kvscope[routers]'")
    return kind


def router_version(name: str) -> str:
    return importlib.metadata.version(router_kind(name).package)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return json.loads(r.read())


def _log_file():
    """A log file for a child process: (our reader, the child's descriptor). Two opens of one
    unlinked file, so each has its own offset: the child appends at the end whatever we seek
    to. (One descriptor shared with the child shares its offset too: our seek to read moves
    where the child writes next, and its lines land over ones not read yet.)"""
    fd, path = tempfile.mkstemp(prefix="kvscope-router-", suffix=".log")
    try:
        writer = os.open(path, os.O_WRONLY | os.O_APPEND)
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(path)
    return os.fdopen(fd, "rb"), writer


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the routers colour their logs whatever NO_COLOR says
PORT_TAKEN = ("address already in use", "address in use", "addrinuse", "os error 98")
_RUNNING: weakref.WeakSet = weakref.WeakSet()  # routers started and not stopped


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, end any router a caller left running."""
    for router in list(_RUNNING):
        router.stop()


class RealRouter:
    """A real router (`kind`: sglang or vllm) over `worker_urls`, started by `start()` and ended
    by `stop()`; also a context manager. `policy` and `args` (extra command-line flags) go on its
    command line; `url` is where it listens once started, `order` its workers as it lists them."""

    def __init__(self, kind: str, worker_urls: list[str], *, policy: str = "cache_aware",
                 args: tuple[str, ...] = (), host: str = "127.0.0.1",
                 startup_timeout_s: float = 60.0, attempts: int = 5,
                 rust_log: str | None = None) -> None:
        self.kind = router_kind(kind)
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.args = tuple(args)
        self.rust_log = rust_log  # its RUST_LOG (default: the environment's, else info)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.attempts = attempts
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.order: list[str] = []
        self.started_at = 0.0  # time.monotonic() when the running router was launched
        self.ready_at = 0.0  # ... and when it first listed every worker healthy
        self._log = None
        self._read_at = 0  # bytes of the log `wait_log` has read
        self._unread = ""  # ... and the line it has begun

    def command(self, port: int, metrics_port: int) -> list[str]:
        return [sys.executable, *self.kind.argv, "--host", self.host, "--port", str(port),
                "--worker-urls", *self.worker_urls, "--policy", self.policy,
                "--prometheus-host", self.host, "--prometheus-port", str(metrics_port),
                "--worker-startup-check-interval", "1", *self.args]

    def log_tail(self, chars: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = ANSI.sub("", self._log.read().decode("utf-8", "replace"))
        return text[-chars:]

    def wait_log(self, lines: set[str], timeout: float) -> dict[str, str]:
        """Until every string of `lines` has appeared in a line of the log written since the
        last call (each call reads on from where the last stopped; a line is matched with a
        space after its end, so `seq=1 ` does not match `seq=10`); returns the line each
        matched. RouterError after `timeout` seconds or when the router exits."""
        left, found = set(lines), {}
        deadline = time.monotonic() + timeout
        while left:
            self._log.flush()
            self._log.seek(self._read_at)
            chunk = self._log.read()
            self._read_at += len(chunk)
            text = self._unread + chunk.decode("utf-8", "replace")
            *done, self._unread = text.split("\n")
            for line in done:
                line = ANSI.sub("", line) + " "
                for s in [s for s in left if s in line]:
                    found[s] = line
                    left.discard(s)
            if not left:
                break
            if self.proc is None or self.proc.poll() is not None:
                raise RouterError(f"{self.kind.name} router exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RouterError(f"{self.kind.name} router: no log line with {sorted(left)[0]!r} "
                                  f"within {timeout:g} s: {self.log_tail()}")
            time.sleep(0.002)
        return found

    def start(self) -> RealRouter:
        """Start the router; a port taken by the time it binds is retried with fresh ports
        (`attempts` in all). Raises RouterError with the router's log tail when it fails."""
        try:
            for _ in range(self.attempts):
                port, metrics = self.ports()
                if self._launch(port, metrics):
                    return self
                self.stop()
            raise RouterError(f"{self.kind.name} router: the ports were taken at each of "
                              f"{self.attempts} attempts; last log: {self.log_tail()}")
        except BaseException:
            self.close()
            raise

    def ports(self) -> tuple[int, int]:
        """Two ports free now (the router's and its metrics'), which it binds itself."""
        return _free_port(self.host), _free_port(self.host)

    def _launch(self, port: int, metrics_port: int) -> bool:
        """True once the router listens and lists our workers healthy; False when a port was
        taken (by the time the router bound it, or another server answers there)."""
        if self._log is not None:
            self._log.close()
        self._log, writer = _log_file()
        self._read_at, self._unread = 0, ""
        env = {**os.environ, "RUST_LOG": self.rust_log or os.environ.get("RUST_LOG", "info"),
               "NO_COLOR": "1"}
        try:
            self.proc = subprocess.Popen(self.command(port, metrics_port), stdin=subprocess.DEVNULL,
                                         stdout=writer, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        finally:
            os.close(writer)
        self.started_at = time.monotonic()
        _RUNNING.add(self)
        self.url = f"http://{self.host}:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        want = set(self.worker_urls)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_tail(20000).lower()
                if any(s in log for s in PORT_TAKEN):
                    return False
                raise RouterError(f"{self.kind.name} router exited with status "
                                  f"{self.proc.returncode} at start: {self.log_tail()}")
            try:
                listed = _get_json(self.url + "/workers").get("workers", [])
            except (OSError, ValueError):
                time.sleep(0.1)
                continue
            urls = [w.get("url") for w in listed]
            if not set(urls) <= want:  # someone else's server on this port
                return False
            if set(urls) == want and all(w.get("is_healthy", True) for w in listed):
                self.order = urls
                self.ready_at = time.monotonic()
                return True
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise RouterError(f"{self.kind.name} router did not list its {len(want)} workers healthy "
                          f"within {self.startup_timeout_s:g} s: {tail}")

    def workers(self) -> list[dict]:
        """`GET /workers` now: each worker's url, health and load, in the router's order."""
        return _get_json(self.url + "/workers")["workers"]

    def stop(self) -> None:
        """End the router's process group: SIGTERM, then SIGKILL after 5 s. Idempotent."""
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc is not None:  # children left in the group after the leader exited
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RealRouter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
