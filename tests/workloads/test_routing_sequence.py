"""Sequence mode against a plain dict-based reference model: random traces, exact equality."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from routing_util import random_rows, trace_of

from allocator import InvalidRequest
from workloads.routing import make_policy, policy_names, run_sequence


def reference(rows, n, capacity_tokens, policy=None, decisions=None):
    """The model written the obvious way: each replica a dict block -> last-use clock; the
    policy is round_robin or longest_prefix, or the replica list `decisions` is replayed."""
    cap = capacity_tokens // 512
    last_use = [{} for _ in range(n)]
    clock = 0
    routed, inputs = [0] * n, [0] * n
    hit = query = 0
    for i, (_, length, _, ids) in enumerate(rows):
        def lead(r, ids=ids):
            m = 0
            while m < len(ids) and ids[m] in last_use[r]:
                m += 1
            return m

        if decisions is not None:
            r = decisions[i]
        elif policy == "round_robin":
            r = i % n
        else:
            found = [lead(x) for x in range(n)]
            best = max(found)
            r = min((x for x in range(n) if found[x] == best), key=lambda x: (routed[x], x))
        m = lead(r)
        hit += length if m == len(ids) else 512 * m
        query += length
        for b in reversed(ids):  # tail first: the head ends up most recent
            clock += 1
            last_use[r][b] = clock
        while len(last_use[r]) > cap:
            del last_use[r][min(last_use[r], key=last_use[r].get)]
        routed[r] += 1
        inputs[r] += length
    everywhere = {}
    for cache in last_use:
        for b in cache:
            everywhere[b] = everywhere.get(b, 0) + 1
    return {"hit_ratio": hit / query,
            "imbalance": max(inputs) / (sum(inputs) / n),
            "duplicated_blocks": sum(1 for c in everywhere.values() if c >= 2)}


FIGURES = ("hit_ratio", "imbalance", "duplicated_blocks")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.sampled_from([1, 2, 3, 4, 8]),
       blocks=st.integers(1, 40), policy=st.sampled_from(["round_robin", "longest_prefix"]))
def test_round_robin_and_longest_prefix_equal_the_reference(seed, n, blocks, policy):
    rows = random_rows(seed)
    got = run_sequence(trace_of(rows), n, blocks * 512, make_policy(policy, n))
    want = reference(rows, n, blocks * 512, policy)
    assert {k: got[k] for k in FIGURES} == want


class Recorder:
    """Wraps a policy and records its decisions."""

    def __init__(self, policy):
        self.policy, self.picks = policy, []

    def route(self, req, cluster):
        r = self.policy.route(req, cluster)
        self.picks.append(r)
        return r


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.sampled_from([2, 3, 4]), blocks=st.integers(1, 30),
       name=st.sampled_from(sorted(set(policy_names()) - {"round_robin", "longest_prefix"})))
def test_every_policy_is_accounted_like_the_reference(seed, n, blocks, name):
    rows = random_rows(seed, requests=80)
    rec = Recorder(make_policy(name, n, seed=seed))
    got = run_sequence(trace_of(rows), n, blocks * 512, rec)
    want = reference(rows, n, blocks * 512, decisions=rec.picks)
    assert {k: got[k] for k in FIGURES} == want


def test_hand_computed_figures():
    rows = [(0, 1000, 5, [1, 2]),       # -> 0: miss
            (1, 1536, 5, [1, 2, 3]),    # -> 1: miss
            (2, 700, 5, [1, 2]),        # -> 0: both blocks, last one's 188 tokens: hit 700
            (3, 512, 5, [4])]           # -> 1: miss
    got = run_sequence(trace_of(rows), 2, 10 * 512, make_policy("round_robin", 2))
    assert got["hit_ratio"] == 700 / (1000 + 1536 + 700 + 512)
    assert got["imbalance"] == (1536 + 512) / ((1000 + 1536 + 700 + 512) / 2)
    assert got["duplicated_blocks"] == 2  # blocks 1 and 2 on both replicas


def test_eviction_takes_the_deepest_block_of_the_least_recent_request_first():
    # capacity 3 blocks; [1, 2] then [3] then [4]: the eviction drops 2 (the deepest of the
    # least recent request), then [1] still hits
    rows = [(0, 1024, 1, [1, 2]), (1, 512, 1, [3]), (2, 512, 1, [4]), (3, 512, 1, [1])]
    got = run_sequence(trace_of(rows), 1, 3 * 512, make_policy("round_robin", 1))
    assert got["hit_tokens"] == 512


@pytest.mark.parametrize("n,capacity", [(0, 4096), (-1, 4096), (2, 511), (2, 0)])
def test_bad_grid_values_are_refused(n, capacity):
    with pytest.raises(InvalidRequest):
        run_sequence(trace_of([(0, 10, 1, [1])]), n, capacity, make_policy("round_robin", 1))


def test_blocks_are_prefix_nodes_so_an_id_under_another_prefix_is_another_block():
    # id 2 first alone, then after id 1: the second is another block (its prefix differs), so
    # [1, 2] finds only its first block cached, as serving mode and the pools count it
    rows = [(0, 512, 1, [1]), (1, 512, 1, [2]), (2, 1024, 1, [1, 2])]
    got = run_sequence(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1))
    assert got["hit_tokens"] == 512
    assert got["duplicated_blocks"] == 0
