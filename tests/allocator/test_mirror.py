"""MirrorPool against a plain set of hashes: random store/remove/clear walks, check() each step."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from allocator import InvalidRequest, MirrorPool

HASHES = st.integers(0, 40).map(lambda i: (i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))


class MirrorMachine(RuleBasedStateMachine):
    """Reference: the engine's cache as a multiset of hashes (vLLM keeps duplicate blocks, and a
    hybrid model one per KV-cache group): a store adds a copy, a remove takes one."""

    @initialize(num_blocks=st.integers(1, 24))
    def make(self, num_blocks):
        self.pool = MirrorPool(num_blocks, name="m", device="cpu")
        self.ref: Counter[int] = Counter()

    @rule(hashes=st.lists(HASHES, min_size=1, max_size=6), parent=st.one_of(st.none(), HASHES))
    def store(self, hashes, parent):
        slots = self.pool.store(hashes, parent)
        assert len(slots) == len(hashes)
        self.ref.update(hashes)

    @rule(hashes=st.lists(HASHES, min_size=1, max_size=6))
    def remove(self, hashes):
        before = self.pool.mirror_counters["unknown_removes"]
        unknown = 0
        for h in hashes:
            if self.ref[h]:
                self.ref[h] -= 1
            else:
                unknown += 1
        self.pool.remove(hashes)
        assert self.pool.mirror_counters["unknown_removes"] == before + unknown

    @rule()
    def clear(self):
        from kvevents.codec import Cleared
        self.pool.apply([Cleared()])
        self.ref.clear()

    @invariant()
    def agrees(self):
        assert self.pool.check() == []
        cached = {h for h, n in self.ref.items() if n > 0}
        assert self.pool.cached_hashes() == cached
        for h in cached:
            assert self.pool.copies(h) == self.ref[h]
        copies = self.pool.stats()["mirror"]["copies"]
        assert copies == sum(self.ref.values())
        assert self.pool.used_blocks == min(copies, self.pool.num_blocks) or \
            self.pool.mirror_counters["overflow"] > 0
        for h in cached:
            s = self.pool.slot_of(h)
            if s is not None:
                assert int(self.pool.slot_hash[s]) == h
        f = self.pool.forest()
        assert f["cached_blocks"] == len(cached)
        assert f["roots"] + f["orphans"] <= f["placed_blocks"]


MirrorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestMirror = MirrorMachine.TestCase


def test_forest_shape_of_a_known_tree():
    pool = MirrorPool(32, name="m", device="cpu")
    pool.store([1, 2, 3], None, block_size=16)     # system prompt
    pool.store([4, 5], 3)                          # user a
    pool.store([6], 3)                             # user b
    pool.store([7], 2)                             # branch at 2
    pool.store([100, 101], None)                   # an unrelated root
    pool.store([200], 999)                         # parent never seen: an orphan
    f = pool.forest()
    assert (f["roots"], f["orphans"], f["trees"]) == (2, 1, 3)
    assert f["max_depth"] == 5
    top = f["top_prefixes"]
    assert [p["hash"] for p in top] == [f"{2:016x}", f"{3:016x}"]
    assert top[0]["descendants"] == 5 and top[0]["children"] == 2 and top[0]["depth"] == 2
    assert top[1]["tokens"] == 48
    # One tree is one owner (one colour on the page); another tree another.
    own = pool.blockmap.owner
    assert len({own[pool.slot_of(h)] for h in (1, 2, 3, 4, 5, 6, 7)}) == 1
    assert own[pool.slot_of(100)] != own[pool.slot_of(1)]
    pool.remove([2])
    f = pool.forest()
    assert f["orphans"] == 3 and f["max_depth"] == 3  # 3 and 7 lost their parent


def test_duplicate_copies_as_vllm_keeps_them():
    """Two requests fill the same block at once: vLLM keeps both blocks, stores and removes each."""
    pool = MirrorPool(8, name="m", device="cpu")
    a = pool.store([1, 2], None)
    b = pool.store([2], 1)
    assert pool.used_blocks == 3 and pool.copies(2) == 2
    assert pool.blockmap.owner[b[0]] == pool.blockmap.owner[a[1]]  # the copy joins its tree
    pool.remove([2])
    assert pool.cached_hashes() == {1, 2} and pool.used_blocks == 2
    pool.remove([2])
    assert pool.cached_hashes() == {1} and pool.mirror_counters["unknown_removes"] == 0
    assert pool.check() == []


def test_read_only_and_overflow():
    pool = MirrorPool(2, name="m", device="cpu")
    for call in (lambda: pool.allocate(10), lambda: pool.free(1), lambda: pool.extend(1, 5),
                 lambda: pool.defragment(), lambda: pool.allocate_many([1])):
        with pytest.raises(InvalidRequest, match="read-only"):
            call()
    pool.store([1, 2, 3], None)
    assert pool.used_blocks == 2 and pool.cached_hashes() == {1, 2, 3}
    assert pool.mirror_counters["overflow"] == 1
    pool.remove([3, 1])
    assert pool.cached_hashes() == {2} and pool.check() == []
    assert pool.reset() == 1 and pool.cached_hashes() == set()
    events = pool.events.after(0)
    assert [e["type"] for e in events] == ["stored", "removed", "reset"]
    assert events[0]["block_hashes"] == [1, 2, 3] and events[0]["blocks"] == [0, 1, -1]


def test_other_medium_is_not_the_gpu_cache():
    from kvevents.codec import Removed, Stored
    pool = MirrorPool(8, name="m", device="cpu")
    pool.apply([Stored([1, 2], None, None, 16, "GPU"), Stored([9], None, None, 16, "CPU"),
                Removed([1], "CPU")])
    assert pool.cached_hashes() == {1, 2}
    assert pool.mirror_counters["other_medium"] == 2


def test_allocator_never_imports_the_wire():
    root = Path(__file__).resolve().parents[2] / "allocator"
    for path in root.glob("**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert n.split(".")[0] not in {"zmq", "msgspec", "kvevents"}, (path.name, n)
