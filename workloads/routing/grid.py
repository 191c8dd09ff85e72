"""Sweeps: every (policy, N, capacity) point of a grid, on a local process pool or on Ray.

A point is independent of the others and deterministic (each policy starts from seed `seed`),
so where it runs never changes its figures: the Ray executor's rows equal the local pool's.
`run_grid` returns the rows in grid order (policy, then N, then capacity), each with the bounds
of its (mode, N, C) (bounds.py): one task per distinct bound, run in the same executor as the
points and shared by every policy.

`--executor ray` starts a local Ray instance for the sweep and shuts it down afterwards;
`ray:ADDRESS` joins a running cluster (`ray start --head` prints the address) and leaves it up.
The trace travels once (`ray.put`), each point (and each bound) is one Ray task; the cluster's
nodes must import the same kvscope. A cluster with token authentication that the driver has no
token for is said so in one line (`_probe_cluster`), not after ray.init's 20 s of retries.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

from allocator import InvalidRequest

from ..mooncake import MooncakeTrace
from .bounds import BoundKey, bound_key, compute_bounds, with_bounds
from .decisions import DecisionLog
from .registry import make_policy
from .sequence import check_grid, run_sequence
from .serving import MAX_SERVING_TOKENS, ServingCosts, run_serving

MODES = ("sequence", "serving")


@dataclass(frozen=True, slots=True)
class GridPoint:
    policy: str
    replicas: int
    capacity_tokens: int
    mode: str


@dataclass(slots=True)
class Settings:
    """What every point of a sweep shares."""

    mode: str = "sequence"
    seed: int = 0
    dynamo_temperature: float = 0.0
    costs: ServingCosts = field(default_factory=ServingCosts)
    decisions: bool = False  # each row then carries its decisions (`decision_rows`)

    def to_dict(self) -> dict:
        return {**asdict(self), "costs": self.costs.to_dict()}


def grid(policies: list[str], replicas: list[int], capacities: list[int], mode: str) -> list[GridPoint]:
    """The points in report order. Raises InvalidRequest for a bad mode, N or capacity."""
    if mode not in MODES:
        raise InvalidRequest(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    for n in replicas:
        for c in capacities:
            check_grid(n, c)
            if mode == "serving" and n * c > MAX_SERVING_TOKENS:
                raise InvalidRequest(f"serving mode simulates at most {MAX_SERVING_TOKENS:,} tokens "
                                     f"of KV over all replicas; N={n} x {c:,} tokens is {n * c:,}")
    return [GridPoint(p, n, c, mode) for p in policies for n in replicas for c in capacities]


def run_point(trace: MooncakeTrace, point: GridPoint, settings: Settings) -> dict:
    """One point's result row."""
    policy = make_policy(point.policy, point.replicas, settings.seed,
                         temperature=settings.dynamo_temperature)
    log = DecisionLog(point.policy, point.replicas, point.capacity_tokens) if settings.decisions else None
    if point.mode == "sequence":
        figures = run_sequence(trace, point.replicas, point.capacity_tokens, policy, decisions=log)
    else:
        figures = run_serving(trace, point.replicas, point.capacity_tokens, policy, settings.costs,
                              decisions=log)
    row = {"policy": point.policy, "replicas": point.replicas,
           "capacity_tokens": point.capacity_tokens, "mode": point.mode, **figures}
    if log is not None:
        row["decision_rows"] = {"rows": log.rows(), "dropped": log.dropped}
    return row


def bound_keys(points: list[GridPoint]) -> list[BoundKey]:
    """The distinct bounds the points need, in first-use order."""
    return list(dict.fromkeys(bound_key(p.mode, p.replicas, p.capacity_tokens) for p in points))


def run_task(trace: MooncakeTrace, task: GridPoint | BoundKey, settings: Settings) -> dict:
    """A point's row, or the bounds of a key: the two kinds of task a sweep runs."""
    if isinstance(task, BoundKey):
        return compute_bounds(trace, task)
    return run_point(trace, task, settings)


def _with_bounds(points, rows, keys, bounds) -> list[dict]:
    by_key = dict(zip(keys, bounds))
    return [with_bounds(row, by_key[bound_key(p.mode, p.replicas, p.capacity_tokens)])
            for p, row in zip(points, rows)]


# -- local process pool --------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(trace: MooncakeTrace, settings: Settings) -> None:
    _WORKER["trace"], _WORKER["settings"] = trace, settings


def _run_in_worker(task: GridPoint | BoundKey) -> dict:
    return run_task(_WORKER["trace"], task, _WORKER["settings"])


