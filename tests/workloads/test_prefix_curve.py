"""The capacity curve on small hand-made traces with hand-computed answers, on the allocator's
prefix cache and on the dictionary reference model; the two compared on random traces; Bélády vs
LRU; the bundled trace against figures computed independently of kvscope."""

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefix_curve_model import REF_POLICIES, ref_pool

from allocator import InvalidRequest
from workloads.mooncake import parse_mooncake
from workloads.prefix_curve import (
    BOUND,
    capacity_curve,
    max_hit_ratio_by_set,
    next_uses,
    prefix_pool,
    prepare,
    run_point,
)

B = 512


def trace_of(*requests):
    """requests: a tuple (input_length, ids) or a list of ids (then 512 tokens per block)."""
    lines = []
    for t, r in enumerate(requests):
        n_in, ids = r if isinstance(r, tuple) else (len(r) * B, list(r))
        lines.append(json.dumps({"timestamp": t, "input_length": n_in, "output_length": 1,
                                 "hash_ids": ids}))
    return parse_mooncake(lines, source="hand.jsonl")


def ratio(trace, capacity_tokens, policy, make_pool=prefix_pool):
    point = run_point(prepare(trace), capacity_tokens, policy, make_pool)
    return Fraction(point.hit_tokens, point.input_tokens)


@pytest.fixture(params=[prefix_pool, ref_pool], ids=["allocator", "reference"])
def pool(request):
    return request.param


# -- hand-computed answers ---------------------------------------------------------------------
def test_recency_keeps_the_reused_block_and_insertion_order_does_not(pool):
    # 2 blocks. [1] [2] [1]=hit [3]: LRU evicts 2 (1 was just reused), FIFO evicts 1 (oldest
    # insertion), LFU evicts 2 (used once), MIN evicts 2 (never again). [1]: hit except FIFO.
    trace = trace_of([1], [2], [1], [3], [1])
    assert ratio(trace, 2 * B, "lru", pool) == Fraction(2, 5)
    assert ratio(trace, 2 * B, "fifo", pool) == Fraction(1, 5)
    assert ratio(trace, 2 * B, "lfu", pool) == Fraction(2, 5)
    assert ratio(trace, 2 * B, BOUND, pool) == Fraction(2, 5)
    assert ratio(trace, None, "lru", pool) == Fraction(2, 5)


def test_belady_beats_lru_where_lru_provably_gets_nothing(pool):
    # 2 blocks, cyclic [1] [2] [3] [1] [2]: LRU always evicts the block needed next (0 hits);
    # MIN keeps 1 (next needed sooner than 2) and hits once, the most any policy can.
    trace = trace_of([1], [2], [3], [1], [2])
    assert ratio(trace, 2 * B, "lru", pool) == 0
    assert ratio(trace, 2 * B, "fifo", pool) == 0
    assert ratio(trace, 2 * B, BOUND, pool) == Fraction(1, 5)


def test_a_hit_is_the_cached_prefix_capped_by_the_prompt_and_min_evicts_the_deeper_block(pool):
    # 3 blocks. [a b] then [c d] needs 2 new blocks with 1 free: one of a, b goes. Both are next
    # needed by request 2; evicting b (deeper) keeps the prefix [a]: hit 512 of its 700 tokens.
    # LRU evicts b too (released tail first, so b is older). Evicting a would have earned 0.
    trace = trace_of((1024, [1, 2]), (1024, [3, 4]), (700, [1, 2]))
    total = 1024 + 1024 + 700
    assert ratio(trace, 3 * B, "lru", pool) == Fraction(512, total)
    assert ratio(trace, 3 * B, BOUND, pool) == Fraction(512, total)
    assert ratio(trace, None, "lru", pool) == Fraction(700, total)  # [a b] both cached: capped at 700


def test_a_cached_block_without_its_prefix_earns_nothing(pool):
    # 2 blocks. Both policies hit a at request 1. FIFO then evicts a (oldest insertion) for [c];
    # [a b] finds b cached but not a: no prefix, no hit. LRU had reused a at request 1 (and
    # released b first), so it evicts b and hits a again.
    trace = trace_of([1], [1, 2], [3], [1, 2])
    assert ratio(trace, 2 * B, "fifo", pool) == Fraction(512, 6 * B)
    assert ratio(trace, 2 * B, "lru", pool) == Fraction(1024, 6 * B)


def test_a_prompt_longer_than_the_cache_keeps_its_head(pool):
    # 2 blocks, prompts of 3: inserting all and trimming by LRU leaves blocks 1, 2.
    trace = trace_of([1, 2, 3], [1, 2, 3])
    assert ratio(trace, 2 * B, "lru", pool) == Fraction(1024, 3072)


def test_min_is_a_bound_only_up_to_token_weighting(pool):
    # Found by hypothesis. 3 blocks; every prompt's last block holds 511 tokens. [0] [1] [2] fill
    # the cache; [0 x] needs a block: MIN evicts 2 (next needed last), FIFO evicts 1 (oldest idle
    # insertion). Then MIN hits [1], a lone partial block: 511 tokens. FIFO misses [1] but hits
    # the full first block of [2 y]: 512 tokens. Both hit one block, so with 512-token last
    # blocks they tie; by tokens FIFO is ahead by one.
    prompts = [[0], [1], [2], [0, 0], [1], [2, 0]]
    full = trace_of(*prompts)
    short = trace_of(*[(len(p) * B - 1, p) for p in prompts])
    assert ratio(full, 3 * B, BOUND, pool) == ratio(full, 3 * B, "fifo", pool)
    total = sum(len(p) * B - 1 for p in prompts)
    assert ratio(short, 3 * B, BOUND, pool) * total == 512 + 511
    assert ratio(short, 3 * B, "fifo", pool) * total == 512 + 512


