"""History replay of prefix-caching pools: the map and stats rebuilt at any past event equal what
the live pool showed.

A stateful machine opens sequences over a few shared system prompts (so hits on idle and on held
blocks happen), by token ids, by block hashes or by a bare token count, appends to them, closes
them, evicts under memory pressure (a pool of 14 blocks), resets the prefix cache and the pool,
and makes plain allocations (allocate, all-or-nothing allocate_many, extend, truncate, free),
on every eviction policy. The event ring holds 8 events and keyframes come every 12, so spills
and keyframes fall between an operation's events. After every step `check()` passes and the live
map (owner + state), its runs and the stats are captured; every few steps and at the end each
captured point is rebuilt from the history (vectorised, and row by row) and compared exactly.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from allocator import Conflict, KVCache, NotFound, OutOfMemory, create_pool
from allocator.history import History, Replayer, map_runs
from allocator.pools.blockmap import PINNED, USED
from allocator.pools.events import PACKED_FIELDS, PACKED_KINDS, event_dict, packed_list
from allocator.vocab import EVENT_FIELDS

BS = 4
BLOCKS = 14
BLOCK_BYTES = 30  # not a multiple of BS: the requested bytes' rounding must replay exactly
SYSTEM = [[], [7, 7, 7, 7], [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9]]
SETTINGS = settings(
    max_examples=int(os.environ.get("KVSCOPE_TEST_EXAMPLES", "40")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
prompts = st.builds(lambda sys, tail: sys + tail, st.sampled_from(SYSTEM),
                    st.lists(st.integers(0, 3), max_size=14))
# The prefix section (hit counts, block-time histograms) is the core's own, not replayed.
COMPARED = lambda stats: {k: v for k, v in stats.items() if k != "prefix"}  # noqa: E731


def make_pool(policy: str):
    pool = create_pool("paged", num_blocks=BLOCKS, block_bytes=BLOCK_BYTES, tokens_per_block=BS,
                       device="cpu", prefix_caching={"policy": policy}, event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 30, keyframe_every=12)
    return pool


class PrefixReplay(RuleBasedStateMachine):
    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.policy)
        self.seqs: list[int] = []
        self.ids: list[int] = []
        self.captured: dict[int, tuple] = {}
        self.steps = 0

    # -- sequences -------------------------------------------------------------------------------
    @rule(tokens=prompts, salt=st.sampled_from([None, None, "b"]), data=st.data())
    def open_tokens(self, tokens, salt, data) -> None:
        if not tokens:
            return
        next_use = None
        if self.policy == "belady":
            n = -(-len(tokens) // BS)
            next_use = data.draw(st.lists(st.sampled_from([1.0, 5.0, float("inf")]), min_size=n, max_size=n))
        try:
            self.seqs.append(self.pool.open_sequence(tokens=tokens, salt=salt, next_use=next_use).id)
        except OutOfMemory:
            pass

    @rule(hashes=st.lists(st.integers(1, 6), max_size=5), extra=st.integers(0, BS - 1))
    def open_hashes(self, hashes, extra) -> None:
        # chained-looking hashes: each names its whole prefix, so shared prefixes hit
        chain = [int("".join(map(str, hashes[:i + 1]))) for i in range(len(hashes))]
        num_tokens = len(chain) * BS + extra
        if num_tokens == 0:
            return
        try:
            self.seqs.append(self.pool.open_sequence(block_hashes=chain, num_tokens=num_tokens).id)
        except OutOfMemory:
            pass

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=9),
          hashes=st.booleans())
    def append(self, i, tokens, hashes) -> None:
        sid = self.seqs[i % len(self.seqs)]
        seq = self.pool._seqs[sid]
        try:
            if seq.mode == 1:
                self.pool.append(sid, tokens=tokens)
            elif seq.mode == 2 and hashes:
                filled = (seq.num_tokens + len(tokens)) // BS - seq.num_tokens // BS
                self.pool.append(sid, num_tokens=len(tokens), block_hashes=[900 + sid * 10 + k for k in range(filled)])
            else:
                self.pool.append(sid, num_tokens=len(tokens))
        except OutOfMemory:
            pass

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 100))
    def close(self, i) -> None:
        self.pool.close_sequence(self.seqs.pop(i % len(self.seqs)))

    @precondition(lambda self: len(self.seqs) > 2)
    @rule()
    def close_oldest(self) -> None:  # keeps the pool cycling: idle cached blocks, then evictions
        self.pool.close_sequence(self.seqs.pop(0))

    @rule(k=st.integers(0, 3))
    def reset_prefix_cache(self, k) -> None:
        if k == 0:  # rarely: it forgets the cache the other rules build up
            self.pool.reset_prefix_cache()

    @precondition(lambda self: self.seqs and self.policy == "belady")
    @rule(i=st.integers(0, 100), when=st.floats(0, 10))
    def set_next_use(self, i, when) -> None:
        sid = self.seqs[i % len(self.seqs)]
        self.pool.set_next_use(sid, [when] * len(self.pool._seqs[sid].blocks))

    # -- plain allocations -------------------------------------------------------------------------
    @rule(size=st.integers(1, 2 * BLOCK_BYTES), state=st.sampled_from([USED, PINNED]))
    def allocate(self, size, state) -> None:
        try:
            self.ids.append(self.pool.allocate(size, state))
        except OutOfMemory:
            pass

    @rule(sizes=st.lists(st.integers(1, 2 * BLOCK_BYTES), min_size=1, max_size=3))
    def allocate_many(self, sizes) -> None:
        try:
            self.ids += self.pool.allocate_many(sizes)
        except OutOfMemory:
            pass

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 100), extra=st.integers(1, 2 * BLOCK_BYTES))
    def extend(self, i, extra) -> None:
        try:
            self.pool.extend(self.ids[i % len(self.ids)], extra)
        except OutOfMemory:
            pass

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 100), frac=st.floats(0.05, 1.0))
    def truncate(self, i, frac) -> None:
        aid = self.ids[i % len(self.ids)]
        self.pool.truncate(aid, max(1, int(self.pool._allocs[aid][0] * frac)))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 100))
    def free(self, i) -> None:
        self.pool.free(self.ids.pop(i % len(self.ids)))

    @rule(k=st.integers(0, 7))
    def reset(self, k) -> None:
        if k == 0:  # rarely, for the same reason
            self.pool.reset()
            self.seqs.clear()
            self.ids.clear()

    # -- the comparison ----------------------------------------------------------------------------
    @invariant()
    def capture_and_compare(self) -> None:
        assert self.pool.check() == []
        seq = self.pool.events.last_seq
        bm = self.pool.blockmap
        self.captured[seq] = (bm.owners_np().copy(), bm.states_np().copy(), COMPARED(self.pool.stats()))
        self.steps += 1
        if self.steps % 10 == 0:
            self.compare_all()

    def compare_all(self) -> None:
        view = self.pool.history.view()
        assert view.last_seq == self.pool.events.last_seq
        for seq, (owner, state, stats) in self.captured.items():
            rep = view.replay_to(seq)
            assert np.array_equal(rep.owner, owner), f"owner differs at seq {seq}"
            assert np.array_equal(rep.state, state), f"state differs at seq {seq}"
            assert map_runs(rep.owner, rep.state) == map_runs(owner, state)
            assert view.stats_at(seq) == stats, f"stats differ at seq {seq}"
            kf = max((k for k in view.keyframes if k.seq <= seq), key=lambda k: k.seq)
            ref = Replayer(kf)
            for row in view.rows(kf.seq, seq):
                ref.apply(row)
            assert np.array_equal(ref.owner, owner) and np.array_equal(ref.state, state), f"row by row, seq {seq}"
            assert ref.requested == stats["requested_bytes"]

    def teardown(self) -> None:
        self.compare_all()


class FifoReplay(PrefixReplay):
    policy = "fifo"


class LfuReplay(PrefixReplay):
    policy = "lfu"


class S3FifoReplay(PrefixReplay):
    policy = "s3fifo"


class BeladyReplay(PrefixReplay):
    policy = "belady"


TestPrefixLruReplay = PrefixReplay.TestCase
TestPrefixFifoReplay = FifoReplay.TestCase
TestPrefixLfuReplay = LfuReplay.TestCase
TestPrefixS3FifoReplay = S3FifoReplay.TestCase
TestPrefixBeladyReplay = BeladyReplay.TestCase
for case in (TestPrefixLruReplay, TestPrefixFifoReplay, TestPrefixLfuReplay, TestPrefixS3FifoReplay,
             TestPrefixBeladyReplay):
    case.settings = SETTINGS


def test_events_name_each_blocks_new_owner_and_state() -> None:
    pool = make_pool("lru")
    a = pool.open_sequence(tokens=list(range(9)))  # 3 blocks: 2 full (stored), 1 partial
    b = pool.open_sequence(tokens=list(range(8)) + [5])  # hits a's 2 full blocks: shared
    opened = pool.events.after(0, kinds={"open"})[-1]
    assert opened["blocks"][:2] == a.blocks[:2] and sorted(opened["shared_ids"]) == sorted(a.blocks[:2])
    pool.close_sequence(a.id)
    closed = pool.events.after(0, kinds={"close"})[-1]
    assert closed["freed_ids"] == [a.blocks[2]] and sorted(closed["used_ids"]) == sorted(a.blocks[:2])
    assert closed["cached_ids"] == [] and closed["added_bytes"] < 0
    pool.close_sequence(b.id)
    closed = pool.events.after(0, kinds={"close"})[-1]
    assert sorted(closed["cached_ids"]) == sorted(b.blocks[:2]) and closed["freed_ids"] == [b.blocks[2]]
    pool.reset_prefix_cache()
    cleared = pool.events.after(0, kinds={"cleared"})[-1]
    assert sorted(cleared["freed_ids"]) == sorted(b.blocks[:2])


def test_evictions_are_recorded_after_the_operation_that_took_the_blocks() -> None:
    pool = make_pool("lru")
    for k in range(BLOCKS // 2):  # fill the pool with idle cached blocks
        pool.close_sequence(pool.open_sequence(block_hashes=[100 + k, 200 + k], num_tokens=2 * BS).id)
    seq = pool.events.last_seq
    s = pool.open_sequence(block_hashes=[1, 2], num_tokens=2 * BS)  # evicts 2
    kinds = [(e["type"], e.get("taken_by")) for e in pool.events.after(seq)]
    assert kinds == [("open", None), ("removed", s.id), ("stored", None)]
    aid = pool.allocate(BLOCK_BYTES * 2)
    assert [(e["type"], e.get("taken_by")) for e in pool.events.after(0)][-2:] == [("allocate", None), ("removed", aid)]


def test_a_batch_that_would_run_out_evicts_nothing() -> None:
    pool = make_pool("lru")
    pool.close_sequence(pool.open_sequence(block_hashes=[1, 2, 3], num_tokens=3 * BS).id)
    pool.allocate(BLOCK_BYTES * (BLOCKS - 4))  # 1 free block left, 3 idle cached
    seq = pool.events.last_seq
    with pytest.raises(OutOfMemory):
        pool.allocate_many([BLOCK_BYTES * 2, BLOCK_BYTES * 3])
    assert [e["type"] for e in pool.events.after(seq)] == ["oom"]
    assert pool.core.n_evictable == 3 and pool.check() == []


def test_past_stats_of_a_prefix_pool_with_a_kv_cache() -> None:
    """Its KV entries and idle prefix blocks are both CACHED on the map: past stats are exact
    from the first keyframe that holds the cache's entries (a 409 before it); the map always."""
    pool = make_pool("lru")
    cache = KVCache(pool, BLOCKS * BLOCK_BYTES // 2, "lru")
    cache.put("k", BLOCK_BYTES * 2)
    s = pool.open_sequence(tokens=list(range(8)))
    pool.close_sequence(s.id)
    live = (pool.blockmap.owners_np().copy(), pool.blockmap.states_np().copy())
    early = pool.events.last_seq
    view = pool.history.view()
    rep = view.replay_to(view.last_seq)
    assert np.array_equal(rep.owner, live[0]) and np.array_equal(rep.state, live[1])
    with pytest.raises(Conflict, match="KV cache"):
        view.stats_at(early)
    with pytest.raises(NotFound):
        view.replay_to(view.last_seq + 1)
    rng = random.Random(4)
    captured, seqs = {}, []
    for _ in range(120):  # past keyframe_every: keyframes now hold the cache's entries
        try:
            r = rng.random()
            if r < 0.4:
                seqs.append(pool.open_sequence(tokens=[7, 7, 7, 7] + [rng.randint(0, 30) for _ in range(6)]).id)
            elif r < 0.7 and seqs:
                pool.close_sequence(seqs.pop(rng.randrange(len(seqs))))
            else:
                cache.put(f"k{rng.randrange(5)}", BLOCK_BYTES * rng.randint(1, 2))
        except OutOfMemory:
            pass
        stats = pool.stats()
        stats.pop("prefix")
        stats["cache"].pop("refusals")
        captured[pool.events.last_seq] = stats
    view = pool.history.view()
    since = min(k.seq for k in view.keyframes if k.cache is not None)
    checked = 0
    for seq, stats in captured.items():
        if seq >= since:
            assert view.stats_at(seq) == stats, seq
            checked += 1
    assert checked > 60 and cache.evictions["capacity"] + pool.prefix_stats()["evicted"] > 0


def _as_lists(row: tuple) -> tuple:
    """`row` with its packed runs (native bytes) as lists: the form older recordings carry."""
    if row[2] not in PACKED_KINDS:
        return row
    names = EVENT_FIELDS[row[2]]
    return row[:3] + tuple(packed_list(v, PACKED_FIELDS[name]) if name in PACKED_FIELDS else v
                           for name, v in zip(names, row[3:]))


def test_runs_recorded_as_bytes_read_and_replay_as_lists_do() -> None:
    """The core records its prefix events' block ids, hashes and token ids as native bytes; the
    same rows with lists there (older recordings, mirrors) read back as the same event dicts and
    replay to the same maps, vectorised and row by row."""
    pool = make_pool("lru")
    rng = random.Random(11)
    seqs: list[int] = []
    for _ in range(80):
        r = rng.random()
        try:
            if r < 0.3:
                tail = [rng.randint(0, 9) for _ in range(rng.randint(1, 9))]
                seqs.append(pool.open_sequence(tokens=[3, 1, 4, 1] + tail).id)
            elif r < 0.5:
                hashes = [rng.randint(1, 4) * (1 << 60) + k for k in range(rng.randint(1, 3))]
                seqs.append(pool.open_sequence(block_hashes=hashes, num_tokens=len(hashes) * BS).id)
            elif r < 0.65 and seqs:
                s = pool.sequence(seqs[-1])
                if pool._seqs[s.id].mode == 1:
                    pool.append(s.id, tokens=[rng.randint(0, 9) for _ in range(rng.randint(1, 6))])
            elif seqs:
                pool.close_sequence(seqs.pop(rng.randrange(len(seqs))))
        except OutOfMemory:
            pass
    view = pool.history.view()
    kf = view.keyframes[0]
    rows = list(view.rows(kf.seq, view.last_seq))
    packed = {r[2] for r in rows
              if r[2] in PACKED_KINDS and r[3 + EVENT_FIELDS[r[2]].index("blocks")].__class__ is bytes}
    assert packed >= {"open", "close", "stored", "removed"}
    listed = [_as_lists(r) for r in rows]
    assert [event_dict(r) for r in listed] == [event_dict(r) for r in rows]
    assert all(isinstance(e["blocks"], list) for e in map(event_dict, rows) if e["type"] in PACKED_KINDS)
    fast, slow, by_row = Replayer(kf), Replayer(kf), Replayer(kf)
    fast.apply_rows(rows)
    slow.apply_rows(listed)
    for r in listed:
        by_row.apply(r)
    owner, state = pool.blockmap.owners_np(), pool.blockmap.states_np()
    for rep in (fast, slow, by_row):
        assert np.array_equal(rep.owner, owner) and np.array_equal(rep.state, state)
    assert fast.requested == slow.requested == by_row.requested
