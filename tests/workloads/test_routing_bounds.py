"""The bounds beside every router (workloads/routing/bounds.py): hand-computed cases, MIN against
an exhaustive search over every cache of K blocks, and on random traces no policy of the lab
above the pooled bound, the pooled bound never above the infinite one."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from routing_util import trace_of

from workloads.prefix_curve import prepare
from workloads.prefix_curve import run_point as curve_point
from workloads.routing import make_policy, policy_names, run_sequence
from workloads.routing.bounds import (
    accesses,
    belady_hits,
    bound_key,
    compute_bounds,
    hit_tokens,
    infinite_hits,
)
from workloads.routing.grid import Settings, bound_keys, grid, run_grid
from workloads.routing.serving import run_serving


class Fixed:
    """Routes request i to `picks[i]`: a routing chosen by hand."""

    name = rule = "fixed"

    def __init__(self, picks):
        self.picks = picks

    def route(self, req, cluster):
        return self.picks[req.index]

    def prefilled(self, index, replica):
        pass

    def finished(self, index, replica):
        pass


def test_bypass_is_what_makes_min_a_bound_for_prompts_longer_than_a_replica():
    # two replicas of 2 blocks: [a], a 4-block prompt, [a] again. Routed a -> r1, the long
    # prompt -> r0 (its LRU keeps only the head), a -> r1: the second a hits.
    rows = [(0, 512, 1, [7]), (1, 2048, 1, [1, 2, 3, 4]), (2, 512, 1, [7])]
    trace = trace_of(rows)
    got = run_sequence(trace, 2, 2 * 512, Fixed([1, 0, 1]))
    assert got["hit_tokens"] == 512
    # one demand-only MIN cache of the same 4 blocks (the prefix curve's pool, which must take
    # the whole long prompt) loses a: it is no bound
    assert curve_point(prepare(trace), 4 * 512, "belady").hit_tokens == 0
    b = compute_bounds(trace, bound_key("sequence", 2, 2 * 512))
    assert b["pooled_bound_tokens"] == 512 and b["infinite_bound_tokens"] == 512
    assert b["bound_prompt_tokens"] == 3072
    assert b["pooled_bound_hit_ratio"] == 512 / 3072


def test_hand_computed_bounds_below_the_infinite_cache():
    # K = 1 block: A B A B. MIN keeps A (needed first), bypasses B twice: one block hit.
    rows = [(0, 512, 1, [1]), (1, 512, 1, [2]), (2, 512, 1, [1]), (3, 512, 1, [2])]
    b = compute_bounds(trace_of(rows), bound_key("sequence", 1, 512))
    assert (b["pooled_bound_tokens"], b["infinite_bound_tokens"]) == (512, 1024)
    assert b["pooled_bound_slack_tokens"] == 0
    # K = 2 (N=2 of one block each): both repeats hit; the partial [3] (300 tokens) is bypassed
    rows = [(0, 512, 1, [1]), (1, 512, 1, [2]), (2, 300, 1, [3]), (3, 512, 1, [1]),
            (4, 512, 1, [2])]
    b = compute_bounds(trace_of(rows), bound_key("sequence", 2, 512))
    assert (b["pooled_bound_tokens"], b["infinite_bound_tokens"]) == (1024, 1024)
    assert b["pooled_bound_hit_ratio"] == 1024 / (4 * 512 + 300)
    # round robin over those two 1-block replicas hits nothing; the bound's fraction says so
    row = run_grid(trace_of(rows), grid(["round_robin"], [2], [512], "sequence"), Settings(),
                   workers=1)[0]
    assert row["hit_ratio"] == 0 and row["of_pooled_bound"] == 0


def test_a_partial_block_counts_512_in_the_bound_because_min_maximises_blocks_not_tokens():
    # K = 1: A (100 tokens) B A (100) B. MIN keeps A (needed first): one hit worth 100 tokens.
    # A cache that keeps B instead hits 512 tokens: MIN's own token count is no bound, so the
    # pooled bound counts MIN's block hit as 512 tokens.
    rows = [(0, 100, 1, [1]), (1, 512, 1, [2]), (2, 100, 1, [1]), (3, 512, 1, [2])]
    trace = trace_of(rows)
    key = bound_key("sequence", 1, 512)
    b = compute_bounds(trace, key)
    assert best_tokens(trace, key) == 512
    assert b["pooled_bound_tokens"] == 512 and b["pooled_bound_slack_tokens"] == 512 - 100
    assert b["infinite_bound_tokens"] == 612
    # the same prompt twice: the bound is capped by the infinite cache's 100 tokens
    b = compute_bounds(trace_of([(0, 100, 1, [1]), (1, 100, 1, [1])]), key)
    assert b["pooled_bound_tokens"] == b["infinite_bound_tokens"] == 100


def test_serving_bounds_count_full_blocks_and_leave_one_token_computed():
    # serving mode caches full blocks only and computes one token of a prompt hit whole
    rows = [(0, 1024, 1, [1, 2]), (1000, 1024, 1, [1, 2]), (2000, 700, 1, [1, 5])]
    b = compute_bounds(trace_of(rows), bound_key("serving", 1, 4 * 512))
    # request 1: both blocks, 1023 tokens; request 2: its one full block, 512
    assert b["infinite_bound_tokens"] == 1023 + 512
    # MIN hits 3 blocks = 1536 tokens, capped by the infinite cache's 1535
    assert b["pooled_bound_tokens"] == 1535
    got = run_serving(trace_of(rows), 1, 4 * 512, make_policy("round_robin", 1))
    assert got["hit_ratio"] == 1535 / (1024 + 1024 + 700)
    # a request longer than a replica's max_len is not routed, so it is not in the bounds
    rows = [(0, 1024, 1, [1, 2]), (1, 1024, 2000, [1, 2])]
    b = compute_bounds(trace_of(rows), bound_key("serving", 2, 4 * 512))
    assert b["bound_prompt_tokens"] == 1024 and b["infinite_bound_tokens"] == 0


def test_equal_pooled_capacities_share_one_bound():
    points = (grid(["round_robin", "dynamo_kv"], [2, 4], [1024, 2048], "sequence")
              + grid(["round_robin"], [2], [2048], "serving"))
    keys = bound_keys(points)
    # N=2 x 4 blocks (2,048 tokens) and N=4 x 2 blocks pool 8 blocks: one bound for both;
    # serving mode's bounds are apart
    assert [(k.mode, k.pooled_blocks) for k in keys] == [
        ("sequence", 4), ("sequence", 8), ("sequence", 16), ("serving", 8)]


# -- exhaustive search ---------------------------------------------------------------------------
def best_tokens(trace, key, blocks_only: bool = False) -> int:
    """The most any cache of `key.pooled_blocks` blocks could score, by exhaustive search: each
    missed block is taken (evicting any one block when full) or bypassed; a request scores the
    tokens of its leading run, or (blocks_only) every block found counts one."""
    runs, whole, _ = accesses(trace, key)
    cap = key.pooled_blocks

    @functools.cache
    def best(i: int, cache: frozenset) -> int:
        if i == len(runs):
            return 0
        out = -1
        for state, lead, found in outcomes(runs[i], cache):
            score = found if blocks_only else hit_tokens(lead, len(runs[i]), whole[i])
            out = max(out, score + best(i + 1, state))
        return out

    def outcomes(run, cache):
        """(cache after, leading blocks found, blocks found) of every way to serve `run`."""
        todo = [(0, cache, 0, 0, True)]
        while todo:
            j, state, lead, found, leading = todo.pop()
            if j == len(run):
                yield state, lead, found
                continue
            b = run[j]
            if b in state:
                todo.append((j + 1, state, lead + leading, found + 1, leading))
                continue
            todo.append((j + 1, state, lead, found, False))  # bypass
            if len(state) < cap:
                todo.append((j + 1, state | {b}, lead, found, False))
            else:
                for v in state:
                    todo.append((j + 1, (state - {v}) | {b}, lead, found, False))

    return best(0, frozenset())


@st.composite
def traces(draw, max_requests: int = 25, alphabet: int = 8, max_new: int = 5):
    """Random prefix trees: a request extends a prefix of an earlier prompt (or starts afresh)
    with ids from a small alphabet, so ids repeat under other prefixes and within a prompt;
    last blocks are partial or full, prompts repeat whole (partial blocks reused), outputs
    sometimes exceed a small replica (serving mode then refuses the request)."""
    n = draw(st.integers(1, max_requests))
    prompts: list[list[int]] = []
    rows = []
    for i in range(n):
        ids: list[int] = []
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            ids = base[:draw(st.integers(0, len(base)))]
        ids = ids + draw(st.lists(st.integers(0, alphabet - 1), min_size=0 if ids else 1,
                                  max_size=max_new))
        last = draw(st.sampled_from([1, 200, 511, 512]))
        prompts.append(ids)
        rows.append((i * 100, 512 * (len(ids) - 1) + last, draw(st.sampled_from([1, 30, 900])), ids))
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces(max_requests=7, alphabet=4, max_new=3), k=st.integers(1, 3),
       mode=st.sampled_from(["sequence", "serving"]))
def test_min_with_bypass_is_the_exhaustive_optimum_and_the_bound_covers_every_cache(rows, k, mode):
    trace = trace_of(rows)
    key = bound_key(mode, 1, k * 512)
    runs, _, _ = accesses(trace, key)
    assume(sum(len(r) for r in runs) <= 16)  # the search is exponential
    blocks, lead = belady_hits(runs, k)
    assert blocks == best_tokens(trace, key, blocks_only=True)
    assert blocks == sum(lead)  # prefix-closed: every hit is part of a leading run
    b = compute_bounds(trace, key)
    assert best_tokens(trace, key) <= b["pooled_bound_tokens"] <= b["infinite_bound_tokens"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces(), n=st.integers(1, 4), blocks=st.integers(1, 8), seed=st.integers(0, 3))
def test_no_policy_beats_the_pooled_bound_in_sequence_mode(rows, n, blocks, seed):
    trace = trace_of(rows)
    key = bound_key("sequence", n, blocks * 512)
    b = compute_bounds(trace, key)
    inf_tokens, _ = infinite_hits(*accesses(trace, key)[:2])
    assert b["infinite_bound_tokens"] == inf_tokens
    assert b["pooled_bound_tokens"] <= b["infinite_bound_tokens"] <= b["bound_prompt_tokens"]
    for name in policy_names():
        got = run_sequence(trace, n, blocks * 512, make_policy(name, n, seed))
        assert got["prompt_tokens"] == b["bound_prompt_tokens"]
        assert got["hit_tokens"] <= b["pooled_bound_tokens"], name


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces(max_requests=15), n=st.integers(1, 3), blocks=st.integers(1, 6),
       name=st.sampled_from(policy_names()))
def test_no_policy_beats_the_pooled_bound_in_serving_mode(rows, n, blocks, name):
    trace = trace_of(rows)
    b = compute_bounds(trace, bound_key("serving", n, blocks * 512))
    assert b["pooled_bound_tokens"] <= b["infinite_bound_tokens"]
    got = run_serving(trace, n, blocks * 512, make_policy(name, n))
    assert got["hit_ratio"] <= b["pooled_bound_hit_ratio"] + 1e-12, name


@pytest.mark.parametrize("mode", ["sequence", "serving"])
def test_every_row_of_a_sweep_carries_its_bounds(mode):
    rows = [(i * 100, 512 * (1 + i % 3), 5, [1, 2, 3][:1 + i % 3]) for i in range(12)]
    trace = trace_of(rows)
    out = run_grid(trace, grid(["round_robin", "longest_prefix"], [1, 2], [1024], mode),
                   Settings(mode=mode), workers=2)
    for row in out:
        b = compute_bounds(trace, bound_key(mode, row["replicas"], row["capacity_tokens"]))
        assert {k: row[k] for k in b} == b
        assert row["hit_ratio"] <= row["pooled_bound_hit_ratio"] <= row["infinite_bound_hit_ratio"]
        assert row["of_pooled_bound"] == pytest.approx(row["hit_ratio"] / row["pooled_bound_hit_ratio"])
    assert out == run_grid(trace, grid(["round_robin", "longest_prefix"], [1, 2], [1024], mode),
                           Settings(mode=mode), workers=1)