def test_next_uses_point_at_the_next_request_with_a_depth_tie_break():
    trace = trace_of([1, 2], [3], [1, 2], [1])
    uses = next_uses(trace)
    assert [[int(u) if u != float("inf") else None for u in row] for row in uses] == \
        [[2, 2], [None], [3, None], [None]]
    assert uses[0][0] < uses[0][1]  # same next request: the deeper block is "later"
    assert len(next_uses(trace, 16)[0]) == 64


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=20),
       st.sampled_from([512, 128]))
def test_next_uses_agree_with_a_brute_force_scan(prompts, tpb):
    trace = trace_of(*prompts)
    uses = next_uses(trace, tpb)
    k = B // tpb
    for i, p in enumerate(prompts):
        assert len(uses[i]) == len(p) * k
        for d in range(len(p) * k):
            depth = d // k
            later = [j for j in range(i + 1, len(prompts))
                     if len(prompts[j]) > depth and prompts[j][:depth + 1] == p[:depth + 1]]
            whole = int(uses[i][d]) if uses[i][d] != float("inf") else None
            assert whole == (later[0] if later else None)
        finite = [u for u in uses[i] if u != float("inf")]
        assert all(a < b for a, b in zip(finite, finite[1:]) if int(a) == int(b))  # deeper = later


def test_curve_report_has_every_point_and_the_maximum():
    trace = trace_of([1], [2], [1], [3], [1])
    report = capacity_curve(trace, [B, 2 * B], ["lru", "fifo", BOUND], make_pool=ref_pool)
    assert report["max_hit_ratio"] == pytest.approx(0.4)
    assert [(r["capacity_tokens"], r["policy"]) for r in report["curve"]] == [
        (B, "lru"), (B, "fifo"), (B, BOUND), (2 * B, "lru"), (2 * B, "fifo"), (2 * B, BOUND)]
    assert report["checks"]["belady_bounds_policies"] and report["checks"]["lru_non_decreasing"]


def test_bad_capacities_and_policies_are_refused():
    trace = trace_of([1])
    with pytest.raises(InvalidRequest, match="capacities must be integers of at least one block"):
        capacity_curve(trace, [100], ["lru"], make_pool=ref_pool)
    with pytest.raises(InvalidRequest, match=r"unknown policies \['mru'\]"):
        capacity_curve(trace, [B], ["mru"], make_pool=ref_pool)


# -- properties --------------------------------------------------------------------------------
def chains():
    """Prompts as paths in a small tree (ids 0-3 at each depth): shared prefixes, divergent tails."""
    return st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=25)


def checked_pool(pools):
    """A prefix_pool factory that remembers the pools it built (to call check() on them)."""
    def make(num_blocks, tokens_per_block, policy):
        pools.append(prefix_pool(num_blocks, tokens_per_block, policy))
        return pools[-1]
    return make


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(1, 8), st.integers(0, 511))
def test_allocator_prefix_cache_matches_the_reference_model(prompts, blocks, cut):
    trace = trace_of(*[(len(p) * B - min(cut, B - 1), p) for p in prompts])
    prep = prepare(trace)
    pools = []
    for policy in REF_POLICIES:
        real = run_point(prep, B * blocks, policy, checked_pool(pools))
        ref = run_point(prep, B * blocks, policy, ref_pool)
        assert (real.hit_tokens, real.evicted_blocks) == (ref.hit_tokens, ref.evicted_blocks), policy
        pools[-1].check()
        assert pools[-1].prefix_stats()["sequences"] == 0


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(1, 8))
def test_min_bounds_every_policy_in_block_hits_and_the_maximum_bounds_all(prompts, blocks):
    # Full 512-token blocks: the token ratio counts block hits, where MIN is optimal.
    trace = trace_of(*prompts)
    best = ratio(trace, B * blocks, BOUND)
    for p in ("lru", "fifo", "lfu", "s3fifo"):
        assert ratio(trace, B * blocks, p) <= best, p
    top = ratio(trace, None, "lru")
    assert best <= top
    assert float(top) == pytest.approx(max_hit_ratio_by_set(trace))


@settings(max_examples=40, deadline=None)
@given(chains(), st.integers(1, 6))
def test_lru_hit_ratio_grows_with_capacity(prompts, blocks):
    trace = trace_of(*prompts)
    assert ratio(trace, B * blocks, "lru") <= ratio(trace, B * (blocks + 1), "lru")


def test_sixteen_token_pools_replay_the_same_prefixes():
    # 16-token pool blocks: 32 per trace block. LRU releases a prompt tail first, so blocks go
    # from the tail whatever their size; this trace evicts whole trace blocks only.
    trace = trace_of([1], [2], [1], [3], [1])
    assert ratio(trace, 2 * B, "lru") == Fraction(2, 5)
    point = run_point(prepare(trace, 16), 2 * B, "lru")
    assert Fraction(point.hit_tokens, point.input_tokens) == Fraction(2, 5)
    assert point.evicted_blocks == 32


# -- the bundled trace -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mooncake():
    from workloads.mooncake import load_mooncake

    return prepare(load_mooncake())


def test_bundled_trace_agrees_with_the_independent_computation(mooncake):
    # Computed independently of kvscope with the same definition: maximum 0.374, LRU at
    # 3,000,000 tokens 0.139.
    assert run_point(mooncake, None, "lru").hit_ratio == pytest.approx(0.374, abs=0.005)
    assert max_hit_ratio_by_set(mooncake.trace) == pytest.approx(0.374, abs=0.005)
    lru = run_point(mooncake, 3_000_000, "lru")
    assert lru.hit_ratio == pytest.approx(0.139, abs=0.005)
    assert lru.hit_ratio <= run_point(mooncake, 3_000_000, BOUND).hit_ratio
