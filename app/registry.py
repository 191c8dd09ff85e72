"""Registry: the live pools of one server, by name, each with its cache, lock and workload."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocator import MirrorPool, Pool, PoolSpec
from allocator.errors import Conflict, ExceedsCapacity, NotFound, TooLarge
from allocator.history import History

from . import runner
from .settings import Settings, total_pool_cap

if TYPE_CHECKING:
    from allocator import KVCache
    from workloads.live import LiveWorkload

    from .stream import Hub, PoolStream


@dataclass(slots=True, eq=False)
class PoolHandle:
    """One pool as the server holds it, and what the server does to it as a whole.

    The handle owns the pool (and through it the cache built on it), the workload running on it
    and, while the pool is registered, its stream; routes call its methods rather than reach in.
    `lock` keeps one thing at a time on the pool: every route that names the pool (`PoolDep`,
    app/deps.py, held while the route runs, so its O(pool) work may run in a worker thread), the
    workload runner around each `advance`, a data upload (PUT .../data) around writing the body
    it awaited, a mirror's applier (app/mirrors.py) around applying its subscriber's batches, a
    stream client's join (its snapshot) and a routing run around serving a request on a
    cluster's pool. The stream's tick and the TTL sweep do not wait for it: they skip a pool
    whose lock is held and read it next time.
    """

    name: str
    pool: Pool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    workload: LiveWorkload | None = None  # the latest workload started here, running or not
    workload_task: asyncio.Task | None = None
    workload_error: str | None = None  # why the latest workload failed; None unless it did
    stream: PoolStream | None = None  # set by the hub while the pool is registered
    links: list = field(default_factory=list)  # engine links (app/mirrors.py), closed on detach

    @property
    def cache(self) -> KVCache | None:
        return self.pool.cache

    def describe(self) -> dict:
        return {"name": self.name, "config": self.pool.config(), "stats": self.pool.stats()}

    def summary(self) -> dict:
        p, cache = self.pool, self.cache
        return {
            "name": self.name,
            "strategy": p.strategy,
            "num_blocks": p.num_blocks,
            "block_bytes": p.block_bytes,
            "capacity_bytes": p.capacity_bytes,
            "device": str(p.storage.device),
            "used_blocks": p.used_blocks,
            "utilization": p.used_blocks / p.num_blocks,
            "cache": None if cache is None else {"policy": cache.policy, "capacity_bytes": cache.capacity_bytes},
            "prefix_caching": p.config().get("prefix_caching"),
        }

    def reset(self) -> int:
        """Free everything (the cache hears of it from the pool); returns how many were freed."""
        return self.pool.reset()

    def check(self) -> list[str]:
        """Every broken invariant of the pool and its cache (empty: all hold)."""
        cache = self.cache
        return self.pool.check() + (cache.check() if cache is not None else [])

    async def start_workload(self, hub: Hub, spec: dict) -> dict:
        """Start a workload (app/runner.py). Raises Conflict (one runs), InvalidRequest."""
        return await runner.start_workload(self, hub, spec)

    async def stop_workload(self) -> bool:
        """Stop the running workload; False when none was running."""
        return await runner.stop_workload(self)

    def workload_progress(self) -> dict | None:
        """The latest workload's progress, or None when none was started here."""
        return runner.workload_progress(self)


