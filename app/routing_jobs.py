"""Routing lab runs for the REST API: one policy after another over the bundled Mooncake trace,
each in a worker thread (the event loop only reads progress), stoppable.

A run routes the first `limit` requests of the bundled trace through `replicas` replicas of
`capacity_tokens` each, in sequence or serving mode (workloads/routing/), for every policy in
turn; its view carries progress (requests routed over all policies), the bounds of its (mode, N,
C) (`bounds`: pooled Bélády and infinite cache, workloads/routing/bounds.py, computed once before
the first policy), one result row per finished policy (the rows `kvscope route` writes, bounds
included) and the latest decisions explained. One run at a time; the last KEEP runs stay
readable.

A live run (`LiveRun`) instead feeds the trace, at `speed` times its timestamps, through one
policy to `replicas` real prefix-caching pools registered on the server (`route-<id>-r<i>`),
each publishing its KV events on a loopback ZeroMQ port, and a fleet (`route-<id>`) follows
those publishers. Its thread keeps the time; each request is routed and served on the event
loop (one short step, like a mirror's change), so the policy can be switched between two
requests. Given `compare` (two policies), it runs two such sides (`LiveSide`: pools
`route-<id>-a-r<i>` and fleet `route-<id>-a`, the same with b), and each step routes and serves
the request on both, so the two policies see the same requests at the same pace. Releasing it
(stop or delete) removes its pools, publishers and fleets.

A live run owns the very pools and fleets it created, not their names: a name it needs that is
taken refuses the run (409) before anything is made; its release removes a pool or fleet only
while the server still holds that same object (one the user deleted, or deleted and made again
under the same name, is left alone), and its view lists only what it still holds. While it runs,
its pools cannot be deleted (`check_pool_deletable`: 409 naming the run).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict

from allocator.errors import Conflict, NotFound
from workloads.mooncake import bundled_trace
from workloads.routing import make_policy
from workloads.routing.bounds import bound_key, compute_bounds, with_bounds
from workloads.routing.decisions import DecisionLog
from workloads.routing.live import PoolCluster, pool_hashes
from workloads.routing.policies import BLOCK_TOKENS
from workloads.routing.real_router import RouterError
from workloads.routing.sequence import requests as trace_requests
from workloads.routing.sequence import run_sequence
from workloads.routing.serving import run_serving

from .mirrors import start_pool
from .routing_router import RouterRun, check_router

log = logging.getLogger("kvscope.routing")
KEEP = 8
DECISIONS = 12  # the latest decisions a run's view explains


class _Stopped(Exception):
    pass


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
        self.bounds: dict | None = None
        self.logs: list = []  # a DecisionLog per policy, in order, as each starts
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"routing:{run_id}", daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        spec = self.spec
        try:
            full = bundled_trace()
            trace = full.head(min(spec["limit"], len(full)))
            self.total = len(trace) * len(spec["policies"])
            self.bounds = compute_bounds(trace, bound_key(spec["mode"], spec["replicas"],
                                                          spec["capacity_tokens"]))
            for k, name in enumerate(spec["policies"]):
                self.current = name
                base = k * len(trace)

                def progress(i: int, _total: int, base: int = base) -> None:
                    if self._stop.is_set():
                        raise _Stopped
                    self.done = base + i

                policy = make_policy(name, spec["replicas"], spec["seed"])
                log = DecisionLog(name, spec["replicas"], spec["capacity_tokens"])
                self.logs.append(log)
                run = run_sequence if spec["mode"] == "sequence" else run_serving
                figures = run(trace, spec["replicas"], spec["capacity_tokens"], policy,
                              progress=progress, decisions=log)
                self.results.append(with_bounds(
                    {"policy": name, "replicas": spec["replicas"],
                     "capacity_tokens": spec["capacity_tokens"], "mode": spec["mode"], **figures},
                    self.bounds))
                self.done = base + len(trace)
            self.state = "finished"
        except _Stopped:
            self.state = "stopped"
        except Exception as exc:  # a failed run reports why; the server carries on
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            self.current = None

    @property
    def holds(self) -> bool:
        """Whether the run holds server resources (pools, a fleet) until released."""
        return False

    def decision_logs(self) -> dict:
        """The run's decision logs by the name `GET .../decisions?policy=` takes."""
        return {log.policy: log for log in list(self.logs)}

    async def release(self, services) -> None:
        self.stop()

    def view(self) -> dict:
        return {"id": self.id, "state": self.state, "mode": self.spec["mode"],
                "replicas": self.spec["replicas"], "capacity_tokens": self.spec["capacity_tokens"],
                "limit": self.spec["limit"], "policies": list(self.spec["policies"]),
                "current": self.current, "done": self.done, "total": self.total,
                "bounds": self.bounds, "results": list(self.results), "error": self.error,
                "decisions": self.logs[-1].latest(DECISIONS) if self.logs else []}


