"""The compiled primitives of allocator/_core.pxd, through their Python owners, against plain
Python models (a list as a stack, a list as the linked list, a dict of counts)."""

from __future__ import annotations

import pytest
from allocator._core import FreeStack, LinkedList, RefCounts
from hypothesis import given, settings
from hypothesis import strategies as st

N = 12


def test_full_stack_hands_out_lowest_ids_first_and_never_grows():
    s = FreeStack(4, full=True)
    assert [s.pop() for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        s.pop()
    for b in (3, 1, 2, 0):
        s.push(b)
    with pytest.raises(OverflowError):
        s.push(5)
    assert s.tolist() == [3, 1, 2, 0] and len(s) == 4 == s.capacity


@settings(deadline=None)  # timing is not what this checks: a loaded machine must not fail it
@given(st.lists(st.tuples(st.sampled_from(["push", "pop"]), st.integers(0, N - 1)), max_size=60))
def test_stack_matches_a_list(ops):
    s, model = FreeStack(N), []
    for op, x in ops:
        if op == "push":
            if len(model) == N:
                with pytest.raises(OverflowError):
                    s.push(x)
            else:
                s.push(x)
                model.append(x)
        elif model:
            assert s.pop() == model.pop()
        else:
            with pytest.raises(IndexError):
                s.pop()
        assert s.tolist() == model


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push_many", "pop_many", "refill"]),
                          st.lists(st.integers(0, N - 1), max_size=N + 2)), max_size=40))
def test_bulk_stack_operations_match_a_list(ops):
    """pop_many / push_many / refill (the tiered pool's free stacks): all or nothing, in order."""
    s, model = FreeStack(N, full=True), list(range(N - 1, -1, -1))
    for op, xs in ops:
        if op == "push_many":
            if len(model) + len(xs) > N:
                with pytest.raises(OverflowError):
                    s.push_many(xs)
            else:
                s.push_many(xs)
                model += xs
        elif op == "pop_many":
            n = len(xs)
            if n > len(model):
                with pytest.raises(IndexError):
                    s.pop_many(n)
            else:
                assert list(s.pop_many(n)) == [model.pop() for _ in range(n)]
        else:
            lo = len(xs) % (N + 1)
            s.refill(lo)
            model = list(range(N - 1, lo - 1, -1))
        assert s.tolist() == model == s.held().tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["back", "front", "remove", "pop", "touch"]),
                          st.integers(0, N - 1)), max_size=80))
def test_linked_list_matches_a_list(ops):
    """Every operation, middle removal included, against a Python list; check() after each."""
    lst, model = LinkedList(N), []
    for op, x in ops:
        inside = x in model
        if op in ("back", "front"):
            if inside:
                with pytest.raises(ValueError):
                    lst.push_back(x)
            elif op == "back":
                lst.push_back(x)
                model.append(x)
            else:
                lst.push_front(x)
                model.insert(0, x)
        elif op == "pop":
            assert lst.pop_front() == (model.pop(0) if model else None)
        elif not inside:
            with pytest.raises(ValueError):
                lst.remove(x) if op == "remove" else lst.move_to_back(x)
        elif op == "remove":
            lst.remove(x)
            model.remove(x)
        else:
            lst.move_to_back(x)
            model.remove(x)
            model.append(x)
        assert lst.tolist() == model
        assert len(lst) == len(model)
        assert lst.head == (model[0] if model else None)
        assert lst.tail == (model[-1] if model else None)
        assert all((i in lst) == (i in model) for i in range(N))
        assert lst.check() == []


def test_linked_list_check_names_a_broken_link():
    lst = LinkedList(4)
    for i in range(3):
        lst.push_back(i)
    lst.prev[2] = 0  # corrupt: 2's predecessor is 1
    assert lst.check() == ["element 2: prev is 0, expected 1"]


def test_refcounts_count_and_refuse_to_go_negative():
    r = RefCounts(3)
    assert r.incr(1) == 1 and r.incr(1) == 2 and r.decr(1) == 1 and r[1] == 1
    with pytest.raises(ValueError, match="block 0 has no reference"):
        r.decr(0)
    with pytest.raises(IndexError):
        r.incr(3)