def _run_local(trace, points, settings, workers, progress) -> list[dict]:
    """The bounds first (each is a few points' worth of work), then the points; progress counts
    the points."""
    keys = bound_keys(points)
    tasks = [*keys, *points]
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    if workers == 1:
        out = []
        for task in tasks:
            out.append(run_task(trace, task, settings))
            if progress is not None and len(out) > len(keys):
                progress(len(out) - len(keys), len(points))
    else:
        results: dict[int, dict] = {}
        done = 0
        with ProcessPoolExecutor(workers, initializer=_init_worker,
                                 initargs=(trace, settings)) as pool:
            futures = {pool.submit(_run_in_worker, t): k for k, t in enumerate(tasks)}
            for fut in as_completed(futures):
                k = futures[fut]
                results[k] = fut.result()
                if k >= len(keys):
                    done += 1
                    if progress is not None:
                        progress(done, len(points))
        out = [results[k] for k in range(len(tasks))]
    return _with_bounds(points, out[len(keys):], keys, out[:len(keys)])


# -- Ray -------------------------------------------------------------------------------------------
def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast, in one line, when a Ray address does not answer (ray.init would retry for
    a minute). `auto` and addresses without a port are left to Ray."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise InvalidRequest(f"cannot reach the Ray cluster at {address!r}: "
                             f"{exc.strerror or exc}") from None


PROBE = ("import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, "
         "log_to_driver=False, configure_logging=False); ray.shutdown()")


# What a cluster with token authentication answers a client that sends no token (Ray >= 2.5x).
AUTH_FAILURE = ("InvalidAuthToken", "AuthenticationError", "Unauthenticated")
AUTH_HINT = ("it wants a token (Ray token authentication): set RAY_AUTH_MODE=token and give "
             "the cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as "
             "for `ray start --address`")


def _probe_cluster(address: str, timeout_s: float = 90.0) -> None:
    """Join the cluster once from a child process: an address that accepts connections but is
    no Ray cluster (a proxy, another service) makes ray.init retry for tens of seconds and log
    each retry; the child keeps that noise and leaves one line to say. A cluster that refuses
    the client for want of a token is recognised at its first refusal (ray.init would retry for
    20 s, then report only a failed connection)."""
    proc = subprocess.Popen([sys.executable, "-c", PROBE, address], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RAY_BACKEND_LOG_LEVEL="error"))
    lines: list[str] = []
    refused = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if any(mark in line for mark in AUTH_FAILURE):
                refused.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and not refused.is_set():
            if time.monotonic() > deadline:
                raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: no answer "
                                     f"within {timeout_s:.0f} s")
            refused.wait(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(5)
    if refused.is_set():
        raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: {AUTH_HINT}")
    if proc.returncode != 0:
        text = [ln for ln in "".join(lines).strip().splitlines() if ln.strip()]
        why = text[-1].split(": ", 1)[-1] if text else f"exit status {proc.returncode}"
        raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: {why}")


def _ray_task(trace: MooncakeTrace, task: GridPoint | BoundKey, settings: Settings) -> dict:
    return run_task(trace, task, settings)


def _run_ray(trace, points, settings, address, progress) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise InvalidRequest("the Ray executor needs ray: pip install 'kvscope[ray]'") from None
    if address:
        _check_reachable(address)
        _probe_cluster(address)
    started = not ray.is_initialized()
    if started:
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            if address:
                ray.init(address=address, **kw)
            else:
                ray.init(num_cpus=os.cpu_count() or 1, **kw)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
    try:
        keys = bound_keys(points)
        tasks = [*keys, *points]
        remote = ray.remote(_ray_task)
        trace_ref = ray.put(trace)
        refs = [remote.remote(trace_ref, t, settings) for t in tasks]
        index = {ref: k for k, ref in enumerate(refs)}
        out: dict[int, dict] = {}
        pending = list(refs)
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                out[index[ref]] = ray.get(ref)
                if index[ref] >= len(keys):
                    done += 1
                    if progress is not None:
                        progress(done, len(points))
        results = [out[k] for k in range(len(tasks))]
        return _with_bounds(points, results[len(keys):], keys, results[:len(keys)])
    finally:
        if started:
            ray.shutdown()


def parse_executor(text: str) -> tuple[str, str | None]:
    """'local' -> ('local', None); 'ray' -> ('ray', None); 'ray:ADDR' -> ('ray', ADDR)."""
    if text == "local":
        return "local", None
    if text == "ray":
        return "ray", None
    if text.startswith("ray:") and text[4:]:
        return "ray", text[4:]
    raise InvalidRequest(f"unknown executor {text!r}; choose local, ray or ray:ADDRESS")


def run_grid(trace: MooncakeTrace, points: list[GridPoint], settings: Settings,
             executor: str = "local", workers: int | None = None, progress=None) -> list[dict]:
    """Every point's row with its bounds (`bounds.with_bounds`), in grid order. Raises
    InvalidRequest (bad executor, Ray missing or unreachable)."""
    kind, address = parse_executor(executor)
    if kind == "local":
        return _run_local(trace, points, settings, workers, progress)
    return _run_ray(trace, points, settings, address, progress)