class LiveSide:
    """One side of a live run: `replicas` prefix-caching pools (`<name>-r<i>`) behind one policy,
    and the fleet `<name>` mirroring them. `label`: None for a single-policy run, "a" or "b"."""

    def __init__(self, name: str, label: str | None, policy: str, spec: dict) -> None:
        self.name = name
        self.label = label
        self.policy = policy

        self.router = make_policy(policy, spec["replicas"], spec["seed"])
        self.log = DecisionLog(policy, spec["replicas"], spec["capacity_tokens"])
        self.cluster = None
        self.handles: list = []  # the PoolHandles this side created, replica i at i
        self.fleet_handle = None  # the FleetHandle it created
        self._registry = self._fleets = None  # the server's, once set up

    def names(self, replicas: int) -> tuple[list[str], str]:
        """The pool names and the fleet name this side needs."""
        return [f"{self.name}-r{i}" for i in range(replicas)], self.name

    @property
    def pools(self) -> list[str]:
        """The names of this side's pools the server still holds (those very pools)."""
        reg = self._registry
        return [h.name for h in self.handles if reg is not None and reg.holds(h)]

    @property
    def fleet(self) -> str | None:
        """The name of this side's fleet while the server still holds that very fleet."""
        h, fleets = self.fleet_handle, self._fleets
        if h is None or fleets is None or h.name not in fleets or fleets.get(h.name) is not h:
            return None
        return h.name

    def view(self) -> dict:
        cluster = self.cluster
        hit = sum(cluster.hit_tokens) if cluster else 0
        prompt = sum(cluster.input_tokens) if cluster else 0
        return {"label": self.label, "policy": self.policy,
                "requests": sum(cluster.requests) if cluster else 0,
                "hit_ratio": hit / prompt if prompt else 0.0,
                "replica_figures": cluster.figures() if cluster and self.pools else [],
                "pools": list(self.pools), "fleet": self.fleet,
                "decisions": self.log.latest(DECISIONS)}


