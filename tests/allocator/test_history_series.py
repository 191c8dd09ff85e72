"""History series: every sampled point equals the live stats captured at that event, and the
event counts between points equal the events the pool recorded there."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator import KVCache, OutOfMemory, OutsideHistory, create_pool
from allocator.errors import InvalidRequest
from allocator.history import History
from allocator.history.series import FIELDS, MAX_POINTS, STATS_FIELDS, history_series, sample_seqs

BLOCK = 16


def run_pool(strategy: str, seed: int, steps: int):
    """A pool with a cache, driven by random ops; returns it, the live stats and the event
    (seq, ts, type) after each op."""
    pool = create_pool(strategy, num_blocks=96, block_bytes=BLOCK, device="cpu", event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=12)  # several keyframes, crossed
    cache = KVCache(pool, 48 * BLOCK, "lru")
    rng = random.Random(seed)
    ids: list[int] = []
    live = {pool.events.last_seq: pool.stats()}
    for _ in range(steps):
        r = rng.random()
        try:
            if r < 0.35:
                ids.append(pool.allocate(rng.randint(1, 6 * BLOCK)))
            elif r < 0.6 and ids:
                pool.free(ids.pop(rng.randrange(len(ids))))
            elif r < 0.85:
                cache.put(f"k{rng.randrange(12)}", rng.randint(1, 8 * BLOCK))  # evicts when full
            elif r < 0.95:
                cache.get(f"k{rng.randrange(16)}")  # hit or miss
            else:
                pool.defragment()
        except OutOfMemory:
            pass
        live[pool.events.last_seq] = pool.stats()
    return pool, live


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(["paged", "contiguous", "tiered"]), seed=st.integers(0, 10_000),
       points=st.integers(1, 40), cut=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_each_point_equals_the_live_stats_then_and_counts_the_events_between(strategy, seed, points, cut):
    pool, live = run_pool(strategy, seed, 60)
    view = pool.history.view()
    first, last = view.first_seq, view.last_seq
    lo, hi = sorted(first + round(c * (last - first)) for c in cut)
    out = history_series(view, lo, hi, points)
    cols = out["columns"]
    assert set(cols) == set(FIELDS) and cols["seq"] == sample_seqs(lo, hi, points)
    events = {e["seq"]: e for e in view.events(first, 100_000)}
    prev = None
    for i, seq in enumerate(cols["seq"]):
        # a point is the pool right after the last op that ended at or before its seq
        at = max(s for s in live if s <= seq)
        if at == seq:  # an op ends here: the live stats of that moment are known exactly
            want = live[seq]
            for name in STATS_FIELDS:
                assert cols[name][i] == want[name], (name, seq)
            assert cols["ooms_capacity"][i] == want["ooms"]["capacity"]
            assert cols["ooms_fragmentation"][i] == want["ooms"]["fragmentation"]
            # the cache's lifetime hit rate, once a keyframe holds the cache's figures
            if cols["cache_hit_rate"][i] is not None:
                assert cols["cache_hit_rate"][i] == want["cache"]["hit_rate"], seq
        assert cols["utilization"][i] == view.stats_at(seq)["utilization"]
        assert cols["ts"][i] == (events[seq]["ts"] if seq in events else None)
        between = [] if prev is None else [events[s]["type"] for s in range(prev + 1, seq + 1)]
        assert cols["evictions"][i] == between.count("evict")
        assert cols["hits"][i] == between.count("hit") and cols["misses"][i] == between.count("miss")
        cached = any(k.cache is not None and k.seq <= seq for k in view.keyframes)
        assert (cols["cache_hit_rate"][i] is not None) == cached, seq
        prev = seq


def test_sample_seqs_are_even_increasing_and_keep_both_ends():
    assert sample_seqs(5, 9, 10) == [5, 6, 7, 8, 9]
    assert sample_seqs(0, 100, 5) == [0, 25, 50, 75, 100]
    assert sample_seqs(3, 3, 4) == [3]
    assert sample_seqs(0, 100, 1) == [100]
    s = sample_seqs(10, 10_009, 7)
    assert s[0] == 10 and s[-1] == 10_009 and all(b > a for a, b in zip(s, s[1:]))


def test_bad_ranges_are_refused_with_what_to_fix():
    pool, _ = run_pool("paged", 1, 10)
    view = pool.history.view()
    with pytest.raises(OutsideHistory, match="outside the history"):
        history_series(view, 0, view.last_seq + 1)
    with pytest.raises(InvalidRequest, match="after to_seq"):
        history_series(view, view.last_seq, 0)
    with pytest.raises(InvalidRequest, match=f"1..{MAX_POINTS}"):
        history_series(view, 0, view.last_seq, MAX_POINTS + 1)
