"""The cache's key index (allocator/_keyindex.pxi): an open-addressing table of entries by key,
against a dict as the model (what it holds, lookups, insertion order) with its own check()
after every step, so that backward-shift deletion and growth are exercised on small tables."""

from __future__ import annotations

import pytest
from allocator._core import KeyIndex
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from allocator import Entry, KVCache, create_pool

# Few keys, so that tables of 8-64 cells see long probe runs, wrap-around and deletions inside
# runs; "" and non-ASCII keys included.
KEYS = [f"k{i}" for i in range(40)] + ["", "é", "kv/é/0", "a" * 300]


def entry(key: str) -> Entry:
    return Entry(key, 1, 16, 16)


class IndexMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.index = KeyIndex()
        self.model: dict[str, Entry] = {}

    @rule(key=st.sampled_from(KEYS))
    def add(self, key):
        e = entry(key)
        if key in self.model:
            with pytest.raises(ValueError):
                self.index.add(e)
        else:
            self.index.add(e)
            self.model[key] = e

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key):
        if key in self.model:
            del self.index[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.index[key]

    @rule(key=st.sampled_from(KEYS))
    def lookup(self, key):
        want = self.model.get(key)
        assert self.index.get(key) is want
        assert (key in self.index) == (want is not None)
        if want is None:
            with pytest.raises(KeyError):
                self.index[key]
        else:
            assert self.index[key] is want

    @rule(keys=st.lists(st.sampled_from(KEYS), unique=True, max_size=30))
    def add_many(self, keys):
        for key in keys:
            if key not in self.model:
                self.add(key)

    @rule()
    def clear(self):
        self.index.clear()
        self.model.clear()

    @invariant()
    def matches_the_model(self):
        assert self.index.check() == []
        assert len(self.index) == len(self.model)
        assert self.index.keys() == list(self.model)  # insertion order, as a dict iterates
        assert [e for e in self.index.values()] == list(self.model.values())
        assert list(self.index) == list(self.model)
        assert self.index.items() == list(self.model.items())


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestKeyIndex = IndexMachine.TestCase


def test_lookups_by_a_str_subclass_find_the_text_and_non_str_keys_are_absent():
    class Name(str):
        pass

    index = KeyIndex()
    e = entry("block-7")
    index.add(e)
    assert index[Name("block-7")] is e and Name("block-7") in index
    assert 7 not in index and None not in index and index.get(b"block-7") is None
    with pytest.raises(KeyError):
        index[("block-7",)]
    with pytest.raises(TypeError):
        index.add(Entry.__new__(Entry))  # no key at all


def test_thousands_of_entries_grow_the_table_and_every_one_is_found_after_deletions():
    index, kept = KeyIndex(), {}
    for i in range(5000):
        e = entry(f"seq/{i}")
        index.add(e)
        kept[e.key] = e
    for i in range(0, 5000, 3):
        del index[f"seq/{i}"]
        del kept[f"seq/{i}"]
    assert index.check() == [] and len(index) == len(kept)
    assert all(index[k] is e for k, e in kept.items())
    assert all(f"seq/{i}" not in index for i in range(0, 5000, 3))
    assert index.keys() == list(kept)


def test_check_names_an_entry_whose_key_changed_under_the_index():
    index = KeyIndex()
    e = entry("first")
    index.add(e)
    index.add(entry("second"))
    e.key = "renamed"
    assert any("'renamed'" in p and "another key's hash" in p for p in index.check())


def test_the_cache_lists_entries_in_insertion_order_through_evictions_and_removals():
    pool = create_pool("paged", num_blocks=64, block_bytes=16, device="cpu")
    cache = KVCache(pool, 16 * 16)
    live: list[str] = []
    for i in range(61):
        key = f"doc{i}"
        result = cache.put(key, 16)
        live = [k for k in live if k not in result.evicted] + [key]
        if i % 7 == 3:
            cache.remove(live.pop(len(live) // 2))
        assert list(cache._entries) == live
    assert cache.check() == [] and len(cache) == len(live) == 16
    assert [e.key for e in cache.entries()] == live  # lru, no hits: oldest first
