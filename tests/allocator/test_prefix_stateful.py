"""Stateful property tests of PrefixPool against the reference model in prefix_cache_model.py.

Random open / append / close / reset-prefix / plain allocate and free, on a pool small enough
that evictions and out-of-memory refusals are frequent; sequences opened by token count alone,
and appends of token counts from small to far past anything the pool holds (2**62 and up are
invalid), which must be refused with nothing changed. After every step: `pool.check() == []`;
every sequence's cached tokens; free, idle cached and indexed counts; the eviction order
(exactly, as hashes, for lru / fifo / lfu / belady; as a set for s3fifo); the hashes each step
evicted, in order; the token-weighted queries and hits. Blocks hold real bytes: each stored
block is written with bytes derived from its hash, and every hit reads them back.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prefix_cache_model import ModelOOM, PrefixModel

from allocator import InvalidRequest, NotFound, PrefixOutOfMemory, create_pool

BS = 4
BLOCKS = 16
BLOCK_BYTES = 32
SYSTEM = [[], [7, 7, 7, 7], [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9]]
SALTS = [None, None, None, "tenant-b"]
SETTINGS = settings(
    max_examples=int(os.environ.get("KVSCOPE_TEST_EXAMPLES", "50")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# token counts: a few blocks, or past the pool, up to past what the core counts (2**62)
counts = st.one_of(st.integers(1, 3 * BS), st.integers(BLOCKS * BS + 1, 2**40),
                   st.integers(2**40, 2**62 - 1), st.integers(2**62, 2**64))
prompts = st.builds(lambda sys, tail: sys + tail, st.sampled_from(SYSTEM),
                    st.lists(st.integers(0, 3), max_size=14))


def payload(h: int) -> bytes:
    return (h.to_bytes(8, "little") * (BLOCK_BYTES // 8))


class PrefixMachine(RuleBasedStateMachine):
    policy = "lru"

    @initialize()
    def setup(self) -> None:
        self.pool = create_pool("paged", num_blocks=BLOCKS, block_bytes=BLOCK_BYTES, tokens_per_block=BS,
                                device="cpu", prefix_caching={"policy": self.policy})
        self.model = PrefixModel(BLOCKS, BS, self.policy)
        self.seen = 0
        self.allocs: dict[int, int] = {}  # plain allocation id -> model anon id... blocks

    # -- helpers -------------------------------------------------------------------------------
    def new_events(self) -> list[dict]:
        events = self.pool.events.after(self.seen)
        if events:
            self.seen = events[-1]["seq"]
        for e in events:
            if e["type"] == "stored":  # the engine computed these blocks: fill them
                for b, h in zip(e["blocks"], e["block_hashes"]):
                    self.pool.storage.write([b], payload(h))
        return events

    def evicted_hashes(self, events) -> list[int]:
        return [h for e in events if e["type"] == "removed" for h in e["block_hashes"]]

    def expect_evicted(self, events, keys) -> None:
        assert self.evicted_hashes(events) == [self.model.hash_of(k) for k in keys]

    def model_step(self, step, real):
        """Run the model then the pool (or, for s3fifo, the pool first and the model told which
        keys the pool evicted). Returns (model result, pool result, new events); a model OOM is
        expected to be a pool PrefixOutOfMemory with nothing evicted."""
        if self.policy != "s3fifo":
            try:
                want = step()
            except ModelOOM:
                with pytest.raises(PrefixOutOfMemory):
                    real()
                assert self.evicted_hashes(self.new_events()) == []
                return None
            got = real()
            events = self.new_events()
            self.expect_evicted(events, want[-1] if isinstance(want, tuple) else want)
            return want, got, events
        try:
            got = real()
        except PrefixOutOfMemory:
            assert self.evicted_hashes(self.new_events()) == []
            with pytest.raises(ModelOOM):
                step()
            return None
        events = self.new_events()
        self.model.forced = [self.model.key_by_hash(h) for h in self.evicted_hashes(events)]
        try:
            want = step()
        finally:
            self.model.forced = None
        return want, got, events

    # -- rules ---------------------------------------------------------------------------------
    @rule(tokens=prompts, salt=st.sampled_from(SALTS), with_next_use=st.booleans(), data=st.data())
    def open(self, tokens, salt, with_next_use, data) -> None:
        if not tokens:
            return
        nblocks = -(-len(tokens) // BS)
        next_use = None
        if self.policy == "belady" and with_next_use:
            next_use = data.draw(st.lists(st.sampled_from([1.0, 2.0, 5.0, float("inf")]),
                                          min_size=nblocks, max_size=nblocks))
        sid = self.pool._last_id + 1
        out = self.model_step(lambda: self.model.open(sid, tokens, salt, next_use),
                              lambda: self.pool.open_sequence(tokens=tokens, salt=salt, next_use=next_use))
        if out is None:
            return
        (cached, _), info, _ = out
        assert info.id == sid
        assert info.cached_tokens == cached
        assert info.num_tokens == len(tokens)
        # every reused block holds the bytes its hash was stored with (never a stale block)
        for i in range(cached // BS):
            key = self.model.key_of(salt, tokens, i)
            got = self.pool.storage.read([info.blocks[i]], BLOCK_BYTES)
            assert got == payload(self.model.hash_of(key)), f"block {info.blocks[i]} is stale"

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def append(self, data, tokens) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model.seqs)))
        if self.model.seqs[sid].count is not None:  # a sequence opened by count appends counts
            self.refused(lambda: self.pool.append(sid, tokens=tokens))
            return
        out = self.model_step(lambda: self.model.append(sid, tokens),
                              lambda: self.pool.append(sid, tokens=tokens))
        if out is not None:
            assert out[1].num_tokens == len(self.model.seqs[sid].tokens)

    @rule(num_tokens=counts)
    def open_counted(self, num_tokens) -> None:
        sid = self.pool._last_id + 1
        if num_tokens >= 2**62:
            self.refused(lambda: self.pool.open_sequence(num_tokens=num_tokens))
            return
        out = self.model_step(lambda: self.model.open_counted(sid, num_tokens),
                              lambda: self.pool.open_sequence(num_tokens=num_tokens))
        if out is not None:
            assert (out[1].id, out[1].num_tokens, out[1].cached_tokens) == (sid, num_tokens, 0)

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data(), n=counts)
    def append_count(self, data, n) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model.seqs)))
        seq = self.model.seqs[sid]
        if seq.count is None or n >= 2**62:  # a sequence of token ids appends ids
            self.refused(lambda: self.pool.append(sid, num_tokens=n))
            return
        out = self.model_step(lambda: self.model.append_count(sid, n),
                              lambda: self.pool.append(sid, num_tokens=n))
        if out is not None:
            assert out[1].num_tokens == seq.count

    def refused(self, call) -> None:
        self.new_events()
        with pytest.raises(InvalidRequest):
            call()
        assert self.new_events() == []

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data())
    def close(self, data) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model.seqs)))
        self.model.close(sid)
        self.pool.close_sequence(sid)
        with pytest.raises(NotFound):
            self.pool.close_sequence(sid)
        self.new_events()

    @rule()
    def reset_prefix(self) -> None:
        assert self.pool.reset_prefix_cache() == self.model.reset_prefix()
        cleared = [e for e in self.new_events() if e["type"] == "cleared"]
        assert len(cleared) == 1

    @rule(nblocks=st.integers(1, 4))
    def allocate(self, nblocks) -> None:
        model = self.model

        def step():
            if nblocks > model.free + len(model.idle_stamp):
                raise ModelOOM()
            return model._take(nblocks)

        out = self.model_step(step, lambda: self.pool.allocate(nblocks * BLOCK_BYTES))
        if out is not None:
            self.allocs[out[1]] = [model._new_anon() for _ in range(nblocks)]

    @precondition(lambda self: self.allocs)
    @rule(data=st.data())
    def free(self, data) -> None:
        aid = data.draw(st.sampled_from(sorted(self.allocs)))
        for a in self.allocs.pop(aid):
            del self.model.anon[a]
        self.pool.free(aid)

    # -- after every step ----------------------------------------------------------------------
    @invariant()
    def agrees(self) -> None:
        pool, model, core = self.pool, self.model, self.pool.core
        assert pool.check() == []
        assert core.free_top == model.free
        assert core.n_evictable == len(model.idle_stamp)
        assert len(core.index) == len(model.refs)
        order = [int(core.hash_np[b]) for b in pool.eviction_order()]
        want = [model.hash_of(k) for k in model.order()]
        if self.policy == "s3fifo":
            assert sorted(order) == sorted(want)
        else:
            assert order == want
        for sid, mseq in model.seqs.items():
            info = pool.sequence(sid)
            assert info.cached_tokens == mseq.cached_tokens
            assert len(info.blocks) == len(mseq.keys)
            assert info.num_tokens == (len(mseq.tokens) if mseq.count is None else mseq.count)
        stats = pool.prefix_stats()
        assert (stats["queries"], stats["hits"]) == (model.queries, model.hit_tokens)
        assert stats["blocks"]["cached"] == len(model.idle_stamp)


class FifoMachine(PrefixMachine):
    policy = "fifo"


class LfuMachine(PrefixMachine):
    policy = "lfu"


class S3FifoMachine(PrefixMachine):
    policy = "s3fifo"


class BeladyMachine(PrefixMachine):
    policy = "belady"


TestPrefixLru = PrefixMachine.TestCase
TestPrefixFifo = FifoMachine.TestCase
TestPrefixLfu = LfuMachine.TestCase
TestPrefixS3Fifo = S3FifoMachine.TestCase
TestPrefixBelady = BeladyMachine.TestCase
for case in (TestPrefixLru, TestPrefixFifo, TestPrefixLfu, TestPrefixS3Fifo, TestPrefixBelady):
    case.settings = SETTINGS
