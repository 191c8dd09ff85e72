"""Registry: the live pools of one server, by name, each with its cache, lock and workload."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from allocator import KVCache, Pool, create_pool, get_model
from allocator.errors import Conflict, ExceedsCapacity, NotFound, TooLarge

from .settings import Settings, total_pool_cap


@dataclass(slots=True, eq=False)
class PoolHandle:
    """One pool as the server holds it.

    `lock` is held by exactly two things: the workload runner around each `advance`, and a data
    upload (PUT .../data) around writing the body it awaited into the entry. Neither awaits while
    holding it, so it orders them only should one ever do so. Other handlers do not take it: they
    call the synchronous core with no await in between, so the event loop serializes them.
    """

    name: str
    pool: Pool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    workload: Any = None  # the latest LiveWorkload started here, running or not
    workload_task: asyncio.Task | None = None
    workload_error: str | None = None  # why the latest workload failed; None unless it did
    stream: Any = None  # app.stream.PoolStream, attached by the hub

    def describe(self) -> dict:
        return {"name": self.name, "config": self.pool.config(), "stats": self.pool.stats()}

    def summary(self) -> dict:
        p = self.pool
        return {
            "name": self.name,
            "strategy": p.strategy,
            "num_blocks": p.num_blocks,
            "block_bytes": p.block_bytes,
            "capacity_bytes": p.capacity_bytes,
            "device": str(p.storage.device),
            "used_blocks": p.used_blocks,
            "utilization": p.used_blocks / p.num_blocks,
            "cache": None if p.cache is None else {"policy": p.cache.policy,
                                                  "capacity_bytes": p.cache.capacity_bytes},
        }


def planned_geometry(spec: dict) -> tuple[int, int]:
    """(num_blocks, block_bytes) a create request would build, to check caps before allocating.

    Returns (0, 0) when the spec is too malformed to tell; `create_pool` then rejects it.
    """
    block_bytes = spec.get("block_bytes")
    if block_bytes is None and spec.get("model") is not None:
        block_bytes = (spec.get("tokens_per_block") or 16) * get_model(spec["model"]).bytes_per_token
    if not isinstance(block_bytes, int) or block_bytes <= 0:
        return 0, 0
    if spec.get("num_blocks") is not None:
        return int(spec["num_blocks"]), block_bytes
    if spec.get("capacity_bytes") is not None:
        return int(spec["capacity_bytes"]) // block_bytes, block_bytes
    return 0, block_bytes


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

    def create(self, spec: dict) -> PoolHandle:
        """Build a pool (and its cache) from a create request. Raises Conflict, TooLarge,
        InvalidRequest; on any of them nothing is registered."""
        s = self.settings
        name = spec["name"]
        if name in self._pools:
            raise Conflict(f"pool {name!r} already exists")
        if len(self._pools) >= s.max_pools:
            raise Conflict(f"at most {s.max_pools} pools; delete one first")
        num_blocks, block_bytes = planned_geometry(spec)
        if num_blocks > s.max_blocks:
            raise TooLarge(f"{num_blocks} blocks exceeds the cap of {s.max_blocks}")
        if num_blocks * block_bytes > s.max_pool_bytes:
            raise TooLarge(f"{num_blocks * block_bytes} bytes exceeds the cap of {s.max_pool_bytes}")
        if block_bytes > s.max_pool_bytes:
            raise TooLarge(f"block of {block_bytes} bytes exceeds the cap of {s.max_pool_bytes}")
        planned = num_blocks * block_bytes
        if planned > self.total_cap:
            raise ExceedsCapacity(planned, self.total_cap, "server (KVSCOPE_MAX_TOTAL_BYTES)")
        held = self.total_bytes()
        if held + planned > self.total_cap:
            raise Conflict(f"pools already hold {held} of the server's {self.total_cap} bytes "
                           f"(KVSCOPE_MAX_TOTAL_BYTES): {planned} more do not fit; delete a pool first")
        cache_spec = spec.get("cache")
        pool = create_pool(
            spec.get("strategy", "paged"),
            num_blocks=spec.get("num_blocks"),
            capacity_bytes=spec.get("capacity_bytes"),
            block_bytes=spec.get("block_bytes"),
            tokens_per_block=spec.get("tokens_per_block"),
            model=spec.get("model"),
            device=spec.get("device") or s.device,
            fit=spec.get("fit") or "first",
            tiers=spec.get("tiers"),
            name=name,
        )
        if cache_spec is not None:
            KVCache(pool, cache_spec.get("capacity_bytes"), cache_spec.get("policy") or "lru")
        handle = PoolHandle(name, pool)
        self._pools[name] = handle
        return handle

    def remove(self, name: str) -> PoolHandle:
        handle = self.get(name)
        del self._pools[name]
        return handle