class Registry:
    """Pools by name. Creating checks the caps before any memory is taken."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.total_cap = total_pool_cap(settings)  # bytes all pools together may hold
        self._pools: dict[str, PoolHandle] = {}

    def total_bytes(self) -> int:
        """Bytes of all pools together (what `total_cap` bounds)."""
        return sum(h.pool.capacity_bytes for h in self._pools.values())

    def __contains__(self, name: str) -> bool:
        return name in self._pools

    def __iter__(self):
        return iter(list(self._pools.values()))

    def find(self, name: str) -> PoolHandle | None:
        """The pool named `name`, or None."""
        return self._pools.get(name)

    def get(self, name: str) -> PoolHandle:
        try:
            return self._pools[name]
        except KeyError:
            raise NotFound("pool", name) from None

    def parse(self, request: dict) -> PoolSpec:
        """A create request (the fields of app/schemas/pools.py PoolCreate) parsed into a PoolSpec, with
        this server's default device. Raises InvalidRequest."""
        fields = dict(request)
        fields.pop("publish", None)  # the pool's links (app/mirrors.py), not the allocator's
        fields["device"] = fields.get("device") or self.settings.device
        strategy = fields.pop("strategy", "paged")
        return PoolSpec.parse(strategy, **fields)

    def create(self, spec: PoolSpec | dict) -> PoolHandle:
        """Build a pool (and its cache) from a spec, or a create request's fields. Raises
        Conflict, TooLarge, InvalidRequest; on any of them nothing is registered."""
        s = self.settings
        if isinstance(spec, dict) and spec.get("strategy") == "mirror":
            return self._create_mirror(spec)
        if isinstance(spec, dict):
            spec = self.parse(spec)
        self._admit(spec.name)
        spec.check_caps(s.max_blocks, s.max_pool_bytes)  # before any memory is taken
        planned = spec.capacity_bytes
        if planned > self.total_cap:
            raise ExceedsCapacity(planned, self.total_cap, "server (KVSCOPE_MAX_TOTAL_BYTES)")
        held = self.total_bytes()
        if held + planned > self.total_cap:
            raise Conflict(f"pools already hold {held} of the server's {self.total_cap} bytes "
                           f"(KVSCOPE_MAX_TOTAL_BYTES): {planned} more do not fit; delete a pool first")
        handle = PoolHandle(spec.name, self._keep_history(spec.build()))
        self._pools[spec.name] = handle
        return handle

    def _keep_history(self, pool: Pool) -> Pool:
        """`pool` with the event history the server keeps of every live pool it serves
        (`KVSCOPE_HISTORY_BYTES` of budget; 0: none), unless it keeps one already."""
        if self.settings.history_bytes and pool.history is None:
            History(pool, self.settings.history_bytes)
        return pool

    def adopt(self, name: str, pool) -> PoolHandle:
        """Register an already built pool (an opened recording). Raises Conflict."""
        if name in self._pools:
            raise Conflict(f"pool {name!r} already exists")
        if len(self._pools) >= self.settings.max_pools:
            raise Conflict(f"at most {self.settings.max_pools} pools; delete one first")
        handle = PoolHandle(name, pool)
        self._pools[name] = handle
        return handle

    def _create_mirror(self, spec: dict) -> PoolHandle:
        """A MirrorPool (strategy 'mirror', app/mirrors.py resolved its num_blocks). Logical slots
        only: it holds no KV bytes, so its one-byte-per-slot tensor lives on the CPU."""
        s = self.settings
        name, num_blocks = spec["name"], spec["num_blocks"]
        self._admit(name)
        if num_blocks > s.max_blocks:
            raise TooLarge(f"{num_blocks} blocks exceeds the cap of {s.max_blocks}")
        pool = MirrorPool(num_blocks, spec.get("block_bytes") or 1, name=name, device="cpu",
                          tokens_per_block=spec.get("tokens_per_block"))
        handle = PoolHandle(name, self._keep_history(pool))
        self._pools[name] = handle
        return handle

    def _admit(self, name: str) -> None:
        """Raises Conflict when `name` is taken or the server holds its most pools already."""
        if name in self._pools:
            raise Conflict(f"pool {name!r} already exists")
        self.check_room()

    def check_room(self) -> None:
        """Raises Conflict when the server holds its most pools already (asked before a costly
        build, such as receiving an uploaded recording)."""
        if len(self._pools) >= self.settings.max_pools:
            raise Conflict(f"at most {self.settings.max_pools} pools; delete one first")

    def remove(self, name: str) -> PoolHandle:
        handle = self.get(name)
        del self._pools[name]
        return handle

    def holds(self, handle: PoolHandle) -> bool:
        """Whether `handle` is still the server's pool by its name."""
        return self._pools.get(handle.name) is handle

    async def delete(self, name: str, hub: Hub, reason: str = "pool deleted", *,
                     handle: PoolHandle | None = None) -> bool:
        """Unregister the pool, stop its workload and close its stream. Raises NotFound. Given
        `handle`, only that very pool: False (nothing done) when the pool by that name is
        another one or gone."""
        if handle is not None and not self.holds(handle):
            return False
        await hub.detach(self.remove(name), reason=reason)
        return True
