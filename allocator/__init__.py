"""kvscope allocator core: torch-backed KV-cache pools, a block map, events and an eviction cache.

Pure core: imports only the standard library, numpy and torch (never a web framework).

    from allocator import create_pool, KVCache
    pool = create_pool("paged", num_blocks=1024, block_bytes=4096)
    aid = pool.allocate(10_000)          # -> allocation id
    pool.extend(aid, 5_000)
    pool.free(aid)
    cache = KVCache(pool, capacity_bytes=2 << 20, policy="lru")
    cache.put("session-1", 64_000)
"""

from __future__ import annotations

from .cache.cache import Entry, KVCache, PutResult
from .errors import (
    Conflict,
    CorruptState,
    ExceedsCapacity,
    InvalidRequest,
    KVScopeError,
    NotFound,
    OutOfMemory,
    PrefixOutOfMemory,
    TooLarge,
    positive_int,
)
from .history import History, HistoryView, OutsideHistory
from .pools.blockmap import CACHED, FREE, PINNED, SHARED, USED, BlockMap
from .pools.contiguous import ContiguousPool
from .pools.events import EventLog
from .pools.geometry import MODEL_PRESETS, ModelGeometry, get_model
from .pools.paged import PagedPool
from .pools.pool import Allocation, DefragReport, Pool
from .pools.spec import CacheSpec, PoolSpec
from .pools.storage import BlockStorage, resolve_device
from .pools.tiered import DEFAULT_TIERS, TieredPool
from .prefix.mirror import MirrorPool
from .prefix.prefix import PrefixPool, SequenceInfo
from .vocab import (
    EVENT_FIELDS,
    FITS,
    POLICIES,
    PREFIX_POLICIES,
    SCENARIOS,
    STATE_NAMES,
    STRATEGIES,
    meta,
)


def create_pool(strategy: str = "paged", **options) -> Pool:
    """Build a pool: `PoolSpec.parse(strategy, **options).build()`. Size by `num_blocks` or
    `capacity_bytes`; block size by `block_bytes` or by `tokens_per_block` (default 16) with a
    `model` geometry; `device`, `fit`, `tiers`, `name`, `event_capacity`, `cache`,
    `prefix_caching` ({"policy": ...}: a PrefixPool), `history` / `history_bytes` (keep the
    event history: `pool.history`) as `PoolSpec.parse` takes them. Raises InvalidRequest."""
    return PoolSpec.parse(strategy, **options).build()


__all__ = [
    "Allocation", "BlockMap", "BlockStorage", "CACHED", "CacheSpec", "Conflict", "ContiguousPool", "CorruptState",
    "DEFAULT_TIERS", "DefragReport", "EVENT_FIELDS", "Entry", "EventLog", "ExceedsCapacity", "FITS", "FREE",
    "History", "HistoryView", "OutsideHistory",
    "InvalidRequest", "KVCache", "KVScopeError", "MODEL_PRESETS", "MirrorPool", "ModelGeometry", "NotFound",
    "OutOfMemory", "PINNED", "POLICIES", "PREFIX_POLICIES", "PagedPool", "Pool", "PoolSpec",
    "PrefixOutOfMemory", "PrefixPool", "PutResult", "SCENARIOS", "SHARED", "STATE_NAMES",
    "STRATEGIES", "SequenceInfo", "TieredPool", "TooLarge", "USED", "create_pool", "get_model", "meta",
    "positive_int", "resolve_device",
]
