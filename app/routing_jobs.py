"""Routing lab runs for the REST API: one policy after another over the bundled Mooncake trace,
each in a worker thread (the event loop only reads progress), stoppable.

A run routes the first `limit` requests of the bundled trace through `replicas` replicas of
`capacity_tokens` each, in sequence or serving mode (workloads/routing/), for every policy in
turn; its view carries progress (requests routed over all policies), one result row per finished
policy (the rows `kvscope route` writes) and the latest decisions explained. One run at a time; the last KEEP runs stay
readable.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import OrderedDict, deque

from allocator.errors import Conflict, NotFound

KEEP = 8
DECISIONS = 12  # the latest decisions a run's view explains


class Explained:
    """Wraps a policy and keeps its latest decisions with why: the replica chosen, the rule
    that decided, each replica's cached leading blocks and requests in flight then."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self._decisions: deque[dict] = deque(maxlen=DECISIONS)
        self._lock = threading.Lock()  # the event loop reads while the run's thread appends

    def route(self, req, cluster) -> int:
        r = self.policy.route(req, cluster)
        why = {"request": req.index, "replica": r, "rule": self.policy.rule,
               "matches": list(cluster.matches(req)), "loads": list(cluster.requests)}
        with self._lock:
            self._decisions.append(why)
        return r

    def decisions(self) -> list[dict]:
        with self._lock:
            return list(self._decisions)

    def prefilled(self, index: int, replica: int) -> None:
        self.policy.prefilled(index, replica)

    def finished(self, index: int, replica: int) -> None:
        self.policy.finished(index, replica)


class _Stopped(Exception):
    pass


@functools.lru_cache(maxsize=1)
def _bundled_trace():
    from workloads.mooncake import load_mooncake

    return load_mooncake()


class RoutingRun:
    """One run. `state`: running, finished, stopped or failed (then `error` says why)."""

    def __init__(self, run_id: str, spec: dict) -> None:
        self.id = run_id
        self.spec = spec
        self.state = "running"
        self.error: str | None = None
        self.done = 0
        self.total = spec["limit"] * len(spec["policies"])
        self.current: str | None = None
        self.results: list[dict] = []
        self.explained: Explained | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"routing:{run_id}", daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from workloads.routing import make_policy
        from workloads.routing.sequence import run_sequence
        from workloads.routing.serving import run_serving

        spec = self.spec
        try:
            full = _bundled_trace()
            trace = full.head(min(spec["limit"], len(full)))
            self.total = len(trace) * len(spec["policies"])
            for k, name in enumerate(spec["policies"]):
                self.current = name
                base = k * len(trace)

                def progress(i: int, _total: int, base: int = base) -> None:
                    if self._stop.is_set():
                        raise _Stopped
                    self.done = base + i

                policy = self.explained = Explained(make_policy(name, spec["replicas"], spec["seed"]))
                run = run_sequence if spec["mode"] == "sequence" else run_serving
                figures = run(trace, spec["replicas"], spec["capacity_tokens"], policy,
                              progress=progress)
                self.results.append({"policy": name, "replicas": spec["replicas"],
                                     "capacity_tokens": spec["capacity_tokens"],
                                     "mode": spec["mode"], **figures})
                self.done = base + len(trace)
            self.state = "finished"
        except _Stopped:
            self.state = "stopped"
        except Exception as exc:  # a failed run reports why; the server carries on
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            self.current = None

    def view(self) -> dict:
        return {"id": self.id, "state": self.state, "mode": self.spec["mode"],
                "replicas": self.spec["replicas"], "capacity_tokens": self.spec["capacity_tokens"],
                "limit": self.spec["limit"], "policies": list(self.spec["policies"]),
                "current": self.current, "done": self.done, "total": self.total,
                "results": list(self.results), "error": self.error,
                "decisions": self.explained.decisions() if self.explained else []}


class RoutingRuns:
    """The server's runs, newest last. Raises Conflict (one is running), NotFound."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, RoutingRun] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, spec: dict) -> RoutingRun:
        with self._lock:
            running = [r for r in self._runs.values() if r.state == "running"]
            if running:
                raise Conflict(f"routing run {running[0].id!r} is running; stop it first")
            run = RoutingRun(f"r{next(self._ids)}", spec)
            self._runs[run.id] = run
            while len(self._runs) > KEEP:
                self._runs.popitem(last=False)
        run.thread.start()
        return run

    def get(self, run_id: str) -> RoutingRun:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound("routing run", run_id)
        return run

    def stop_all(self) -> None:
        for run in list(self._runs.values()):
            run.stop()
        for run in list(self._runs.values()):
            run.thread.join(timeout=10)
