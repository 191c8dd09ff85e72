"""Malformed and impossible requests raise the right typed error and change nothing."""

from __future__ import annotations

import tracemalloc

import pytest
from support.kvtest_util import FakeClock, payload, pool_snapshot

from allocator import (
    Conflict,
    ContiguousPool,
    ExceedsCapacity,
    InvalidRequest,
    KVCache,
    NotFound,
    OutOfMemory,
    create_pool,
)
from allocator.vocab import STRATEGIES  # every strategy meets the same contract

BAD_SIZES = [0, -1, -4096, 1.5, 16.0, True, False, "16", None, [16]]


def populated(strategy: str):
    pool = create_pool(strategy, num_blocks=64, block_bytes=16, device="cpu")
    ids = [pool.allocate(n) for n in (10, 40, 100)]
    pool.free(ids[1])
    pool.write(ids[0], payload(10, 1))
    cache = KVCache(pool, 512, "lru", clock=FakeClock())
    cache.put("a", 20)
    cache.put("b", 30, pinned=True)
    cache.write("a", payload(20, 2))
    return pool, cache, ids


def unchanged(pool, call, error):
    before = pool_snapshot(pool)
    with pytest.raises(error) as err:
        call()
    assert pool_snapshot(pool) == before
    assert pool.check() == [] and (pool.cache is None or pool.cache.check() == [])
    return err.value


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("bad", BAD_SIZES, ids=repr)
def test_bad_sizes_are_invalid_requests(strategy: str, bad: object) -> None:
    pool, cache, ids = populated(strategy)
    unchanged(pool, lambda: pool.allocate(bad), InvalidRequest)
    unchanged(pool, lambda: pool.extend(ids[0], bad), InvalidRequest)
    unchanged(pool, lambda: cache.put("new", bad), InvalidRequest)
    unchanged(pool, lambda: cache.put("a", bad), InvalidRequest)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sizes_above_capacity(strategy: str) -> None:
    pool, cache, ids = populated(strategy)
    events = pool.events.last_seq
    # More than the whole pool can never fit: ExceedsCapacity (413), not an OOM, not logged.
    err = unchanged(pool, lambda: pool.allocate(64 * 16 + 1), ExceedsCapacity)
    assert err.details() == {"requested_bytes": 64 * 16 + 1, "capacity_bytes": 64 * 16, "of": "pool"}
    assert pool.events.last_seq == events
    unchanged(pool, lambda: pool.extend(ids[0], 10**9), ExceedsCapacity)
    # Free memory short of a request the pool could hold is an OOM ("not now"), logged.
    held = pool.used_blocks * pool.block_bytes
    err = unchanged(pool, lambda: pool.allocate(64 * 16 - held + 64), OutOfMemory)
    assert err.cause == "capacity" and pool.events.last_seq == events + 1
    # A cache entry above the cache capacity can never fit either.
    unchanged(pool, lambda: cache.put("huge", 513), ExceedsCapacity)
    unchanged(pool, lambda: cache.put("a", 10**6), ExceedsCapacity)


def refused_small(pool, call, errors) -> None:
    """`call` is refused with nothing changed, having built nothing of the request's size."""
    before = pool_snapshot(pool)
    tracemalloc.start()
    try:
        with pytest.raises(errors):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse it"
    assert pool_snapshot(pool) == before
    assert pool.check() == [] and pool.cache.check() == []


