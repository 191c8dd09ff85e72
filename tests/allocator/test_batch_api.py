"""allocate_many / free_many: the same result as one call per allocation, all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kvtest_util import pool_snapshot

from allocator import InvalidRequest, NotFound, OutOfMemory, create_pool
from allocator.vocab import STRATEGIES  # every strategy meets the same contract

sizes_st = st.lists(st.integers(1, 64 * 5), min_size=0, max_size=12)


def fresh(strategy: str):
    return create_pool(strategy, num_blocks=64, block_bytes=16, device="cpu")


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=60, deadline=None)
@given(first=sizes_st, second=sizes_st, free_mask=st.lists(st.booleans(), max_size=12))
def test_batch_calls_match_one_call_per_allocation(strategy, first, second, free_mask):
    batched, single = fresh(strategy), fresh(strategy)
    twin: dict[int, int] = {-1: -1}  # batched id -> the single-call pool's id for the same request
    for sizes in (first, second):
        try:
            ids = batched.allocate_many(sizes)
        except OutOfMemory:
            ids = None
        if ids is None:  # all or nothing: one call each must also run out within this batch
            done = []
            with pytest.raises(OutOfMemory):
                for n in sizes:
                    done.append(single.allocate(n))
            for aid in reversed(done):  # LIFO restores every free structure exactly
                single.free(aid)
        else:
            twin.update(zip(ids, (single.allocate(n) for n in sizes)))
            doomed = [aid for aid, f in zip(ids, free_mask) if f]
            batched.free_many(doomed)
            for aid in doomed:
                single.free(twin[aid])
        assert batched.check() == [] and single.check() == []
        assert [twin[o] for o in batched.blockmap.owner] == list(single.blockmap.owner)
        assert batched.stats()["requested_bytes"] == single.stats()["requested_bytes"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_refused_batch_changes_nothing(strategy):
    pool = fresh(strategy)
    keep = pool.allocate_many([100, 200])
    before = pool_snapshot(pool)
    counters, seq = pool.stats()["counters"], pool.events.last_seq
    with pytest.raises(OutOfMemory):
        pool.allocate_many([16, 16, 64 * 16])  # the last one cannot fit
    after = pool.stats()["counters"]
    assert (after["allocations"], after["frees"]) == (counters["allocations"], counters["frees"])
    assert pool.events.last_seq == seq + 1  # the OOM alone is logged, not the rolled-back work
    assert pool.events.after(seq)[0]["type"] == "oom"
    with pytest.raises(InvalidRequest):
        pool.allocate_many([16, 0])
    with pytest.raises(NotFound):
        pool.free_many([keep[0], 999])
    with pytest.raises(NotFound):
        pool.free_many([keep[0], keep[0]])  # a double free inside one batch
    assert pool_snapshot(pool) == before
    assert pool.check() == []


def test_batched_events_are_one_per_allocation_in_order():
    pool = fresh("paged")
    seq = pool.events.last_seq
    ids = pool.allocate_many([16, 48])
    pool.free_many(ids[::-1])
    events = pool.events.after(seq)
    assert [(e["type"], e["id"]) for e in events] == [
        ("allocate", ids[0]), ("allocate", ids[1]), ("free", ids[1]), ("free", ids[0])
    ]
    assert [e["seq"] for e in events] == list(range(seq + 1, seq + 5))
    assert events[1]["blocks"] == 3
