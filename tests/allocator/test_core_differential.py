"""The compiled paged core against a small pure-Python reference model, step by step.

The model is the obvious paged allocator: a Python list as the free stack (lowest ids on
top), a dict of id -> (requested bytes, block list). Random operation sequences (allocate,
allocate_many, free, free_many, extend, truncate, defragment, reset, bad input) run on both;
after every step the blocks of every allocation, the block map's owners and states, the free
count, the newest events (with the block ids they carry) and check() must agree.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from allocator import InvalidRequest, NotFound, OutOfMemory, create_pool

BB = 64
N = 48


class PagedModel:
    """Reference: free stack as a list (top = end), allocations as Python lists of blocks."""

    def __init__(self, n: int) -> None:
        self.free = list(range(n - 1, -1, -1))
        self.allocs: dict[int, tuple[int, list[int]]] = {}
        self.last_id = 0

    def take(self, n: int) -> list[int]:
        blocks = self.free[-n:][::-1]
        del self.free[-n:]
        return blocks

    def allocate(self, nbytes: int) -> int:
        n = -(-nbytes // BB)
        if n > len(self.free):
            raise OutOfMemory(nbytes, 0, 0, "capacity")
        self.last_id += 1
        self.allocs[self.last_id] = (nbytes, self.take(n))
        return self.last_id

    def free_id(self, aid: int) -> list[int]:
        _, blocks = self.allocs.pop(aid)
        self.free.extend(reversed(blocks))
        return blocks

    def extend(self, aid: int, nbytes: int) -> list[int]:
        req, blocks = self.allocs[aid]
        need = -(-(req + nbytes) // BB) - len(blocks)
        if need > len(self.free):
            raise OutOfMemory(need * BB, 0, 0, "capacity")
        new = self.take(need) if need > 0 else []
        self.allocs[aid] = (req + nbytes, blocks + new)
        return new

    def truncate(self, aid: int, nbytes: int) -> list[int]:
        _, blocks = self.allocs[aid]
        keep = -(-nbytes // BB)
        tail = blocks[keep:]
        self.free.extend(reversed(tail))
        self.allocs[aid] = (nbytes, blocks[:keep])
        return tail

    def owners(self) -> list[int]:
        out = [-1] * N
        for aid, (_, blocks) in self.allocs.items():
            for b in blocks:
                out[b] = aid
        return out


sizes = st.integers(1, 10 * BB)


class CoreVsModel(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.pool = create_pool("paged", num_blocks=N, block_bytes=BB, device="cpu", event_capacity=32)
        self.model = PagedModel(N)
        self.expect_events: list[tuple[str, list[int]]] = []

    def last_events(self, k: int) -> list[tuple[str, list[int]]]:
        evs = self.pool.events.after(self.pool.events.last_seq - k, block_ids=True)
        return [(e["type"], e["block_ids"]) for e in evs]

    @rule(nbytes=sizes)
    def allocate(self, nbytes):
        try:
            want = self.model.allocate(nbytes)
        except OutOfMemory:
            with pytest.raises(OutOfMemory):
                self.pool.allocate(nbytes)
            return
        assert self.pool.allocate(nbytes) == want
        assert self.last_events(1) == [("allocate", self.model.allocs[want][1])]

    @rule(batch=st.lists(sizes, max_size=4))
    def allocate_many(self, batch):
        blocks = -(-sum(-(-s // BB) * BB for s in batch) // BB)
        if blocks > len(self.model.free):
            with pytest.raises(OutOfMemory):
                self.pool.allocate_many(batch)
            return
        want = [self.model.allocate(s) for s in batch]
        assert self.pool.allocate_many(batch) == want

    @precondition(lambda self: self.model.allocs)
    @rule(data=st.data())
    def free(self, data):
        aid = data.draw(st.sampled_from(sorted(self.model.allocs)))
        blocks = self.model.free_id(aid)
        self.pool.free(aid)
        assert self.last_events(1) == [("free", blocks)]

    @precondition(lambda self: len(self.model.allocs) >= 2)
    @rule(data=st.data())
    def free_many(self, data):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.model.allocs)), min_size=1, max_size=3,
                                 unique=True))
        for aid in ids:
            self.model.free_id(aid)
        self.pool.free_many(ids)

    @precondition(lambda self: self.model.allocs)
    @rule(data=st.data(), nbytes=st.integers(1, 4 * BB))
    def extend(self, data, nbytes):
        aid = data.draw(st.sampled_from(sorted(self.model.allocs)))
        try:
            new = self.model.extend(aid, nbytes)
        except OutOfMemory:
            with pytest.raises(OutOfMemory):
                self.pool.extend(aid, nbytes)
            return
        self.pool.extend(aid, nbytes)
        assert self.last_events(1) == [("extend", new)]

    @precondition(lambda self: self.model.allocs)
    @rule(data=st.data())
    def truncate(self, data):
        aid = data.draw(st.sampled_from(sorted(self.model.allocs)))
        req = self.model.allocs[aid][0]
        nbytes = data.draw(st.integers(1, req))
        tail = self.model.truncate(aid, nbytes)
        self.pool.truncate(aid, nbytes)
        assert self.last_events(1) == [("truncate", tail)]

    @rule(bad=st.sampled_from([0, -1, 1.0, True, "3", None, 2**70]))
    def bad_free_and_allocate(self, bad):
        with pytest.raises(NotFound):
            self.pool.free(bad)
        if bad != 2**70:
            with pytest.raises(InvalidRequest):
                self.pool.allocate(bad)
        with pytest.raises(NotFound):
            self.pool.free(self.model.last_id + 1)  # never handed out

    @rule()
    def defragment(self):
        used = sum(len(b) for _, b in self.model.allocs.values())
        moves = any(b >= used for _, bl in self.model.allocs.values() for b in bl)
        self.pool.defragment()
        if not moves:
            return  # nothing above the line: blocks and free order stay as they were
        # Compaction keeps each allocation's data order; afterwards the model takes the
        # pool's block lists and a free stack of the ascending free tail (lowest on top).
        self.model.allocs = {aid: (req, self.pool.block_ids(aid)) for aid, (req, _) in self.model.allocs.items()}
        assert sorted(b for _, bl in self.model.allocs.values() for b in bl) == list(range(used))
        self.model.free = list(range(N - 1, used - 1, -1))

    @rule()
    def reset(self):
        self.pool.reset()
        self.model.allocs.clear()
        self.model.free = list(range(N - 1, -1, -1))

    @invariant()
    def agree(self):
        pool, model = self.pool, self.model
        assert pool.check() == []
        assert sorted(pool.ids()) == sorted(model.allocs)
        for aid, (req, blocks) in model.allocs.items():
            assert pool.block_ids(aid) == blocks
            assert pool._record(aid)[0] == req
        assert list(pool.blockmap.owner) == model.owners()
        assert pool.used_blocks == N - len(model.free)
        assert pool.requested_total == sum(r for r, _ in model.allocs.values())


TestCoreVsModel = CoreVsModel.TestCase
TestCoreVsModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_check_names_a_corrupted_chain():
    """check() still names the broken invariant when the compiled structures are corrupted."""
    pool = create_pool("paged", num_blocks=8, block_bytes=BB, device="cpu")
    a = pool.allocate(3 * BB)
    pool.allocate(BB)
    pool._core.next_arr[pool.block_ids(a)[0]] = 7  # a's chain now runs into the free list
    problems = pool.check()
    assert any(f"allocation {a}" in p and "chain" in p for p in problems), problems


def test_check_names_an_owner_the_map_disagrees_on():
    pool = create_pool("paged", num_blocks=8, block_bytes=BB, device="cpu")
    a = pool.allocate(2 * BB)
    pool.blockmap.owner[1] = 99
    assert any("block map owner of block 1 is 99" in p for p in pool.check()), pool.check()
    assert a == 1


def test_event_ring_drops_oldest_events_whose_block_ids_were_overwritten():
    pool = create_pool("paged", num_blocks=1 << 17, block_bytes=1, device="cpu", event_capacity=8)
    bcap = max(16 * 8, 1 << 16)
    big = pool.allocate(bcap - 10)  # nearly fills the id ring
    pool.allocate(20)  # wraps: the first event's ids are overwritten, so it is dropped
    events = pool.events.after(0, block_ids=True)
    assert [e["type"] for e in events] == ["allocate"] and len(events[0]["block_ids"]) == 20
    assert big in pool
