"""Operations: each thing a client can do to a pool, written once for the REST routes and `/ops`.

A route validates its body with pydantic and calls one function here; the batch endpoint
(app/routes/ops.py) calls the same function for each op. So both refuse the same things with the
same typed errors (sizes in bytes or tokens, an allocation that holds a cache entry, a pool with
no cache) and change the core the same way. The functions return core values (ids, entries,
reports); the `*_result` functions turn them into the one shape each operation answers with,
over REST (the body) and in a batch (`{"ok": true, **body}`; docs/API.md, "One shape per
operation"). An operation whose REST answer is 204 has no body, and its batch result is
`{"ok": true}`.

NOTE: the batch path targets 1M blocks/s, so these functions do no more than the core call and
the checks it needs, and the results are plain dicts (no response models, no dataclasses.asdict).
"""

from __future__ import annotations

from allocator import KVCache, Pool, PrefixPool, SequenceInfo
from allocator.cache.cache import Entry, PutResult
from allocator.errors import Conflict, NotFound

# -- checks -------------------------------------------------------------------------------------


def cache_of(pool: Pool) -> KVCache:
    """The pool's cache. Raises Conflict when it has none."""
    cache = pool.cache
    if cache is None:
        raise Conflict(f"pool {pool.name!r} has no cache; create it with 'cache': {{...}}")
    return cache


def refuse_cache_entry(pool: Pool, aid: int) -> None:
    """Raises Conflict when allocation `aid` holds a cache entry: entries change through the
    cache (/entries, or the put/delete ops), else the cache's books would go wrong."""
    cache = pool.cache
    key = cache.key_of(aid) if cache is not None else None
    if key is not None:
        raise Conflict(f"allocation {aid} holds cache entry {key!r}; change it through /entries/{{key}} "
                       "or the put/delete ops")


def prefix_pool_of(pool: Pool) -> PrefixPool:
    """The pool as a prefix-caching pool. Raises Conflict when it was created without."""
    if not isinstance(pool, PrefixPool):
        raise Conflict(f"pool {pool.name!r} has no prefix caching; create it with "
                       "'prefix_caching': {\"policy\": \"lru\"} and 'tokens_per_block'")
    return pool


# -- allocations --------------------------------------------------------------------------------
def allocate(pool: Pool, nbytes: int | None = None, tokens: int | None = None) -> int:
    """A new allocation of `nbytes` or `tokens`; its id. Raises InvalidRequest, OutOfMemory."""
    return pool.allocate(pool.to_bytes(nbytes, tokens))


def extend(pool: Pool, aid: int, nbytes: int | None = None, tokens: int | None = None) -> bool:
    """Grow raw allocation `aid`; True when its data moved. Raises InvalidRequest, NotFound,
    Conflict (a cache entry), OutOfMemory."""
    size = pool.to_bytes(nbytes, tokens)
    refuse_cache_entry(pool, aid)
    return pool.extend(aid, size)


def free(pool: Pool, aid: int) -> None:
    """Free raw allocation `aid`. Raises NotFound, Conflict (a cache entry)."""
    refuse_cache_entry(pool, aid)
    pool.free(aid)


def allocation_view(pool: Pool, aid: int) -> dict:
    """The allocation, plus its cache `key`, `age_s` and `idle_s` when it is a cache entry."""
    out = allocation_result(pool, aid)
    cache = pool.cache
    key = cache.key_of(aid) if cache is not None else None
    if key is not None:
        entry = cache.peek(key)
        now = cache.clock()
        out.update(key=key, age_s=now - entry.created_at, idle_s=now - entry.last_access)
    return out


# -- cache entries ------------------------------------------------------------------------------
def put(pool: Pool, key: str, nbytes: int | None = None, tokens: int | None = None,
        priority: int | None = None, ttl_s: float | None = None, pinned: bool | None = None) -> PutResult:
    """Insert or refresh entry `key`. Raises Conflict (no cache, or pinned budget), InvalidRequest,
    OutOfMemory."""
    cache = cache_of(pool)
    return cache.put(key, pool.to_bytes(nbytes, tokens), priority, ttl_s, pinned)


def get(pool: Pool, key: str) -> Entry | None:
    """Look `key` up (a hit touches it); None on a miss. Raises Conflict (no cache)."""
    return cache_of(pool).get(key)


def delete(pool: Pool, key: str) -> None:
    """Remove entry `key`. Raises Conflict (no cache), NotFound."""
    cache_of(pool).remove(key)


def evict(pool: Pool, key: str) -> None:
    """Evict entry `key` now (reason manual). Raises Conflict (no cache, or pinned), NotFound."""
    cache_of(pool).evict(key)


