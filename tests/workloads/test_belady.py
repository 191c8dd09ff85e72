from workloads.belady import min_hits, next_uses, sized_min_hits
from workloads.policy_study import POLICY_NAMES, chat_stream, policy_hits, trace_stream


def test_next_uses_by_hand():
    assert next_uses(["a", "b", "a", "c", "b"]) == [2, 4, 5, 5, 5]


def test_min_on_a_hand_checked_sequence():
    # capacity 2: a b c a b -> MIN evicts c's rival by furthest next use: hits on a and b? a,b
    # cached; c misses and evicts b (next use 4 > a's 3)... then a hits, b misses: 1 hit.
    assert min_hits(list("abcab"), 2) == 1
    assert min_hits(list("abab"), 2) == 2
    assert min_hits(list("aaaa"), 1) == 3


def test_min_bounds_every_policy_on_the_chat_stream():
    keys, _ = chat_stream(seed=1, turns=1500, conversations=128)
    for cap in (8, 32):
        best = min_hits(keys, cap)
        for p in POLICY_NAMES:
            assert policy_hits(keys, None, cap, p) <= best, (p, cap)


def test_min_bounds_every_policy_on_the_trace_stream(excerpt):
    keys, _ = trace_stream(excerpt)
    for cap in (4, 16):
        best = min_hits(keys, cap)
        for p in POLICY_NAMES:
            assert policy_hits(keys, None, cap, p) <= best, (p, cap)


def test_sized_min_counts_a_grown_entry_as_a_hit_and_bypasses_giants():
    assert sized_min_hits(["a", "a", "b", "a"], [2, 3, 2, 3], 5) == 2
    assert sized_min_hits(["x", "x"], [10, 10], 5) == 0