class LiveRun:
    """A live run: `replicas` prefix-caching pools behind one policy, switchable, with a fleet
    mirroring the pools' KV events; or, given `compare` (two policies), two such sides
    (`route-<id>-a`, `route-<id>-b`), each request of the trace served on both. Built by
    `RoutingRuns.start_live` (`setup` on the loop), fed by its thread, undone by `release`.
    `state`: running, finished, stopped or failed."""

    def __init__(self, run_id: str, spec: dict, loop: asyncio.AbstractEventLoop) -> None:
        self.id = run_id
        self.spec = spec
        self.loop = loop
        self.state = "running"
        self.error: str | None = None
        self.done = 0
        self.total = spec["limit"]
        base = f"route-{run_id}"
        if spec.get("compare"):
            self.sides = [LiveSide(f"{base}-{label}", label, name, spec)
                          for label, name in zip("ab", spec["compare"])]
        else:
            self.sides = [LiveSide(base, None, spec["policy"], spec)]
        self.switches: list[dict] = []
        self.routed = 0  # requests routed so far (set on the loop, as each is routed)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"routing:{run_id}", daemon=True)

    @property
    def compare(self) -> bool:
        return len(self.sides) > 1

    # the single side's parts, as a single-policy run names them
    @property
    def policy(self) -> str:
        return self.sides[0].policy

    @property
    def cluster(self):
        return self.sides[0].cluster

    @property
    def pools(self) -> list[str]:
        return [name for side in self.sides for name in side.pools]

    @property
    def holds(self) -> bool:
        return any(side.pools or side.fleet is not None for side in self.sides)

    def check_names(self, services) -> None:
        """Raises Conflict when a pool or fleet name the run needs is taken (nothing is made)."""
        taken = []
        for side in self.sides:
            pools, fleet = side.names(self.spec["replicas"])
            taken += [f"pool {n!r}" for n in pools if n in services.registry]
            if fleet in services.fleets:
                taken.append(f"fleet {fleet!r}")
        if taken:
            verb = "exists" if len(taken) == 1 else "exist"
            raise Conflict(f"routing run {self.id!r} names its pools and fleets route-{self.id}-*, "
                           f"but {', '.join(taken)} {verb}: delete {'it' if len(taken) == 1 else 'them'} "
                           "or start the run again (it takes the next id)")

    async def setup(self, services) -> None:
        """Create each side's pools (each publishing on a loopback port) and the fleet following
        them. Raises Conflict when a name is taken (then nothing is made), or what the registry
        or the fleets raise (Conflict, TooLarge, InvalidRequest); then whatever this run made
        is removed again (and nothing else)."""
        self.check_names(services)
        try:
            for side in self.sides:
                await self._setup_side(side, services)
        except BaseException:
            await self._remove(services)
            raise

    async def _setup_side(self, side: LiveSide, services) -> None:
        spec, settings = self.spec, services.settings
        side._registry, side._fleets = services.registry, services.fleets
        blocks = spec["capacity_tokens"] // BLOCK_TOKENS
        pool_names, fleet_name = side.names(spec["replicas"])
        for name in pool_names:
            handle = await start_pool(services.registry, services.hub, {
                "name": name, "strategy": "paged", "num_blocks": blocks,
                "block_bytes": settings.default_block_bytes, "tokens_per_block": BLOCK_TOKENS,
                "prefix_caching": {"policy": "lru"},
                "publish": {"endpoint": "tcp://127.0.0.1:*",
                            "replay_endpoint": "tcp://127.0.0.1:*"}})
            side.handles.append(handle)
            self._check_not_stopped()
        engines = []
        for i, handle in enumerate(side.handles):
            pub = handle.links[0].publisher.publisher
            engines.append({"name": f"r{i}", "endpoint": pub.endpoint,
                            "replay_endpoint": pub.replay_endpoint, "num_blocks": blocks,
                            "block_size": BLOCK_TOKENS})
        side.fleet_handle = await services.fleets.create(fleet_name, engines)
        self._check_not_stopped()
        side.cluster = PoolCluster([h.pool for h in side.handles])

    def _check_not_stopped(self) -> None:
        if self._stop.is_set():
            raise Conflict(f"routing run {self.id!r} was stopped while it was being set up")

    def stop(self) -> None:
        self._stop.set()

    def switch(self, name: str) -> None:
        """Route with policy `name` from the next request on (a fresh router: its state, such as
        SGLang's approximate trees, starts empty). Runs on the event loop, between two steps.
        Raises Conflict for a compare run (its two policies are what it compares)."""
        if self.compare:
            raise Conflict(f"routing run {self.id!r} compares two policies; they cannot be "
                           "switched (start a new run)")
        side = self.sides[0]
        side.router = make_policy(name, self.spec["replicas"], self.spec["seed"])
        side.policy = name
        self.switches.append({"at_request": self.routed, "policy": name})

    def _run(self) -> None:
        speed = self.spec["speed"]
        try:
            full = bundled_trace()
            trace = full.head(min(self.spec["limit"], len(full)))
            self.total = len(trace)
            start = time.monotonic()
            first = float(trace.arrival_s[0]) if len(trace) else 0.0
            for req in trace_requests(trace):
                wait = (req.arrival_s - first) / speed - (time.monotonic() - start)
                if (wait > 0 and self._stop.wait(wait)) or self._stop.is_set():
                    raise _Stopped
                fut = asyncio.run_coroutine_threadsafe(
                    self._step(req, pool_hashes(trace, req.index)), self.loop)
                while True:
                    try:
                        fut.result(0.2)
                        break
                    except concurrent.futures.TimeoutError:
                        if self._stop.is_set():
                            fut.cancel()
                            raise _Stopped from None
                self.done = req.index + 1
            self.state = "finished"
        except _Stopped:
            self.state = "stopped"
        except Exception as exc:  # a failed run reports why; the server carries on
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"

    async def _step(self, req, hashes: list[int]) -> None:
        """Route one request on every side with its policy and serve it on the pool chosen."""
        chosen = []
        for side in self.sides:
            side.cluster.offer(req, hashes)
            r = side.router.route(req, side.cluster)
            side.log.add(req, r, side.cluster, side.router, policy_name=side.policy)
            chosen.append(r)
        self.routed = req.index + 1
        for side, r in zip(self.sides, chosen):
            async with side.handles[r].lock:
                side.log.captured(req.index, side.cluster.serve(req, r))

    async def release(self, services) -> None:
        """Stop the feed, then remove the pools (and with them their publishers) and the fleets."""
        self.stop()
        if self.thread.is_alive():
            await asyncio.to_thread(self.thread.join, 10)
        elif self.thread.ident is None and self.state == "running":  # stopped while set up
            self.state = "stopped"
        await self._remove(services)

    async def _remove(self, services) -> None:
        """Remove the pools and fleets this run made that the server still holds: by object,
        so a pool or fleet of the user's that took one of their names is left alone."""
        for side in self.sides:
            fleet, side.fleet_handle = side.fleet_handle, None
            if fleet is not None:
                with contextlib.suppress(NotFound):
                    await services.fleets.delete(fleet.name, handle=fleet)
            handles, side.handles = side.handles, []
            for handle in handles:
                try:
                    await services.registry.delete(handle.name, services.hub,
                                                    reason="routing run released", handle=handle)
                except Exception:
                    log.exception("removing pool %s of routing run %s failed", handle.name, self.id)

    def decision_logs(self) -> dict:
        """The decision log of each side, by its policy's name (a compare run's two by their
        labels "a" and "b" too)."""
        out = {}
        for side in self.sides:
            out[side.log.policy] = side.log
            if side.label:
                out[side.label] = side.log
        return out

    def holds_pool(self, handle) -> bool:
        return any(handle is h for side in self.sides for h in side.handles)

    def view(self) -> dict:
        sides = [side.view() for side in self.sides]
        out = {"id": self.id, "state": self.state, "mode": "live", "compare": self.compare,
               "replicas": self.spec["replicas"], "capacity_tokens": self.spec["capacity_tokens"],
               "limit": self.spec["limit"], "speed": self.spec["speed"],
               "policies": [s["policy"] for s in sides], "done": self.done, "total": self.total,
               "bounds": None, "results": [], "error": self.error, "pools": self.pools,
               "switches": list(self.switches), "sides": sides}
        if self.compare:  # the figures are the sides'
            return {**out, "policy": None, "current": None, "hit_ratio": None,
                    "replica_figures": [], "fleet": None, "decisions": []}
        one = sides[0]
        return {**out, "policy": one["policy"],
                "current": one["policy"] if self.state == "running" else None,
                "hit_ratio": one["hit_ratio"], "replica_figures": one["replica_figures"],
                "fleet": one["fleet"], "decisions": one["decisions"]}


