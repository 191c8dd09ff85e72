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

from .blockmap import CACHED, FREE, PINNED, STATE_NAMES, USED, BlockMap
from .cache import Entry, KVCache, PutResult
from .contiguous import FITS, ContiguousPool
from .errors import Conflict, InvalidRequest, KVScopeError, NotFound, OutOfMemory, TooLarge
from .events import EVENT_FIELDS, EventLog
from .geometry import MODEL_PRESETS, ModelGeometry, get_model
from .history import DEFAULT_HISTORY_BYTES, History, HistoryView, OutsideHistory
from .paged import PagedPool
from .policies import POLICIES
from .pool import Allocation, DefragReport, Pool
from .storage import BlockStorage, resolve_device
from .tiered import DEFAULT_TIERS, TieredPool

STRATEGIES = ("paged", "tiered", "contiguous")


def create_pool(
    strategy: str = "paged",
    *,
    num_blocks: int | None = None,
    capacity_bytes: int | None = None,
    block_bytes: int | None = None,
    tokens_per_block: int | None = None,
    model: str | ModelGeometry | None = None,
    device: str = "auto",
    fit: str = "first",
    tiers: list[dict] | None = None,
    name: str = "pool",
    event_capacity: int = 10_000,
    history_bytes: int | None = DEFAULT_HISTORY_BYTES,
) -> Pool:
    """Build a pool. Size by `num_blocks` or `capacity_bytes`; block size by `block_bytes` or by
    `tokens_per_block` (default 16) with a `model` geometry. Raises InvalidRequest."""
    if strategy not in STRATEGIES:
        raise InvalidRequest(f"unknown strategy {strategy!r}; choose one of {list(STRATEGIES)}")
    geometry = get_model(model) if isinstance(model, str) else model
    if block_bytes is None:
        if geometry is None:
            raise InvalidRequest("give 'block_bytes', or 'model' (with optional 'tokens_per_block')")
        tokens_per_block = tokens_per_block or 16
        if isinstance(tokens_per_block, bool) or not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
            raise InvalidRequest(f"tokens_per_block must be a positive integer, got {tokens_per_block!r}")
        block_bytes = tokens_per_block * geometry.bytes_per_token
    elif tokens_per_block is not None and geometry is not None:
        if block_bytes != tokens_per_block * geometry.bytes_per_token:
            raise InvalidRequest("block_bytes disagrees with tokens_per_block * bytes_per_token; give one")
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes <= 0:
        raise InvalidRequest(f"block_bytes must be a positive integer, got {block_bytes!r}")
    if (num_blocks is None) == (capacity_bytes is None):
        raise InvalidRequest("give exactly one of 'num_blocks' or 'capacity_bytes'")
    if capacity_bytes is not None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < block_bytes:
            raise InvalidRequest(f"capacity_bytes must be an integer of at least one block ({block_bytes} bytes)")
        num_blocks = capacity_bytes // block_bytes
    kw = dict(name=name, device=device, model=geometry, tokens_per_block=tokens_per_block,
              event_capacity=event_capacity, history_bytes=history_bytes)
    if strategy == "paged":
        return PagedPool(num_blocks, block_bytes, **kw)
    if strategy == "contiguous":
        return ContiguousPool(num_blocks, block_bytes, fit=fit, **kw)
    return TieredPool(num_blocks, block_bytes, tiers=tiers, **kw)


__all__ = [
    "Allocation", "BlockMap", "BlockStorage", "CACHED", "Conflict", "ContiguousPool",
    "DEFAULT_TIERS", "DefragReport", "History", "HistoryView", "OutsideHistory", "EVENT_FIELDS", "Entry", "EventLog", "FITS", "FREE",
    "InvalidRequest", "KVCache", "KVScopeError", "MODEL_PRESETS", "ModelGeometry", "NotFound",
    "OutOfMemory", "PINNED", "POLICIES", "PagedPool", "Pool", "PutResult", "STATE_NAMES",
    "STRATEGIES", "TieredPool", "TooLarge", "USED", "create_pool", "get_model", "resolve_device",
]
