"""History as a pool extension: a pool made from Python keeps none unless asked; one attached
at any moment keeps the pool's events from then on and replays them exactly; detached, the
pool's ring drops its oldest events again as it does without one."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import History, InvalidRequest, KVCache, OutOfMemory, OutsideHistory, create_pool
from allocator.history import DEFAULT_HISTORY_BYTES, map_runs
from allocator.pools.spec import PoolSpec

BLOCK = 32


def churn(pool, rng: random.Random, steps: int, ids: list, captured: dict | None = None) -> None:
    for _ in range(steps):
        try:
            if rng.random() < 0.55 or not ids:
                ids.append(pool.allocate(rng.randint(1, 6 * BLOCK)))
            else:
                pool.free(ids.pop(rng.randrange(len(ids))))
        except OutOfMemory:
            pass
        if captured is not None:
            bm = pool.blockmap
            captured[pool.events.last_seq] = (map_runs(bm.owners_np(), bm.states_np()), pool.stats())


def test_a_pool_made_from_python_keeps_no_history_unless_asked() -> None:
    pool = create_pool("paged", num_blocks=32, block_bytes=BLOCK, device="cpu", event_capacity=8)
    assert pool.history is None and "history" not in pool.extensions and pool.events.sink is None
    for _ in range(50):  # the ring alone: it keeps its newest events and drops the rest
        pool.free(pool.allocate(BLOCK))
    assert len(pool.events) == 8 and pool.events.last_seq == 100
    assert "history" not in pool.stats()
    kept = create_pool("paged", num_blocks=32, block_bytes=BLOCK, device="cpu", history=True)
    assert isinstance(kept.history, History) and kept.history.max_bytes == DEFAULT_HISTORY_BYTES
    assert kept.extensions["history"] is kept.history and kept.events.sink is kept.history
    assert "history" not in kept.stats()  # its own figures are GET .../history, not the stats
    sized = create_pool("tiered", num_blocks=64, block_bytes=BLOCK, device="cpu", history_bytes=1 << 20)
    assert sized.history.max_bytes == 1 << 20
    assert create_pool("paged", num_blocks=8, block_bytes=BLOCK, device="cpu", history_bytes=0).history is None


@pytest.mark.parametrize("bad", [{"history": "yes"}, {"history": 1}, {"history_bytes": -5},
                                 {"history_bytes": 2.5}, {"history_bytes": True, "history": True}])
def test_bad_history_options_are_refused(bad) -> None:
    with pytest.raises(InvalidRequest):
        PoolSpec.parse("paged", num_blocks=8, block_bytes=BLOCK, **bad)


def test_the_first_keyframe_of_a_pool_created_with_a_cache_holds_the_cache() -> None:
    pool = create_pool("paged", num_blocks=32, block_bytes=BLOCK, device="cpu", history=True,
                       cache={"policy": "fifo"})
    pool.cache.put("a", 3 * BLOCK)
    view = pool.history.view()
    assert view.keyframes[0].cache is not None
    assert view.stats_at(view.first_seq)["cache"]["policy"] == "fifo"
    assert view.stats_at(view.last_seq)["cache"]["entries"] == 1


@pytest.mark.parametrize("strategy", ["paged", "contiguous", "tiered"])
def test_a_history_attached_mid_life_replays_every_point_since(strategy) -> None:
    pool = create_pool(strategy, num_blocks=128, block_bytes=BLOCK, device="cpu", event_capacity=16)
    rng, ids = random.Random(5), []
    churn(pool, rng, 60, ids)  # before the history: not in it
    KVCache(pool, 32 * BLOCK, "lru").put("k", 2 * BLOCK)
    start = pool.events.last_seq
    live_before = (map_runs(pool.blockmap.owners_np(), pool.blockmap.states_np()), pool.stats())
    history = History(pool, max_bytes=1 << 26, keyframe_every=20)
    assert pool.history is history and history.first_seq == start
    captured = {start: live_before}
    churn(pool, rng, 150, ids, captured)
    view = history.view()
    assert view.first_seq == start and view.last_seq == pool.events.last_seq
    for seq, (runs, stats) in captured.items():
        rep = view.replay_to(seq)
        assert map_runs(rep.owner, rep.state) == runs, seq
        rebuilt = view.stats_at(seq)
        assert {k: v for k, v in rebuilt.items() if k != "cache"} == {k: v for k, v in stats.items() if k != "cache"}
        assert rebuilt["cache"]["entries"] == stats["cache"]["entries"]
    with pytest.raises(OutsideHistory):
        view.replay_to(start - 1)


def test_detached_the_pool_runs_on_without_one_and_a_new_one_starts_afresh() -> None:
    pool = create_pool("paged", num_blocks=64, block_bytes=BLOCK, device="cpu", event_capacity=8, history=True)
    rng, ids = random.Random(2), []
    churn(pool, rng, 40, ids)
    old, detached_at = pool.history, pool.events.last_seq
    then = pool.blockmap.owners_np().copy()
    pool.history = None
    assert pool.history is None and pool.events.sink is None and "history" not in pool.extensions
    churn(pool, rng, 40, ids)  # the ring wraps with nothing to drain it
    assert pool.check() == [] and len(pool.events) == 8
    # The detached one stays readable as it was when detached, whole.
    view = old.view()
    assert view.last_seq == old.info()["last_seq"] == detached_at and not view.tail
    assert np.array_equal(view.replay_to(detached_at).owner, then)
    assert [e["seq"] for e in view.events(limit=1000)] == list(range(view.first_seq + 1, detached_at + 1))
    new = History(pool, max_bytes=1 << 24)
    assert new.first_seq == pool.events.last_seq
    churn(pool, rng, 40, ids)
    assert np.array_equal(new.view().replay_to(pool.events.last_seq).owner, pool.blockmap.owners_np())
    again = History(pool, max_bytes=1 << 24)  # a second one replaces the first, which stops
    assert pool.history is again and pool.events.sink is again and not new.attached
    assert new.view().last_seq == again.first_seq


@settings(max_examples=25, deadline=None)
@given(before=st.integers(0, 60), after=st.integers(1, 60), seed=st.integers(0, 1000))
def test_attached_at_any_moment_the_last_point_replays_exactly(before: int, after: int, seed: int) -> None:
    pool = create_pool("paged", num_blocks=48, block_bytes=BLOCK, device="cpu", event_capacity=8)
    rng, ids = random.Random(seed), []
    churn(pool, rng, before, ids)
    history = History(pool, max_bytes=1 << 24, keyframe_every=8)
    churn(pool, rng, after, ids)
    view = history.view()
    assert view.last_seq == pool.events.last_seq
    rep = view.replay_to(view.last_seq)
    assert np.array_equal(rep.owner, pool.blockmap.owners_np())
    assert np.array_equal(rep.state, pool.blockmap.states_np())
    assert view.stats_at(view.last_seq) == pool.stats()
