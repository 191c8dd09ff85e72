"""The public boundary: every method that takes an id, a size, an index or a count from outside
validates it before any unchecked compiled code runs.

Raw ints (negative, huge, ids of freed allocations, off-by-one indices) go into each such
method; each call either succeeds or raises the documented typed error, and the pool is then
unchanged and sound. Without the validation, the compiled core (built without bounds checks)
would read or write out of bounds: a crash or a corrupted pool, which check() would name.
See docs/ALLOCATOR.md, "The compiled core's boundary".
"""

from __future__ import annotations

import pytest
from allocator._core import FreeStack, LinkedList, RefCounts
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kvtest_util import pool_snapshot

from allocator import (
    BlockMap,
    EventLog,
    InvalidRequest,
    KVCache,
    NotFound,
    OutOfMemory,
    create_pool,
)

N = 32
BB = 64
EDGES = [0, -1, 1, N - 1, N, N + 1, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63), 2**64, -(2**70)]
raw_ints = st.one_of(st.sampled_from(EDGES), st.integers(-(2**40), 2**40), st.integers(-3, N + 3))
ID_ERRORS = (NotFound,)
SIZE_ERRORS = (InvalidRequest, OutOfMemory)


def populated(strategy: str, **kw):
    pool = create_pool(strategy, num_blocks=N, block_bytes=BB, device="cpu", **kw)
    ids = [pool.allocate(n) for n in (10, 3 * BB, 70, BB)]
    pool.free(ids[1])  # a freed id: must read as unknown forever
    return pool, ids


def free_bytes(pool) -> int:
    return (pool.num_blocks - pool.used_blocks) * BB


def refused_unchanged(pool, call, errors) -> None:
    """`call` raises one of `errors` and leaves the pool exactly as it was, and sound."""
    before = pool_snapshot(pool)
    with pytest.raises(errors):
        call()
    assert pool_snapshot(pool) == before
    assert pool.check() == []


STRATEGIES = ["paged", "contiguous", "tiered"]


@pytest.mark.parametrize("strategy", [*STRATEGIES, "prefix"])
@settings(max_examples=60)
@given(aid=raw_ints)
def test_ids_from_outside_are_checked_before_use(strategy, aid):
    kw = {"tokens_per_block": 4, "prefix_caching": {"policy": "lru"}} if strategy == "prefix" else {}
    pool, ids = populated("paged" if strategy == "prefix" else strategy, **kw)
    live = aid in ids and aid != ids[1]
    if live:
        return  # the live ids are the other tests' business
    for call in (lambda: pool.free(aid), lambda: pool.block_ids(aid), lambda: pool.allocation(aid),
                 lambda: pool.held_bytes(aid), lambda: pool.extend(aid, BB), lambda: pool.truncate(aid, 1),
                 lambda: pool.read(aid), lambda: pool.write(aid, b"x"), lambda: pool.set_state(aid, 2),
                 lambda: pool.free_many([ids[0], aid]), lambda: pool.growth_bytes(aid, 1)):
        refused_unchanged(pool, call, ID_ERRORS)
    assert aid not in pool


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=60)
@given(n=raw_ints)
def test_sizes_from_outside_are_checked_before_use(strategy, n):
    pool, ids = populated(strategy)
    aid = ids[0]
    fits = 0 < n <= free_bytes(pool)
    for call in (lambda: pool.allocate(n), lambda: pool.allocate_many([BB, n])):
        if fits and n + BB <= free_bytes(pool):
            continue
        if not fits:
            refused_unchanged(pool, call, SIZE_ERRORS)
    if not 0 < n:
        refused_unchanged(pool, lambda: pool.extend(aid, n), SIZE_ERRORS)
    if not 0 < n <= pool._record(aid)[0]:
        refused_unchanged(pool, lambda: pool.truncate(aid, n), SIZE_ERRORS)
    else:
        pool.truncate(aid, n)
        assert pool.check() == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@given(state=raw_ints)
def test_block_states_from_outside_are_checked(strategy, state):
    pool, ids = populated(strategy)
    if state in (1, 2, 3):
        pool.set_state(ids[0], state)
        assert pool.check() == []
        return
    refused_unchanged(pool, lambda: pool.set_state(ids[0], state), InvalidRequest)
    refused_unchanged(pool, lambda: pool.allocate(BB, state), InvalidRequest)


@settings(max_examples=60)
@given(key_bytes=raw_ints, seq_id=raw_ints, block=raw_ints, limit=raw_ints)
def test_cache_and_prefix_arguments_from_outside(key_bytes, seq_id, block, limit):
    pool, _ = populated("paged")
    cache = KVCache(pool, 8 * BB)
    cache.put("a", BB)
    if not 0 < key_bytes <= 8 * BB:
        with pytest.raises(InvalidRequest):
            cache.put("b", key_bytes)
    assert cache.check() == [] and pool.check() == []

    prefix = create_pool("paged", num_blocks=N, block_bytes=BB, device="cpu", tokens_per_block=4,
                         prefix_caching={"policy": "lru"})
    sid = prefix.open_sequence(tokens=list(range(9))).id
    if seq_id != sid:
        for call in (lambda: prefix.close_sequence(seq_id), lambda: prefix.append(seq_id, tokens=[1]),
                     lambda: prefix.set_next_use(seq_id, [1.0, 2.0, 3.0])):
            with pytest.raises(NotFound):
                call()
    if not 0 <= block < N:
        with pytest.raises(NotFound):
            prefix.block_info(block)
    else:
        assert prefix.block_info(block)["block"] == block
    assert isinstance(prefix.eviction_order(limit if limit < 2**62 else None), list)
    assert prefix.check() == []


@given(i=raw_ints, j=raw_ints)
def test_compiled_primitives_refuse_indices_outside_them(i, j):
    outside = (IndexError, ValueError, OverflowError)
    stack = FreeStack(N, full=True)
    for call in (lambda: stack.pop_many(i), lambda: stack.refill(i), lambda: stack.push(i)):
        try:
            call()
        except outside:
            pass
    assert 0 <= len(stack) <= N
    links = LinkedList(N)
    links.push_back(3)
    for call in (lambda: links.push_back(i), lambda: links.remove(i), lambda: links.move_to_back(i)):
        try:
            call()
        except outside:
            pass
    assert links.check() == []
    refs = RefCounts(N)
    for call in (lambda: refs.incr(i), lambda: refs.decr(i), lambda: refs[i]):
        try:
            call()
        except outside:
            pass
    bm = BlockMap(N)
    for call in (lambda: bm.assign([i], 1, 1), lambda: bm.assign_range(i, j, 1, 1),
                 lambda: bm.set_state([i], 1)):
        try:
            call()
        except outside:
            pass
    ring = EventLog(8)
    ring.record("oom", 1, 2, 3, "capacity")
    try:
        ring.record("state", 1, 1, None, block_ids=[i])
    except outside:
        pass
    try:
        events = ring.after(i, j)
    except OverflowError:
        events = []
    assert isinstance(events, list) and ring.check() == []