@pytest.mark.parametrize("strategy", [*STRATEGIES, "prefix"])
@pytest.mark.parametrize("nbytes", [2**32, 2**34, 2**40, 2**60])
def test_huge_sizes_are_refused_before_anything_of_their_size_is_built(strategy: str, nbytes: int) -> None:
    """Every sized call, up to the API schema's byte maximum (2**60), on every strategy and on
    a prefix-caching pool: refused (413 or 507 over HTTP) at the cost of a small request."""
    if strategy == "prefix":
        pool = create_pool("paged", num_blocks=64, block_bytes=16, device="cpu", tokens_per_block=4,
                           prefix_caching={"policy": "lru"})
        pool.write(pool.allocate(10), payload(10, 1))
        cache = KVCache(pool, 512, "lru", clock=FakeClock())
        cache.put("a", 20)
        ids = pool.ids()
    else:
        pool, cache, ids = populated(strategy)
    too_big = (ExceedsCapacity, OutOfMemory)
    refused_small(pool, lambda: pool.allocate(nbytes), too_big)
    refused_small(pool, lambda: pool.extend(ids[0], nbytes), too_big)
    refused_small(pool, lambda: pool.allocate_many([16, nbytes]), too_big)
    refused_small(pool, lambda: cache.put("new", nbytes), too_big)
    refused_small(pool, lambda: cache.put("a", nbytes), too_big)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_unknown_ids_and_double_free(strategy: str) -> None:
    pool, _, ids = populated(strategy)
    for aid in (ids[1], 999, -1, 0, "1", None, 1.0):
        unchanged(pool, lambda a=aid: pool.free(a), NotFound)
        unchanged(pool, lambda a=aid: pool.extend(a, 16), NotFound)
        unchanged(pool, lambda a=aid: pool.read(a), NotFound)
        unchanged(pool, lambda a=aid: pool.write(a, b"x"), NotFound)
        unchanged(pool, lambda a=aid: pool.allocation(a), NotFound)
    pool.free(ids[2])
    unchanged(pool, lambda: pool.free(ids[2]), NotFound)  # double free


def test_unknown_keys_bad_keys_and_pinned_eviction() -> None:
    pool, cache, _ = populated("paged")
    for call in (lambda: cache.remove("zz"), lambda: cache.peek("zz"), lambda: cache.evict("zz"),
                 lambda: cache.pin("zz"), lambda: cache.read("zz"), lambda: cache.write("zz", b"x")):
        unchanged(pool, call, NotFound)
    for key in ("", 7, None, "k" * 257):
        unchanged(pool, lambda k=key: cache.put(k, 16), InvalidRequest)
    for kw in ({"priority": 1.5}, {"priority": True}, {"ttl_s": 0}, {"ttl_s": -1},
               {"ttl_s": float("inf")}, {"ttl_s": "1"}):
        unchanged(pool, lambda kw=kw: cache.put("c", 16, **kw), InvalidRequest)
    unchanged(pool, lambda: cache.write("a", b"x" * 21), InvalidRequest)  # larger than the entry
    unchanged(pool, lambda: cache.evict("b"), Conflict)  # pinned entries are never evicted


def test_bad_policy_fit_strategy_tiers_device_names() -> None:
    pool, cache, _ = populated("paged")

    def set_policy():
        cache.policy = "mru"

    unchanged(pool, set_policy, InvalidRequest)
    assert cache.policy == "lru"
    with pytest.raises(InvalidRequest):
        KVCache(create_pool("paged", num_blocks=4, block_bytes=16), policy="random")
    for capacity in (0, -1, 65, 1.5, True):
        with pytest.raises(InvalidRequest):
            KVCache(create_pool("paged", num_blocks=4, block_bytes=16), capacity)
    with pytest.raises(InvalidRequest):
        create_pool("buddy", num_blocks=4, block_bytes=16)
    with pytest.raises(InvalidRequest):
        create_pool("contiguous", num_blocks=4, block_bytes=16, fit="random")
    with pytest.raises(InvalidRequest):
        ContiguousPool(4, 16, fit="last")
    for tiers in ([], "small", [{"name": "x"}], [{"name": "s", "units": 0, "share": 1}],
                  [{"name": "s", "units": 1, "share": 1}, {"name": "s", "units": 4, "share": 1}],
                  [{"name": "s", "units": 1, "share": 1.5}],
                  [{"name": "huge", "units": 128, "share": 1}]):
        with pytest.raises(InvalidRequest):
            create_pool("tiered", num_blocks=64, block_bytes=16, tiers=tiers)
    for device in ("tpu", "quantum:0", "", "mps"):
        with pytest.raises(InvalidRequest):
            create_pool("paged", num_blocks=4, block_bytes=16, device=device)
    for kw in ({"num_blocks": 0, "block_bytes": 16}, {"num_blocks": 4, "block_bytes": 0},
               {"num_blocks": 4.0, "block_bytes": 16}, {"num_blocks": True, "block_bytes": 16},
               {"num_blocks": 4, "capacity_bytes": 64, "block_bytes": 16}, {"num_blocks": 4},
               {"capacity_bytes": 8, "block_bytes": 16}, {"num_blocks": 4, "model": "gpt-9"}):
        with pytest.raises(InvalidRequest):
            create_pool("paged", **kw)