class RoutingRuns:
    """The server's runs, newest last. Raises Conflict (one is running), NotFound."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, RoutingRun] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _check_idle(self) -> None:
        # a run adopted from the demo runs as long as the demo serves: it does not count
        running = [r for r in self._runs.values()
                   if r.state == "running" and getattr(r, "owns", True)]
        if running:
            raise Conflict(f"routing run {running[0].id!r} is running; stop it first")

    def _keep(self, run) -> None:
        self._runs[run.id] = run
        # forget the oldest runs past KEEP, but never one still holding pools or a fleet
        for old in [r for r in self._runs.values() if not r.holds][:max(0, len(self._runs) - KEEP)]:
            del self._runs[old.id]

    def start(self, spec: dict) -> RoutingRun:
        with self._lock:
            self._check_idle()
            run = RoutingRun(f"r{next(self._ids)}", spec)
            self._keep(run)
        run.thread.start()
        return run

    def check_pool_deletable(self, handle) -> None:
        """Raises Conflict when `handle` is a replica of a live run that is running (its thread
        routes into it)."""
        for run in self._runs.values():
            if isinstance(run, LiveRun) and run.state == "running" and run.holds_pool(handle):
                raise Conflict(f"pool {handle.name!r} is a replica of live routing run "
                               f"{run.id!r}; stop the run first")

    async def start_live(self, spec: dict, services) -> LiveRun:
        """Start a live run (its pools and fleet made before it is listed). Raises Conflict
        (a run is going, a name is taken, the server is full), TooLarge, InvalidRequest; then
        no run is listed and nothing the run did not make is touched."""
        self._check_idle()
        run = LiveRun(f"r{next(self._ids)}", spec, asyncio.get_running_loop())
        self._runs[run.id] = run  # listed while it is set up, so no second run starts meanwhile
        try:
            await run.setup(services)
        except BaseException:
            del self._runs[run.id]
            raise
        with self._lock:
            self._keep(run)
        run.thread.start()
        return run

    async def start_router(self, spec: dict, services):
        """Start a router run (app/routing_router.py): its engines, router and fleet made before
        its replay starts. Raises Conflict (a run is going, the fleet's name is taken, the
        router would not start), InvalidRequest (an unknown router, its package missing); then
        no run is listed and nothing is left running."""
        self._check_idle()
        check_router(spec["router"])
        if spec.get("speed") is None:  # the requests in about a minute
            trace = bundled_trace()
            last = float(trace.arrival_s[min(spec["limit"], len(trace)) - 1] - trace.arrival_s[0])
            spec = {**spec, "speed": max(1.0, last / 60.0)}
        run = RouterRun(f"r{next(self._ids)}", spec)
        self._runs[run.id] = run  # listed while it is set up, so no second run starts meanwhile
        try:
            await run.setup(services)
        except RouterError as exc:
            del self._runs[run.id]
            raise Conflict(f"the {spec['router']} router would not start: {exc}") from None
        except BaseException:
            del self._runs[run.id]
            raise
        with self._lock:
            self._keep(run)
        run.thread.start()
        return run

    def adopt(self, session, spec: dict, *, fleet: str, load=None):
        """List a router run someone else started and owns (`kvscope demo --sim --router`):
        its engines, router and load are theirs; it is listed as running while they are."""
        with self._lock:
            run = RouterRun(f"r{next(self._ids)}", spec, session=session, fleet_name=fleet,
                            load=load)
            self._keep(run)
        return run

    def list(self) -> list:
        """The runs the server keeps, oldest first."""
        return list(self._runs.values())

    async def delete(self, run_id: str, services) -> None:
        """Stop the run, release what it holds and forget it. Raises NotFound."""
        run = self.get(run_id)
        await run.release(services)
        self._runs.pop(run_id, None)

    def get(self, run_id: str) -> RoutingRun:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound("routing run", run_id)
        return run

    def stop_all(self) -> None:
        for run in list(self._runs.values()):
            run.stop()
        for run in list(self._runs.values()):
            if run.thread.is_alive():
                run.thread.join(timeout=10)
            session = getattr(run, "session", None)
            if session is not None and getattr(run, "owns", False):
                run.session = None
                session.close()
