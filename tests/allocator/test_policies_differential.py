"""Compiled eviction policies against the plain-Python reference model, step by step: the same
random operations on both must give the same victim, the same order and the same keys, and the
compiled structure's check() must stay clean after every step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_model import MODEL_POLICIES

from allocator.cache.policies import POLICIES

KEYS = [f"k{i}" for i in range(40)]  # more than 16, so the slot arrays grow mid-run

ops = st.lists(st.tuples(st.sampled_from(["insert", "touch", "remove", "evict", "victim"]),
                         st.sampled_from(KEYS)), max_size=150)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=150, deadline=None)
@given(steps=ops)
def test_compiled_policy_matches_reference(name, steps):
    real, model = POLICIES[name](), MODEL_POLICIES[name]()
    for op, key in steps:
        held = key in model.keys()
        if op == "insert" and not held:
            real.insert(key)
            model.insert(key)
        elif op == "touch" and held:
            real.touch(key)
            model.touch(key)
        elif op == "remove" and held:
            real.remove(key, False)
            model.remove(key, False)
        elif op == "evict" and len(model):
            victim = model.victim()
            assert real.victim() == victim
            real.remove(victim, True)
            model.remove(victim, True)
        elif op == "victim":
            assert real.victim() == model.victim()
        assert real.keys() == model.keys() and len(real) == len(model)
        assert real.order() == model.order(), (op, key)
        assert real.order(3) == model.order(3)
        assert real.check() == []


def test_insert_of_a_held_key_is_refused():
    for cls in POLICIES.values():
        p = cls()
        p.insert("a")
        with pytest.raises(KeyError):
            p.insert("a")
        assert len(p) == 1 and p.check() == []


def test_lfu_insert_with_frequency_orders_by_it():
    p = POLICIES["lfu"]()
    p.insert("hot", freq=5)
    p.insert("cold")
    assert p.order() == ["cold", "hot"] and p.victim() == "cold"


class SlotDriver:
    """Drives a slotted policy (the cache's way: it keeps each key's slot) by key, for the test."""

    def __init__(self, policy) -> None:
        self.p, self.slots = policy, {}

    def insert(self, key) -> None:
        self.slots[key] = self.p._insert_slot(key)

    def touch(self, key) -> None:
        self.p._touch_slot(self.slots[key])

    def remove(self, key, evicted=False) -> None:
        self.p._remove_slot(self.slots.pop(key), evicted)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=100, deadline=None)
@given(steps=ops)
def test_slotted_policy_matches_the_keyed_one(name, steps):
    """The cache runs policies slotted (no key -> slot dict): same victims and orders as keyed."""
    keyed, slotted = POLICIES[name](), POLICIES[name](slotted=True)
    drive = SlotDriver(slotted)
    for op, key in steps:
        held = key in keyed
        if op == "insert" and not held:
            keyed.insert(key)
            drive.insert(key)
        elif op == "touch" and held:
            keyed.touch(key)
            drive.touch(key)
        elif op in ("remove", "evict") and held:
            keyed.remove(key, op == "evict")
            drive.remove(key, op == "evict")
        elif op == "victim" and len(keyed):
            victim = keyed.victim()
            assert slotted.victim() == victim
            keyed.remove(victim, True)
            drive.remove(victim, True)
        assert slotted.order() == keyed.order() and len(slotted) == len(keyed)
        assert slotted.keys() == keyed.keys() and slotted.check() == []
    with pytest.raises(TypeError, match="slotted"):
        slotted.insert("fresh")
    if len(keyed):
        with pytest.raises(TypeError, match="slotted"):
            slotted.touch(next(iter(keyed.keys())))