# -- sequences (prefix caching) -----------------------------------------------------------------
def open_sequence(pool: Pool, tokens=None, block_hashes=None, num_tokens=None, salt=None,
                  next_use=None) -> SequenceInfo:
    """Open a sequence, reusing its longest cached prefix. Raises Conflict (no prefix caching),
    InvalidRequest, OutOfMemory (every block held)."""
    return prefix_pool_of(pool).open_sequence(tokens, block_hashes, num_tokens, salt, next_use)


def append(pool: Pool, seq_id: int, tokens=None, num_tokens=None, block_hashes=None) -> SequenceInfo:
    """Grow sequence `seq_id`. Raises Conflict, NotFound, InvalidRequest, OutOfMemory."""
    return prefix_pool_of(pool).append(seq_id, tokens, num_tokens, block_hashes)


def close_sequence(pool: Pool, seq_id: int) -> None:
    """Drop the sequence's references. Raises Conflict, NotFound."""
    prefix_pool_of(pool).close_sequence(seq_id)


# -- pool ---------------------------------------------------------------------------------------
def defragment(pool: Pool) -> dict:
    """Compact the pool; the report as a dict."""
    return pool.defragment().to_dict()


# -- results: one shape per operation, for REST and /ops ------------------------------------------
def allocation_result(pool: Pool, aid: int) -> dict:
    """What `allocate` answers: id, requested and allocated bytes, `blocks` as [start, count]
    runs in data order, state, tier."""
    return pool.allocation(aid).to_dict()


def extend_result(pool: Pool, aid: int, moved: bool) -> dict:
    """What `extend` answers: the allocation as `allocate` does, plus `moved`."""
    out = allocation_result(pool, aid)
    out["moved"] = moved
    return out


def entry_result(pool: Pool, entry: Entry) -> dict:
    """What a cache hit answers: the entry (key, id, sizes, priority, pin, TTL, age, hits, blocks)."""
    out = entry.to_dict(pool.cache.clock())
    out["blocks"] = pool.block_runs(entry.id)
    return out


def put_result(pool: Pool, r: PutResult) -> dict:
    """What `put` answers: the entry, the keys evicted to make room, whether it was `created`."""
    return {"entry": entry_result(pool, r.entry), "evicted": r.evicted, "created": r.created}


def get_result(pool: Pool, key: str) -> dict:
    """What `get` answers: the entry on a hit (touched). Raises NotFound on a miss (counted as
    one), Conflict (no cache)."""
    entry = get(pool, key)
    if entry is None:
        raise NotFound("entry", key)
    return entry_result(pool, entry)


def sequence_result(seq: SequenceInfo) -> dict:
    """What `open` and `append` answer: id, num_tokens, cached_tokens (at open), block ids."""
    return seq.to_dict()


# -- batch ops (app/routes/ops.py): {"ok": true} + the REST body ------------------------------------
def _op_allocate(pool: Pool, op) -> dict:
    return {"ok": True, **allocation_result(pool, allocate(pool, op.bytes, op.tokens))}


def _op_extend(pool: Pool, op) -> dict:
    return {"ok": True, **extend_result(pool, op.id, extend(pool, op.id, op.bytes, op.tokens))}


def _op_free(pool: Pool, op) -> dict:
    free(pool, op.id)
    return {"ok": True}


def _op_put(pool: Pool, op) -> dict:
    return {"ok": True, **put_result(pool, put(pool, op.key, op.bytes, op.tokens, op.priority, op.ttl_s,
                                               op.pinned))}


def _op_get(pool: Pool, op) -> dict:
    return {"ok": True, **get_result(pool, op.key)}


def _op_delete(pool: Pool, op) -> dict:
    delete(pool, op.key)
    return {"ok": True}


def _op_evict(pool: Pool, op) -> dict:
    evict(pool, op.key)
    return {"ok": True}


def _op_defragment(pool: Pool, op) -> dict:
    return {"ok": True, **defragment(pool)}


def _op_open(pool: Pool, op) -> dict:
    seq = open_sequence(pool, op.tokens, op.block_hashes, op.num_tokens, op.salt, op.next_use)
    return {"ok": True, **sequence_result(seq)}


def _op_append(pool: Pool, op) -> dict:
    return {"ok": True, **sequence_result(append(pool, op.id, op.tokens, op.num_tokens, op.block_hashes))}


def _op_close(pool: Pool, op) -> dict:
    close_sequence(pool, op.id)
    return {"ok": True}


# One entry per batch op (app/schemas/ops.py `Op`): a new op is a function above and a line here.
BATCH_OPS = {"allocate": _op_allocate, "extend": _op_extend, "free": _op_free, "put": _op_put,
             "get": _op_get, "delete": _op_delete, "evict": _op_evict, "defragment": _op_defragment,
             "open": _op_open, "append": _op_append, "close": _op_close}
