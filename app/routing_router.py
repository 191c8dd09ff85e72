"""Router runs for the REST API and the demo: a trace through a real router (sglang-router or
vllm-router, from their packages) in front of simulated engines of this process
(app/engines/router_run.py), with the engines' KV events followed by a fleet, so the run shows in
the Fleet view as it goes and in the Routing view beside the lab's runs.

`POST /api/routing {"mode": "router", "router": ...}` starts one (`RoutingRuns.start_router`):
the engines and the router start in a worker thread (about a second), then the fleet
`route-<id>` follows the engines, then the run's thread replays the first `limit` requests of the
bundled trace at `speed` times its timestamps as real HTTP requests to the router. Its decisions
are logged as the engines see them (rule `router`: which engine each request reached, every
engine's cached leading blocks and requests in flight then); when the replay is done, its
result row is `kvscope route --router`'s, with the bounds of serving mode. Releasing it (stop or
delete) stops the replay, the router and the engines, and removes the fleet.

`kvscope demo --sim N --router R` hands its own session and load to `RoutingRuns.adopt`: the
run is listed while the demo serves and ends with it (its engines belong to the demo).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from allocator.errors import Conflict, InvalidRequest, NotFound
from allocator.vocab import ROUTING_ROUTERS
from workloads.mooncake import bundled_trace
from workloads.routing.bounds import bound_key, compute_bounds, with_bounds
from workloads.routing.decisions import DecisionLog
from workloads.routing.real_router import router_kind

from .engines.router_run import RouterSession, figures, replay, router_engines
from .engines.sim import fleet_file

log = logging.getLogger("kvscope.routing")
DECISIONS = 12  # the latest decisions a run's view explains


class _Stopped(Exception):
    pass


class RouterRun:
    """One trace through a real router. `state`: running, finished, stopped or failed.
    `session`: the RouterSession (engines and router); `fleet_name`: the fleet following the
    engines; `load`: an outside load generator (the demo's), else the run replays the trace."""

    mode = "router"

    def __init__(self, run_id: str, spec: dict, *, session=None, fleet_name: str | None = None,
                 load=None) -> None:
        self.id = run_id
        self.spec = spec
        self.state = "running"
        self.error: str | None = None
        self.done = 0
        self.total = spec["limit"]
        self.results: list[dict] = []
        self.bounds: dict | None = None
        self.session = session
        self.owns = session is None  # a session it starts is its own to close
        self.load = load
        self.fleet_name = fleet_name if fleet_name is not None else f"route-{run_id}"
        self.fleet_handle = None
        self._fleets = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"routing:{run_id}", daemon=True)

    @property
    def router(self) -> str:
        return self.spec["router"]

    @property
    def policy(self) -> str:
        return f"router:{self.router}"

    @property
    def holds(self) -> bool:
        if not self.owns:  # the demo's: listed while it runs
            return self.state == "running"
        return self.session is not None or self.fleet_handle is not None

    def holds_pool(self, handle) -> bool:
        return False

    @property
    def log(self):
        return self.session.log if self.session is not None else None

    # -- set up (REST) ---------------------------------------------------------------------------
    async def setup(self, services) -> None:
        """Start the engines and the router (in a worker thread) and the fleet following them.
        Raises Conflict (the fleet's name is taken, the server is full), InvalidRequest (an
        unknown router or a missing package) or RouterError (it would not start); then nothing
        this run made is left."""
        fleets = services.fleets
        self._fleets = fleets
        if self.fleet_name in fleets:
            raise Conflict(f"routing run {self.id!r} follows its engines with the fleet "
                           f"{self.fleet_name!r}, which exists: delete it or start the run again")
        spec = self.spec
        configs = router_engines(spec["replicas"], spec["capacity_tokens"],
                                 prefix=f"{self.fleet_name}-e")
        decisions = DecisionLog(self.policy, spec["replicas"], spec["capacity_tokens"])
        session = RouterSession(self.router, configs, speed=spec["speed"], decisions=decisions,
                                events=True)
        try:
            self.session = await asyncio.to_thread(session.start)
            if self._stop.is_set():
                raise Conflict(f"routing run {self.id!r} was stopped while it was being set up")
            rows = (await asyncio.to_thread(fleet_file, session.engines, self.fleet_name))["engines"]
            self.fleet_handle = await fleets.create(self.fleet_name, rows)
        except BaseException:
            await self._remove()
            raise

    def _run(self) -> None:
        spec, session = self.spec, self.session
        try:
            full = bundled_trace()
            trace = full.head(min(spec["limit"], len(full)))
            self.total = len(trace)
            self.bounds = compute_bounds(trace, bound_key("serving", spec["replicas"],
                                                          spec["capacity_tokens"]))
            host, port = session.url.removeprefix("http://").rsplit(":", 1)

            def progress(i: int, _total: int) -> None:
                self.done = i
            max_len = session.engines.configs[0].max_len()
            rows = replay(trace, host, int(port), spec["speed"], max_len, progress,
                          stop=self._stop)
            if self._stop.is_set():
                raise _Stopped
            engines = session.engines
            served = engines.call(lambda: [dict(e.served) for e in engines.engines], timeout=60)
            row = figures(trace, self.router, spec["replicas"], spec["capacity_tokens"],
                          spec["speed"], rows, served, engines.stats(), session.arrivals,
                          engines.configs[0].costs)
            row["router_fell_back_to_load"] = "load-only" in session.log_tail().lower()
            self.results.append(with_bounds(row, self.bounds))
            self.done = len(trace)
            self.state = "finished"
        except _Stopped:
            self.state = "stopped"
        except Exception as exc:  # a failed run reports why; the server carries on
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        self._stop.set()

    async def release(self, services) -> None:
        """Stop the replay, then the router and the engines, and remove the fleet."""
        self.stop()
        if self.thread.is_alive():
            await asyncio.to_thread(self.thread.join, 30)
        elif self.state == "running":
            self.state = "stopped"
        await self._remove()

    async def _remove(self) -> None:
        if not self.owns:
            return
        fleet, self.fleet_handle = self.fleet_handle, None
        if fleet is not None and self._fleets is not None:
            with contextlib.suppress(NotFound):
                await self._fleets.delete(fleet.name, handle=fleet)
        session, self.session = self.session, None
        if session is not None:
            self._closed_log = session.log
            try:
                await asyncio.to_thread(session.close)
            except Exception:
                log.exception("stopping routing run %s's router and engines failed", self.id)

    # -- reading -------------------------------------------------------------------------------
    def decision_logs(self) -> dict:
        one = self.log if self.log is not None else getattr(self, "_closed_log", None)
        return {one.policy: one} if one is not None else {}

    def _live(self) -> dict:
        """Figures so far, from the engines' own counters (read from this thread: integers the
        engines' loop updates; a view may be one request behind)."""
        session = self.session
        if session is None or not session.engines.engines:
            return {"hit_ratio": None, "replica_figures": []}
        rows, hits, queries = [], 0, 0
        for e in list(session.engines.engines):
            p = e.pool.prefix_stats()
            hits += p["hits"]
            queries += p["queries"]
            rows.append({"name": e.cfg.name, "requests": e.counts["requests"],
                         "completed": e.counts["completed"], "hit_ratio": p["hit_ratio"],
                         "cached_blocks": p["cached_hashes"]})
        return {"hit_ratio": hits / queries if queries else 0.0, "replica_figures": rows}

    def view(self) -> dict:
        logs = self.decision_logs()
        one = next(iter(logs.values()), None)
        done = self.done if self.load is None else self.load.sent
        fleet = self.fleet_handle.name if self.fleet_handle is not None else (
            self.fleet_name if not self.owns and self.state == "running" else None)
        return {"id": self.id, "state": self.state, "mode": "router", "router": self.router,
                "replicas": self.spec["replicas"], "capacity_tokens": self.spec["capacity_tokens"],
                "limit": self.spec["limit"], "speed": self.spec["speed"],
                "policies": [self.policy], "policy": self.policy,
                "current": self.policy if self.state == "running" else None,
                "done": done, "total": self.total if self.load is None else None,
                "bounds": self.bounds, "results": list(self.results), "error": self.error,
                "router_url": self.session.url if self.session is not None else None,
                "fleet": fleet, **self._live(),
                "decisions": one.latest(DECISIONS) if one is not None else []}


def check_router(name: str) -> None:
    """Raises InvalidRequest for an unknown router, or one whose package is missing (naming the
    extra that installs it)."""
    if name not in ROUTING_ROUTERS:
        raise InvalidRequest(f"unknown router {name!r}: choose from {', '.join(ROUTING_ROUTERS)}")
    router_kind("vllm" if name == "vllm-kv" else name)
