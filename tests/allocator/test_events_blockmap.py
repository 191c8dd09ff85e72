"""Event log ring semantics, eviction event fields, and block map change tracking."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kvtest_util import FakeClock

from allocator import CACHED, FREE, PINNED, USED, EventLog, KVCache, create_pool
from allocator.pools.blockmap import CHUNK


def test_event_ring_is_bounded_with_monotonic_seq() -> None:
    log = EventLog(capacity=4)
    seqs = [log.record("hit", f"k{i}") for i in range(10)]
    assert seqs == list(range(1, 11))
    assert len(log) == 4 and log.last_seq == 10
    assert [e["seq"] for e in log.after(0)] == [7, 8, 9, 10]  # older ones dropped, gap visible
    assert [e["seq"] for e in log.after(8)] == [9, 10]
    assert log.after(10) == [] and log.after(99) == []
    assert [e["seq"] for e in log.after(0, limit=2)] == [7, 8]
    assert log.after(9) == [{"seq": 10, "ts": log.after(9)[0]["ts"], "type": "hit", "key": "k9"}]
    log.record("miss", "x")
    assert [e["type"] for e in log.after(0, kinds={"miss"})] == ["miss"]
    assert all(a["ts"] <= b["ts"] for a, b in zip(log.after(0), log.after(0)[1:]))


def test_pool_events_in_order() -> None:
    pool = create_pool("paged", num_blocks=8, block_bytes=16, device="cpu")
    a = pool.allocate(20)
    pool.extend(a, 20)
    pool.free(a)
    pool.reset()
    events = pool.events.after(0)
    assert [e["type"] for e in events] == ["allocate", "extend", "free", "reset"]
    assert events[0] | {"ts": 0} == {"seq": 1, "ts": 0, "type": "allocate", "id": a,
                                     "requested_bytes": 20, "allocated_bytes": 32, "blocks": 2,
                                     "block_ids": [0, 1], "state": 1}
    assert events[1]["requested_bytes"] == 40 and events[1]["allocated_bytes"] == 48
    # Map-changing events name the rows they change, as plain lists, which the history replays.
    assert events[1]["block_ids"] == [2] and events[1]["freed_ids"] == [] and events[1]["added_bytes"] == 20
    assert events[2]["block_ids"] == [0, 1, 2] and events[2]["requested_bytes"] == 40


def test_eviction_events_carry_key_bytes_blocks_reason_policy_age_idle() -> None:
    clock = FakeClock(100.0)
    pool = create_pool("paged", num_blocks=16, block_bytes=16, device="cpu")
    cache = KVCache(pool, 8 * 16, "lru", clock=clock)
    cache.put("a", 40)  # 3 blocks at t=100
    clock.advance(5)
    cache.get("a")  # last access t=105
    cache.put("b", 48, ttl_s=1)  # 3 blocks, expires t=106
    clock.advance(2)  # t=107: b expired
    seq = pool.events.last_seq
    result = cache.put("c", 64)  # 4 blocks: 6 + 4 > 8, so b (expired) then nothing else
    assert result.evicted == ["b"]
    cache.put("d", 64)  # 3 + 4 + 4 > 8: a goes
    cache.evict("c")
    evicts = pool.events.after(seq, kinds={"evict"})
    for e in evicts:
        del e["ts"], e["seq"]
    assert evicts == [
        {"type": "evict", "key": "b", "bytes": 48, "blocks": 3, "reason": "ttl", "policy": "lru",
         "age_s": 2.0, "idle_s": 2.0},
        {"type": "evict", "key": "a", "bytes": 40, "blocks": 3, "reason": "capacity",
         "policy": "lru", "age_s": 7.0, "idle_s": 2.0},
        {"type": "evict", "key": "c", "bytes": 64, "blocks": 4, "reason": "manual",
         "policy": "lru", "age_s": 0.0, "idle_s": 0.0},
    ]
    assert cache.stats()["evictions"] == {"capacity": 1, "oom": 0, "ttl": 1, "manual": 1}
    assert pool.check() == [] and cache.check() == []


def test_changes_since_returns_exactly_the_chunks_touched() -> None:
    pool = create_pool("contiguous", num_blocks=500, block_bytes=1, device="cpu")
    bm = pool.blockmap
    a = pool.allocate(130)  # [0, 130): chunks 0-2
    b = pool.allocate(70)  # [130, 200): chunks 2-3
    pool.allocate(200)  # [200, 400): chunks 3-6
    since = bm.checkpoint()
    since, runs = bm.changes_since(since)
    assert runs == []
    pool.free(b)  # blocks 130-199: chunks 2 and 3
    since, runs = bm.changes_since(since)
    assert runs == [(2 * CHUNK, 2 * CHUNK)]
    assert bm.changes_since(since)[1] == []
    pool.allocate(71)  # too big for the hole: [400, 471), chunks 6-7 (7 is partial)
    pool.set_state(a, PINNED)  # chunks 0-2
    since, runs = bm.changes_since(since)
    assert runs == [(0, 3 * CHUNK), (6 * CHUNK, 500 - 6 * CHUNK)]
    # A second reader keeps its own position and sees everything since its checkpoint.
    other = bm.checkpoint()
    pool.free(a)
    assert bm.changes_since(other)[1] == [(0, 3 * CHUNK)]
    assert bm.changes_since(since)[1] == [(0, 3 * CHUNK)]
    pool.defragment()
    assert bm.changes_since(since)[1] == [(0, 500)]


def test_block_map_states_follow_the_cache() -> None:
    pool = create_pool("paged", num_blocks=8, block_bytes=16, device="cpu")
    cache = KVCache(pool, 64, clock=FakeClock())
    raw = pool.allocate(16)
    cache.put("a", 16)
    cache.put("p", 16, pinned=True)
    states = pool.blockmap.state
    assert [states[b] for b in pool.block_ids(raw)] == [USED]
    assert [states[b] for b in pool.block_ids(cache.peek("a").id)] == [CACHED]
    assert [states[b] for b in pool.block_ids(cache.peek("p").id)] == [PINNED]
    assert list(states).count(FREE) == 5


@settings(deadline=None)
@given(st.lists(st.integers(0, 4), max_size=200))
def test_map_summary_matches_numpy(states):
    """The compiled one-pass summary history replays use for stats: owner count, state counts
    and free runs, as numpy derives them from the same map."""
    from allocator._core import map_summary

    state = np.array(states, dtype=np.uint8)
    owner = np.where(state == 0, -1, np.arange(state.size) // 3).astype(np.int32)
    used, counts, runs = map_summary(owner, state)
    assert used == int((owner != -1).sum())
    assert counts[:5].tolist() == np.bincount(state, minlength=5)[:5].tolist()
    free = np.concatenate(([0], (state == 0).astype(np.int8), [0]))
    edges = np.diff(free)
    assert runs.tolist() == (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist()
