"""History replay: the map and stats rebuilt at any past event equal what the live pool showed.

A stateful machine drives random allocate / allocate_many (all or nothing, so OOM rollbacks) /
extend / truncate / free / defragment / reset and cache put / pin / evict on every strategy,
with a tiny event ring and frequent keyframes so that spills, keyframes and rollbacks happen
inside short runs. After every step it captures the live map (owner and state arrays) and
stats at the current event seq; at the end, and every few steps, every captured point is
rebuilt from the history and compared exactly. The reference is the live pool itself, whose
own invariants `check()` verifies after each step.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from allocator import KVCache, NotFound, OutOfMemory, OutsideHistory, create_pool
from allocator.history import History, Replayer, map_runs
from allocator.history.keyframes import PAGE_BLOCKS, unique_bytes
from allocator.pools.blockmap import CACHED, PINNED, USED

BLOCK = 16
UNITS = 96
SETTINGS = settings(
    max_examples=int(os.environ.get("KVSCOPE_TEST_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# The live stats the history rebuilds: the cache's figures apart (they are rebuilt from the first
# keyframe taken with the cache on; `refusals` records no event and is not kept).
COMPARED = lambda stats: {k: v for k, v in stats.items() if k != "cache"}  # noqa: E731
CACHE_COMPARED = lambda cache: {k: v for k, v in cache.items() if k != "refusals"}  # noqa: E731


def make_pool(strategy: str, fit: str = "first"):
    pool = create_pool(strategy, num_blocks=UNITS, block_bytes=BLOCK, device="cpu",
                       fit=fit if strategy == "contiguous" else None, event_capacity=8)
    # Small keyframe interval: several keyframes (and replays that start mid-history) per run.
    # Pages of 16 blocks: keyframes share the pages of chunks (64 blocks) nothing touched.
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=12, page_blocks=16)
    return pool


class ReplayMachine(RuleBasedStateMachine):
    strategy = "paged"
    fit = "first"

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.strategy, self.fit)
        self.cache = None
        self.ids: list[int] = []
        self.keys: list[str] = []
        self.captured: dict[int, tuple] = {}
        self.steps = 0

    def _cache(self) -> KVCache:
        if self.cache is None:
            self.cache = KVCache(self.pool, UNITS * BLOCK // 2, "lru")
        return self.cache

    @rule(size=st.integers(1, 6 * BLOCK), state=st.sampled_from([USED, CACHED, PINNED]))
    def allocate(self, size: int, state: int) -> None:
        try:
            self.ids.append(self.pool.allocate(size, state))
        except OutOfMemory:
            pass

    @rule(sizes=st.lists(st.integers(1, 10 * BLOCK), min_size=1, max_size=12))
    def allocate_many(self, sizes: list[int]) -> None:
        try:
            self.ids += self.pool.allocate_many(sizes)
        except OutOfMemory:
            pass

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 1000), extra=st.integers(1, 5 * BLOCK))
    def extend(self, i: int, extra: int) -> None:
        try:
            self.pool.extend(self.ids[i % len(self.ids)], extra)
        except OutOfMemory:
            pass

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 1000), frac=st.floats(0.05, 1.0))
    def truncate(self, i: int, frac: float) -> None:
        aid = self.ids[i % len(self.ids)]
        rec = self.pool._allocs[aid]
        self.pool.truncate(aid, max(1, int(rec[0] * frac)))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 1000))
    def free(self, i: int) -> None:
        self.pool.free(self.ids.pop(i % len(self.ids)))

    @precondition(lambda self: len(self.ids) > 2)
    @rule(n=st.integers(2, 6))
    def free_many(self, n: int) -> None:
        take, self.ids = self.ids[:n], self.ids[n:]
        self.pool.free_many(take)

    @rule()
    def defragment(self) -> None:
        self.pool.defragment()

    @rule()
    def reset(self) -> None:
        self.pool.reset()
        self.ids.clear()
        self.keys.clear()

    @rule(k=st.integers(0, 12), size=st.integers(1, 8 * BLOCK), pinned=st.booleans())
    def put(self, k: int, size: int, pinned: bool) -> None:
        cache = self._cache()
        try:
            cache.put(f"k{k}", size, pinned=pinned or None)
        except (OutOfMemory, Exception) as exc:  # budget refusals are InvalidRequest/OOM
            if not isinstance(exc, (OutOfMemory, ValueError)):
                raise
        self._sync_keys()

    @rule(k=st.integers(0, 12), pinned=st.booleans())
    def pin(self, k: int, pinned: bool) -> None:
        if self.cache is not None and f"k{k}" in self.cache:
            self.cache.pin(f"k{k}", pinned)

    @rule(k=st.integers(0, 14))
    def get(self, k: int) -> None:
        if self.cache is not None:
            self.cache.get(f"k{k}")  # a hit or a miss (k13, k14 never exist)

    @rule(policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]))
    def switch_policy(self, policy: str) -> None:
        if self.cache is not None:
            self.cache.policy = policy

    @rule(k=st.integers(0, 12))
    def evict(self, k: int) -> None:
        if self.cache is not None and f"k{k}" in self.cache:
            try:
                self.cache.evict(f"k{k}")
            except Exception as exc:  # pinned entries refuse
                if "pinned" not in str(exc):
                    raise
        self._sync_keys()

    def _sync_keys(self) -> None:
        # Entries' allocations belong to the cache: raw-op rules must not free them.
        cached = {e.id for e in self.cache.entries()} if self.cache is not None else set()
        self.ids = [a for a in self.ids if a in self.pool and a not in cached]

    @invariant()
    def capture_and_compare(self) -> None:
        assert self.pool.check() == []
        seq = self.pool.events.last_seq
        bm = self.pool.blockmap
        stats = self.pool.stats()
        self.captured[seq] = (bm.owners_np().copy(), bm.states_np().copy(), COMPARED(stats),
                              CACHE_COMPARED(stats["cache"]) if "cache" in stats else None)
        self.steps += 1
        if self.steps % 10 == 0:
            self.compare_all()

    def compare_all(self) -> None:
        view = self.pool.history.view()
        assert view.last_seq == self.pool.events.last_seq
        cached_since = min((k.seq for k in view.keyframes if k.cache is not None), default=None)
        for seq, (owner, state, stats, cache) in self.captured.items():
            rep = view.replay_to(seq)
            assert np.array_equal(rep.owner, owner), f"owner differs at seq {seq}"
            assert np.array_equal(rep.state, state), f"state differs at seq {seq}"
            assert map_runs(rep.owner, rep.state) == map_runs(owner, state)
            rebuilt = view.stats_at(seq)
            assert COMPARED(rebuilt) == stats, f"stats differ at seq {seq}"
            # The cache's figures: exact wherever a keyframe with the cache precedes the point.
            if cached_since is not None and seq >= cached_since and seq >= view.first_seq:
                assert rebuilt.get("cache") == cache, f"cache figures differ at seq {seq}"
            # The vectorised replay agrees with the plain one, row by row from the keyframe.
            kf = max((k for k in view.keyframes if k.seq <= seq), key=lambda k: k.seq)
            ref = Replayer(kf)
            for row in view.rows(kf.seq, seq):
                ref.apply(row)
            assert np.array_equal(ref.owner, owner) and np.array_equal(ref.state, state)

    def teardown(self) -> None:
        self.compare_all()
        view = self.pool.history.view()
        with pytest.raises(OutsideHistory):
            view.replay_to(view.last_seq + 1)


class PagedReplay(ReplayMachine):
    strategy = "paged"


class ContiguousFirstReplay(ReplayMachine):
    strategy = "contiguous"


class ContiguousBestReplay(ReplayMachine):
    strategy = "contiguous"
    fit = "best"


class TieredReplay(ReplayMachine):
    strategy = "tiered"


TestPagedReplay = PagedReplay.TestCase
TestContiguousFirstReplay = ContiguousFirstReplay.TestCase
TestContiguousBestReplay = ContiguousBestReplay.TestCase
TestTieredReplay = TieredReplay.TestCase
for case in (TestPagedReplay, TestContiguousFirstReplay, TestContiguousBestReplay, TestTieredReplay):
    case.settings = SETTINGS


def test_budget_drops_oldest_first_and_says_so() -> None:
    pool = create_pool("paged", num_blocks=64, block_bytes=BLOCK, device="cpu", event_capacity=16)
    pool.history = History(pool, max_bytes=20_000, keyframe_every=32)
    live = {}
    for i in range(3000):
        aid = pool.allocate(1 + i % 40)
        live[pool.events.last_seq] = pool.blockmap.owners_np().copy()
        pool.free(aid)
    h = pool.history
    assert h.nbytes <= h.max_bytes and h.dropped_events > 0 and h.first_seq == h.dropped_events
    view = h.view()
    with pytest.raises(OutsideHistory, match="dropped"):
        view.replay_to(h.first_seq - 1)
    for seq in range(h.first_seq, view.last_seq + 1, 7):
        if seq in live:
            assert np.array_equal(view.replay_to(seq).owner, live[seq])


def test_keyframes_share_unchanged_pages_and_replay_exactly() -> None:
    """A pool whose activity stays in a few chunks: later keyframes reuse the untouched pages
    (the same bytes object), the budget counts each page once, and every point replays."""
    pool = create_pool("paged", num_blocks=4096, block_bytes=BLOCK, device="cpu", event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=16, page_blocks=256)
    rng = random.Random(3)
    live, ids = {}, []
    far = pool.allocate(BLOCK * 3000)  # pushes later allocations past the first pages
    for _ in range(600):
        if ids and rng.random() < 0.5:
            pool.free(ids.pop(rng.randrange(len(ids))))
        else:
            ids.append(pool.allocate(BLOCK * rng.randint(1, 12)))
        if rng.random() < 0.01:
            pool.free(far)
            far = pool.allocate(BLOCK * 3000)
        live[pool.events.last_seq] = (pool.blockmap.owners_np().copy(), pool.blockmap.states_np().copy())
    h = pool.history
    kfs = h.keyframes
    shared = sum(p is q for a, b in zip(kfs, kfs[1:]) for p, q in zip(a.owner_pages, b.owner_pages))
    assert len(kfs) > 10 and shared > len(kfs)  # most pages are shared between neighbours
    unique = {id(p): len(p) for kf in kfs for p in kf.owner_pages + kf.state_pages}
    assert sum(kf.own_bytes for kf in kfs) == sum(unique.values())
    # A new pool's keyframe: every full page is the same bytes, compressed once.
    fresh = create_pool("paged", num_blocks=3 * PAGE_BLOCKS + 5, block_bytes=BLOCK, device="cpu", history=True)
    first = fresh.history.keyframes[0]
    assert len(first.owner_pages) == 4 and len({id(p) for p in first.owner_pages}) == 2
    assert first.own_bytes == unique_bytes(first.owner_pages + first.state_pages)
    view = h.view()
    for seq, (owner, state) in live.items():
        rep = view.replay_to(seq)
        assert np.array_equal(rep.owner, owner) and np.array_equal(rep.state, state), seq
    # Dropping the oldest keyframes hands their shared pages to the next: still counted once.
    h.max_bytes = h.nbytes // 2
    h._trim()
    unique = {id(p): len(p) for kf in h.keyframes for p in kf.owner_pages + kf.state_pages}
    assert sum(kf.own_bytes for kf in h.keyframes) == sum(unique.values())
    view = h.view()
    for seq in range(view.first_seq, view.last_seq + 1):
        if seq in live:
            assert np.array_equal(view.replay_to(seq).owner, live[seq][0])


def test_rollback_of_a_batch_past_a_spill_leaves_no_trace() -> None:
    pool = create_pool("contiguous", num_blocks=40, block_bytes=BLOCK, device="cpu", event_capacity=4)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=4)
    a = pool.allocate(BLOCK * 3)
    before = pool.blockmap.owners_np().copy()
    seq = pool.events.last_seq
    with pytest.raises(OutOfMemory):  # 8 allocations spill mid-batch, then the 9th fails
        pool.allocate_many([BLOCK * 4] * 8 + [BLOCK * 40])
    view = pool.history.view()
    assert [e["type"] for e in view.events(seq)] == ["oom"]
    assert np.array_equal(view.replay_to(seq).owner, before)
    pool.free(a)
    assert pool.history.view().stats_at(pool.events.last_seq)["used_blocks"] == 0
    with pytest.raises(NotFound):
        pool.history.view().replay_to(-1)


def test_mirror_pool_prefix_events_replay_exactly() -> None:
    from allocator import MirrorPool

    pool = MirrorPool(48, event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=10)
    rng = random.Random(5)
    live, cached = {}, []
    for _ in range(200):
        r = rng.random()
        if r < 0.55:
            parent = rng.choice(cached) if cached and rng.random() < 0.6 else None
            hashes = [rng.getrandbits(64) for _ in range(rng.randint(1, 6))]
            pool.store(hashes, parent)
            cached += hashes
        elif r < 0.95 and cached:
            gone = rng.sample(cached, min(len(cached), rng.randint(1, 5)))
            pool.remove(gone)
            cached = [h for h in cached if h not in gone]
        else:
            pool.reset()
            cached = []
        live[pool.events.last_seq] = (pool.blockmap.owners_np().copy(), pool.blockmap.states_np().copy())
    view = pool.history.view()
    for seq, (owner, state) in live.items():
        rep = view.replay_to(seq)
        assert np.array_equal(rep.owner, owner) and np.array_equal(rep.state, state), seq


@pytest.mark.parametrize("strategy", ["paged", "tiered", "contiguous"])
def test_cache_figures_at_past_points(strategy, tmp_path) -> None:
    """The past stats' `cache` section (all but refusals) equals what the live cache said, at
    every point from the first keyframe that saw the cache, through hits, misses, evictions,
    pins, policy switches, raw allocations in CACHED state and a recording of it all."""
    from allocator.history.recording import Recorder, read_recording

    pool = create_pool(strategy, num_blocks=UNITS, block_bytes=BLOCK, device="cpu",
                       fit="first" if strategy == "contiguous" else None, event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=12, page_blocks=16)
    cache = KVCache(pool, UNITS * BLOCK // 2, "lru")
    rec = Recorder(pool, tmp_path / "c.kvrec")
    rng = random.Random(11)
    live = {}
    for i in range(400):
        r = rng.random()
        try:
            if r < 0.45:
                cache.put(f"k{rng.randrange(14)}", rng.randint(1, 6 * BLOCK))
            elif r < 0.7:
                cache.get(f"k{rng.randrange(16)}")
            elif r < 0.78 and len(cache):
                key = rng.choice([e.key for e in cache.entries()])
                cache.pin(key, not cache.peek(key).pinned)
            elif r < 0.82:
                cache.policy = rng.choice(["lru", "fifo", "lfu", "s3fifo"])
            elif r < 0.9:
                pool.free(pool.allocate(BLOCK, rng.choice([1, 2])))  # raw, even in CACHED state
            elif len(cache):
                key = rng.choice([e.key for e in cache.entries()])
                if not cache.peek(key).pinned:
                    cache.evict(key)
        except OutOfMemory:
            pass
        if i % 50 == 49:
            rec.flush()
        figures = dict(pool.stats()["cache"])
        figures.pop("refusals")
        live[pool.events.last_seq] = figures
    rec.stop()
    assert sum(cache.evictions.values()) > 0 and cache.hits > 0 and cache.misses > 0
    _, recorded = read_recording(tmp_path / "c.kvrec")
    for view in (pool.history.view(), recorded):
        since = min(k.seq for k in view.keyframes if k.cache is not None)
        compared = 0
        for seq, figures in live.items():
            if seq >= max(since, view.first_seq):
                assert view.stats_at(seq)["cache"] == figures, seq
                compared += 1
        assert compared > 300
