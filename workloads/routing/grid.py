"""Sweeps: every (policy, N, capacity) point of a grid, on a local process pool or on Ray.

A point is independent of the others and deterministic (each policy starts from seed `seed`),
so where it runs never changes its figures: the Ray executor's rows equal the local pool's.
`run_grid` returns the rows in grid order (policy, then N, then capacity).

`--executor ray` starts a local Ray instance for the sweep and shuts it down afterwards;
`ray:ADDRESS` joins a running cluster (`ray start --head` prints the address) and leaves it up.
The trace travels once (`ray.put`), each point is one Ray task.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

from allocator import InvalidRequest

from ..mooncake import MooncakeTrace
from .decisions import DecisionLog
from .policies import make_policy
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


# -- local process pool --------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(trace: MooncakeTrace, settings: Settings) -> None:
    _WORKER["trace"], _WORKER["settings"] = trace, settings


def _run_in_worker(point: GridPoint) -> dict:
    return run_point(_WORKER["trace"], point, _WORKER["settings"])


def _run_local(trace, points, settings, workers, progress) -> list[dict]:
    workers = max(1, min(workers or os.cpu_count() or 1, len(points)))
    if workers == 1:
        rows = []
        for k, p in enumerate(points):
            rows.append(run_point(trace, p, settings))
            if progress is not None:
                progress(k + 1, len(points))
        return rows
    out: dict[int, dict] = {}
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(trace, settings)) as pool:
        futures = {pool.submit(_run_in_worker, p): k for k, p in enumerate(points)}
        for done, fut in enumerate(as_completed(futures), 1):
            out[futures[fut]] = fut.result()
            if progress is not None:
                progress(done, len(points))
    return [out[k] for k in range(len(points))]


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


def _probe_cluster(address: str, timeout_s: float = 90.0) -> None:
    """Join the cluster once from a child process: an address that accepts connections but is
    no Ray cluster (a proxy, another service) makes ray.init retry for tens of seconds and log
    each retry; the child keeps that noise and leaves one line to say."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, address], capture_output=True,
                              text=True, timeout=timeout_s,
                              env=dict(os.environ, RAY_BACKEND_LOG_LEVEL="error"))
    except subprocess.TimeoutExpired:
        raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: no answer within "
                             f"{timeout_s:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        why = lines[-1].split(": ", 1)[-1] if lines else f"exit status {proc.returncode}"
        raise InvalidRequest(f"cannot join the Ray cluster at {address!r}: {why}")


def _ray_point(trace: MooncakeTrace, point: GridPoint, settings: Settings) -> dict:
    return run_point(trace, point, settings)


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
        task = ray.remote(_ray_point)
        trace_ref = ray.put(trace)
        refs = [task.remote(trace_ref, p, settings) for p in points]
        index = {ref: k for k, ref in enumerate(refs)}
        out: dict[int, dict] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                out[index[ref]] = ray.get(ref)
            if progress is not None:
                progress(len(out), len(points))
        return [out[k] for k in range(len(points))]
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
    """Every point's row, in grid order. Raises InvalidRequest (bad executor, Ray missing or
    unreachable)."""
    kind, address = parse_executor(executor)
    if kind == "local":
        return _run_local(trace, points, settings, workers, progress)
    return _run_ray(trace, points, settings, address, progress)
