"""Each routing policy against cases computed by hand from its source's rules."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from routing_util import FakeCluster, request

from allocator import InvalidRequest
from allocator.vocab import ROUTING_POLICIES, ROUTING_ROUTERS
from workloads.routing import check_policies, make_policy, policy_names
from workloads.routing.dynamo import DynamoKv
from workloads.routing.llmd import LlmdPrecise, prefix_scores, queue_scores
from workloads.routing.policies import softmax_pick
from workloads.routing.real_router import ROUTERS
from workloads.routing.registry import BUILDERS
from workloads.routing.sglang import CHARS_PER_TOKEN, VARIANTS, ApproxTree, CacheAware
from workloads.routing.vllm_kv import VllmKvAware, credited_blocks


def test_round_robin_sends_request_i_to_replica_i_mod_n():
    p = make_policy("round_robin", 3)
    assert [p.route(request([1], index=i), FakeCluster(3)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_reproducible_from_its_seed_and_reaches_every_replica():
    picks = [make_policy("random", 4, seed=7).route(request([1], index=i), FakeCluster(4))
             for i in range(1)]
    a = make_policy("random", 4, seed=7)
    b = make_policy("random", 4, seed=7)
    seq_a = [a.route(request([1], index=i), FakeCluster(4)) for i in range(200)]
    seq_b = [b.route(request([1], index=i), FakeCluster(4)) for i in range(200)]
    assert seq_a == seq_b and seq_a[0] == picks[0]
    assert set(seq_a) == {0, 1, 2, 3}
    c = make_policy("random", 4, seed=8)
    assert [c.route(request([1], index=i), FakeCluster(4)) for i in range(200)] != seq_a


def test_least_loaded_takes_fewest_outstanding_tokens_lowest_index_on_ties():
    p = make_policy("least_loaded", 4)
    assert p.route(request([1]), FakeCluster(4, tokens=[9, 3, 3, 5])) == 1
    assert p.route(request([1]), FakeCluster(4, tokens=[9, 8, 7, 6])) == 3


def test_power_of_two_takes_the_lighter_of_two_drawn_first_on_ties():
    loads = [5, 1, 1, 9]
    p = make_policy("power_of_two", 4, seed=3)
    rng = random.Random(3)
    for i in range(50):
        a, b = rng.sample(range(4), 2)
        want = a if loads[a] <= loads[b] else b
        assert p.route(request([1], index=i), FakeCluster(4, requests=loads)) == want


def test_session_is_a_consistent_hash_of_the_first_block():
    p4, p5 = make_policy("session", 4), make_policy("session", 5)
    first = {b: p4.route(request([b, 99]), FakeCluster(4)) for b in range(400)}
    assert all(p4.route(request([b, 7, 8]), FakeCluster(4)) == r for b, r in first.items())
    assert set(first.values()) == {0, 1, 2, 3}
    moved = [b for b, r in first.items() if p5.route(request([b]), FakeCluster(5)) != r]
    # only keys the new replica wins move, about a fifth of them
    assert all(p5.route(request([b]), FakeCluster(5)) == 4 for b in moved)
    assert 40 < len(moved) < 130


def test_longest_prefix_ties_go_to_fewest_routed_then_lowest_index():
    p = make_policy("longest_prefix", 4)
    assert p.route(request([1, 2, 3]), FakeCluster(4, matches=[1, 3, 2, 3], routed=[0, 5, 0, 4])) == 3
    assert p.route(request([1, 2, 3]), FakeCluster(4, matches=[2, 2, 0, 2], routed=[3, 1, 0, 1])) == 1
    assert p.route(request([1, 2, 3]), FakeCluster(4, matches=[0, 0, 0, 0], routed=[2, 2, 2, 2])) == 0


# -- SGLang cache_aware ----------------------------------------------------------------------
def _sglang(name="sglang_cache_aware", n=2):
    return make_policy(name, n)


@pytest.mark.parametrize("name,loads,imbalanced", [
    # documented defaults: abs 64, rel 1.5; both must hold, strictly
    ("sglang_cache_aware", [128, 64], False),   # diff 64 is not > 64
    ("sglang_cache_aware", [129, 64], True),    # diff 65 > 64 and 129 > 96
    ("sglang_cache_aware", [201, 134], False),  # diff 67 > 64 but 201 is not > 134 * 1.5 = 201
    ("sglang_cache_aware", [202, 134], True),
    ("sglang_cache_aware", [64, 0], False),     # diff 64 is not > 64 (0 * 1.5 = 0 holds)
    ("sglang_cache_aware", [65, 0], True),
    # code defaults: abs 32, rel 1.1
    ("sglang_cache_aware_code", [352, 320], False),  # diff 32 is not > 32
    ("sglang_cache_aware_code", [353, 320], True),   # 33 > 32 and 353 > 352
    ("sglang_cache_aware_code", [363, 330], False),  # 33 > 32 but 363 is not > 330 * 1.1 = 363
    ("sglang_cache_aware_code", [364, 330], True),
])
def test_sglang_imbalance_rule_switches_exactly_at_its_thresholds(name, loads, imbalanced):
    p = _sglang(name)
    assert p.imbalanced(loads) is imbalanced
    # a request the tree has never seen goes to the least loaded worker either way; the rule
    # says which branch decided
    pick = p.route(request([1, 2]), FakeCluster(2, requests=loads))
    assert pick == loads.index(min(loads)) and "least loaded" in p.rule
    assert ("imbalanced" in p.rule) is imbalanced


def test_sglang_match_rate_must_exceed_cache_threshold():
    # worker 1 served [1, 2] and more; worker 0 only [7].
    # a request [1, 3] of 1024 tokens matches 512 of them: rate 0.5
    for name, want, rule in (("sglang_cache_aware", 1, "best match"),  # 0.5 > 0.3
                             ("sglang_cache_aware_code", 0, "least loaded"),  # 0.5 is not > 0.5
                             ("vllm_cache_aware", 1, "best match")):
        p = _sglang(name)
        p.tree.insert(request([1, 2]), 1)
        p.tree.insert(request([11, 12, 13, 14]), 1)
        p.tree.insert(request([7]), 0)
        assert p.route(request([1, 3]), FakeCluster(2)) == want
        assert rule in p.rule and p.last_match_rate == 0.5


@pytest.mark.parametrize("name", ["sglang_cache_aware", "sglang_cache_aware_code", "vllm_cache_aware"])
def test_low_match_goes_to_the_least_loaded_worker_first_on_a_tie(name):
    # worker 1 has the smallest tree (the old router's choice); the loads decide: 0 and 2 tie
    # at the lowest load, 0 comes first
    p = _sglang(name, n=3)
    p.tree.insert(request([1, 2, 3]), 0)
    p.tree.insert(request([4]), 1)
    p.tree.insert(request([5, 6]), 2)
    unit = p.tree.units_per_token
    assert p.tree.sizes == [3 * 512 * unit, 512 * unit, 2 * 512 * unit]
    assert p.route(request([9, 9]), FakeCluster(3, requests=[2, 5, 2])) == 0
    assert "least loaded" in p.rule and "imbalanced" not in p.rule
    assert p.route(request([8, 8], index=1), FakeCluster(3, requests=[4, 3, 5])) == 1
    assert p.tree.check() == []


def test_matched_node_holder_sglang_oldest_vllm_least_loaded():
    # [1, 2] served by workers 2, then 0, then 1: node 2 has three holders, 2 the oldest
    for name, loads, want in (("sglang_cache_aware", [0, 0, 9], 2),
                              ("vllm_cache_aware", [5, 3, 9], 1),
                              ("vllm_cache_aware", [3, 3, 0], 2),
                              ("vllm_cache_aware", [3, 1, 1], 1)):  # a tie: the first of 1, 2
        p = _sglang(name, n=3)
        for w in (2, 0, 1):
            p.tree.insert(request([1, 2]), w)
        # 1024 of 1536 tokens match: rate 0.67; loads within the balance thresholds
        assert p.route(request([1, 2, 7]), FakeCluster(3, requests=loads)) == want, (name, loads)
        assert "best match" in p.rule


def test_vllm_tree_weighs_eight_hex_digits_a_token_and_evicts_every_120_s():
    p = make_policy("vllm_cache_aware", 2)
    assert p.name == "vllm_cache_aware" and p.eviction_interval_s == 120.0
    assert p.max_tree_size == 33_554_432 and p.tree.units_per_token == 8
    assert p.eviction == "per_worker"
    p.route(request([1, 2], tokens=1000), FakeCluster(2))
    assert p.tree.sizes == [8000, 0]
    assert make_policy("sglang_cache_aware", 2).eviction_interval_s == 60.0


def test_sglang_tree_matches_deepest_node_and_records_every_choice():
    tree = ApproxTree(2)
    tree.insert(request([1, 2, 3], tokens=1300), 0)
    tree.insert(request([1, 2]), 1)
    matched, node = tree.prefix_match(request([1, 2, 3], tokens=1300))
    assert matched == 1300 and list(node.tenants) == [0]
    matched, node = tree.prefix_match(request([1, 2, 9]))
    assert matched == 1024 and list(node.tenants) == [0, 1]  # node 2's holders, oldest first
    assert tree.prefix_match(request([5]))[1] is None
    # the partial last block weighs its own tokens
    assert tree.sizes == [1300 * CHARS_PER_TOKEN, 1024 * CHARS_PER_TOKEN]
    assert tree.check() == []


def test_sglang_eviction_drops_least_recent_leaves_down_to_max_tree_size():
    tree = ApproxTree(1)
    tree.insert(request([1, 2]), 0)       # epoch 0
    tree.insert(request([3, 4]), 0)       # epoch 1
    tree.insert(request([1, 5]), 0)       # epoch 2 on node 5
    block = 512 * CHARS_PER_TOKEN
    tree.evict(4 * block)  # 5 blocks held: the least recent leaf (2) goes
    assert 2 not in tree.nodes and {1, 3, 4, 5} <= set(tree.nodes)
    tree.evict(2 * block)  # then 4, then 3 (its parent, same epoch), leaving [1, 5]
    assert set(tree.nodes) - {-1} == {1, 5}
    assert tree.sizes == [2 * block] and tree.check() == []


def test_shared_eviction_cuts_the_whole_tree_oldest_leaf_of_any_worker_first():
    tree = ApproxTree(2, 1)
    tree.insert(request([1, 2]), 0)        # epoch 0
    tree.insert(request([1, 3]), 1)        # epoch 1: worker 1 joins block 1
    tree.insert(request([4]), 1)           # epoch 2
    assert tree.sizes == [1024, 1536]
    tree.evict_shared(2100)                # 2560 held: worker 0's leaf 2 goes (the oldest)
    assert tree.sizes == [512, 1536] and 2 not in tree.nodes
    tree.evict_shared(1000)                # then 0's block 1 (epoch 0), 1's block 3 (epoch 1),
    assert tree.sizes == [0, 512]          # 1's block 1 (a leaf now, epoch 0); block 4 stays
    assert set(tree.nodes) - {-1} == {4} and tree.check() == []
    per = ApproxTree(2, 1)
    for blocks, w in (([1, 2], 0), ([1, 3], 1), ([4], 1)):
        per.insert(request(blocks), w)
    per.evict(1024)                        # per worker: only worker 1 is over 1024
    assert per.sizes == [1024, 1024]


def test_sglang_evicts_on_its_interval_in_trace_time():
    p = CacheAware(1, **{**VARIANTS["sglang_cache_aware_code"], "max_tree_size": 512 * CHARS_PER_TOKEN})
    p.route(request([1, 2, 3]), FakeCluster(1, now=0.0))
    assert len(p.tree.nodes) == 4
    p.route(request([1, 2, 3], index=1), FakeCluster(1, now=29.9))
    assert len(p.tree.nodes) == 4
    p.route(request([8], index=2), FakeCluster(1, now=30.0))  # evicts first, then records [8]
    assert set(p.tree.nodes) - {-1} == {1, 8}


# -- Dynamo ------------------------------------------------------------------------------------
def test_dynamo_cost_is_weight_times_prefill_blocks_plus_decode_blocks():
    p = DynamoKv(2)
    req = request([1, 2, 3, 4], tokens=2048)
    # worker 0 caches 2 leading blocks: prefill (2048 - 1024) / 512 = 2, decode 4 -> 6
    # worker 1 caches none: prefill 4, decode 4 -> 8
    assert p.logits(req, [2, 0]) == [6.0, 8.0]
    assert p.route(req, FakeCluster(2, matches=[2, 0])) == 0
    # worker 0 now has 1024 tokens to prefill and blocks {1,2,3,4} active.
    # next: [1, 2, 5] of 1500 tokens, cached 2 blocks on both workers:
    #   w0: (1024 + 1500 - 1024) / 512 = 2.9297 + (4 active + 1 new) = 7.9297
    #   w1: (0 + 476) / 512 = 0.9297 + 3 = 3.9297
    req2 = request([1, 2, 5], tokens=1500, index=1)
    logits = p.logits(req2, [2, 2])
    assert logits[0] == pytest.approx(1500 / 512 + 5) and logits[1] == pytest.approx(476 / 512 + 3)
    assert p.route(req2, FakeCluster(2, matches=[2, 2])) == 1
    w = DynamoKv(2, overlap_score_weight=2.0)
    assert w.logits(req, [2, 0]) == [2 * 2 + 4, 2 * 4 + 4]


def test_dynamo_ties_go_to_the_lowest_index_and_load_leaves_with_the_request():
    p = DynamoKv(3)
    assert p.route(request([1, 2]), FakeCluster(3)) == 0
    assert p.route(request([3, 4], index=1), FakeCluster(3)) == 1
    assert p.active_prefill == [1024, 1024, 0]
    p.prefilled(0, 0)
    assert p.active_prefill == [0, 1024, 0] and p.active_refs[0] == {1: 1, 2: 1}
    p.finished(0, 0)
    p.finished(1, 1)
    assert p.active_prefill == [0, 0, 0] and p.active_refs == [{}, {}, {}] and not p.pending


def test_dynamo_approx_trusts_its_own_decisions_for_the_ttl():
    p = make_policy("dynamo_kv_approx", 2)
    assert p.route(request([1, 2, 3]), FakeCluster(2, matches=[0, 3], now=0.0)) == 0
    p.finished(0, 0)
    # 119 s later its prediction (not the real cache) says worker 0 holds [1, 2, 3]
    assert p.overlaps(request([1, 2, 3]), FakeCluster(2, now=119.0)) == [3, 0]
    assert p.overlaps(request([1, 2, 3]), FakeCluster(2, now=120.0)) == [0, 0]


def test_dynamo_softmax_follows_the_rescaled_negated_costs():
    logits = [6.0, 8.0, 10.0]
    t = 0.5
    scale = -1.0 / ((10.0 - 6.0) * t)
    weights = [math.exp(v * scale - 6.0 * scale) for v in logits]
    probs = [w / sum(weights) for w in weights]
    rng = random.Random(11)
    draws = [rng.random() for _ in range(300)]
    want = [0 if u <= probs[0] else 1 if u <= probs[0] + probs[1] else 2 for u in draws]
    rng = random.Random(11)
    assert [softmax_pick(logits, t, rng) for _ in range(300)] == want
    assert softmax_pick([3.0, 1.0, 1.0], 0.0, rng) == 1


# -- llm-d ---------------------------------------------------------------------------------------
def test_llmd_prefix_scores_are_min_max_normalised_longest_prefixes():
    assert prefix_scores([0, 0, 0]) == [0.0, 0.0, 0.0]
    assert prefix_scores([0, 1, 0]) == [0.0, 1.0, 0.0]  # a lone match scores 1 however short
    assert prefix_scores([2, 6, 0, 4]) == [0.0, 1.0, 0.0, 0.5]
    assert queue_scores([3, 3]) == [1.0, 1.0]
    assert queue_scores([0, 4, 2]) == [1.0, 0.0, 0.5]


def test_llmd_weights_prefix_twice_kv_and_queue_once():
    # minmax: prefix [0, 1, .5] x 2, kv free [0.5, 0.1, 0.9], queue [1, 0, .5]
    p = LlmdPrecise(3, minmax=True)
    scores = p.scores([2, 6, 4], [0.5, 0.9, 0.1], [0, 4, 2])
    assert scores == pytest.approx([0 + 0.5 + 1.0, 2.0 + 0.1 + 0.0, 1.0 + 0.9 + 0.5])
    cluster = FakeCluster(3, matches=[2, 6, 4], usage=[0.5, 0.9, 0.1], waiting=[0, 4, 2])
    assert p.route(request([1, 2, 3, 4, 5, 6]), cluster) == 2
    # fraction: prefix [2/8, 6/8, 4/8] x 2 -> [0.5 + 0.5 + 1, 1.5 + 0.1 + 0, 1 + 0.9 + 0.5]
    f = make_policy("llmd_precise", 3)
    assert f.scores([2, 6, 4], [0.5, 0.9, 0.1], [0, 4, 2], 8) == pytest.approx([2.0, 1.6, 2.4])
    assert f.route(request(range(8)), cluster) == 2


def test_llmd_fraction_lets_load_win_when_only_a_shared_first_block_matches():
    # a new conversation: only pod 0 holds the shared first block of 20
    cluster = FakeCluster(2, matches=[1, 0], waiting=[3, 0], usage=[0.2, 0.0])
    assert make_policy("llmd_precise", 2).route(request(range(20)), cluster) == 1
    # the scorer's own min-max rates that lone one-block match 1.0: pod 0 wins anyway
    assert make_policy("llmd_precise_minmax", 2).route(request(range(20)), cluster) == 0


def test_llmd_ties_go_to_a_seeded_random_replica():
    picks = {LlmdPrecise(4, seed=s).route(request([1]), FakeCluster(4)) for s in range(40)}
    assert picks == {0, 1, 2, 3}
    assert (LlmdPrecise(4, seed=5).route(request([1]), FakeCluster(4))
            == LlmdPrecise(4, seed=5).route(request([1]), FakeCluster(4)))


def test_vllm_kv_aware_weighs_prefill_work_by_requests_in_flight():
    p = make_policy("vllm_kv_aware", 3)
    assert isinstance(p, VllmKvAware) and p.name == "vllm_kv_aware"
    # 2,000 tokens; worker 1 holds 3 blocks (1,536 tokens cached)
    matches = [0, 3, 0]
    # idle workers: the least uncached work wins
    assert p.route(request([1, 2, 3, 4], 2000, index=0), FakeCluster(3, matches=matches)) == 1
    assert p.last_scores == [2000, 464, 2000] and p.pending == [0, 464, 0]
    # one in flight at worker 1, 464 tokens pending: (464 + 464) * 2 = 1,856 < 2,000
    assert p.route(request([1, 2, 3, 4], 2000, index=1),
                   FakeCluster(3, matches=matches, requests=[0, 1, 0])) == 1
    assert p.last_scores == [2000, 1856, 2000] and p.pending == [0, 928, 0]
    # two in flight: (464 + 928) * 3 = 4,176; the idle workers tie at 2,000, the first wins
    assert p.route(request([1, 2, 3, 4], 2000, index=2),
                   FakeCluster(3, matches=matches, requests=[0, 2, 0])) == 0
    assert p.last_scores == [2000, 4176, 2000] and p.pending == [2000, 928, 0]
    assert p.kind == "score" and "in flight" in p.rule
    # a request leaves the pending work when it finishes; unknown or repeated ends change nothing
    p.finished(1, 1)
    p.finished(1, 1)
    p.finished(99, 0)
    assert p.pending == [2000, 464, 0] and sorted(p.in_flight) == [0, 2]


def test_vllm_kv_aware_credits_only_full_blocks_of_all_but_the_last_token_first_on_a_tie():
    # a prompt of exactly three blocks, all cached on worker 0: the last block holds the last
    # token, which is always computed, so two blocks are credited
    assert credited_blocks(3, 1536) == 2 and credited_blocks(3, 1537) == 3
    assert credited_blocks(5, 1600) == 3 and credited_blocks(0, 1) == 0
    p = make_policy("vllm_kv_aware", 2)
    assert p.route(request([1, 2, 3], 1536), FakeCluster(2, matches=[3, 0])) == 0
    assert p.last_scores == [512, 1536]
    # equal costs: the first worker in the router's order
    p = make_policy("vllm_kv_aware", 3)
    assert p.route(request([1, 2], 1024), FakeCluster(3, matches=[0, 1, 1], requests=[0, 1, 1])) == 0
    assert p.last_scores == [1024, 1024, 1024]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5 * 512), st.lists(st.integers(0, 6), min_size=3,
                                                               max_size=3),
                          st.booleans()), min_size=1, max_size=40))
def test_vllm_kv_aware_keeps_pending_work_of_what_is_in_flight(steps):
    """Random requests (tokens, each worker's matched blocks) and finishes: the pick always has
    the lowest cost (the first among equals), and each worker's pending work is the uncached
    tokens of exactly the requests routed there and not finished, as they were when routed."""
    p = make_policy("vllm_kv_aware", 3)
    loads = [0, 0, 0]
    live: dict[int, tuple[int, int]] = {}
    for i, (tokens, matches, finish) in enumerate(steps):
        blocks = list(range(max(1, math.ceil(tokens / 512))))
        r = p.route(request(blocks, tokens, index=i), FakeCluster(3, matches=matches,
                                                                   requests=loads))
        new = [tokens - 512 * credited_blocks(m, tokens) for m in matches]
        pend = [sum(w for q, w in live.values() if q == k) for k in range(3)]
        costs = [(new[k] + pend[k]) * (loads[k] + 1) for k in range(3)]
        assert p.last_scores == costs and r == costs.index(min(costs))
        assert all(1 <= new[k] <= tokens for k in range(3))
        live[i] = (r, new[r])
        loads[r] += 1
        if finish:
            j = min(live)
            q, _ = live.pop(j)
            loads[q] -= 1
            p.finished(j, q)
        assert p.pending == [sum(w for q, w in live.values() if q == k) for k in range(3)]


def test_the_registry_builds_exactly_the_vocabularys_policies_in_its_order():
    assert tuple(BUILDERS) == ROUTING_POLICIES
    assert policy_names() == list(ROUTING_POLICIES)
    for name in ROUTING_POLICIES:
        policy = make_policy(name, 3)
        assert policy.name == name and policy.n == 3


def test_the_vocabularys_routers_are_the_real_routers_and_vllm_routers_kv_mode():
    assert set(ROUTING_ROUTERS) == set(ROUTERS) | {"vllm-kv"}
    assert ROUTERS["vllm"].kv_model == "vllm_kv_aware" and ROUTERS["vllm"].kv_model in ROUTING_POLICIES
    assert {kind.model for kind in ROUTERS.values()} <= set(ROUTING_POLICIES)


def test_unknown_policy_names_the_choices():
    with pytest.raises(InvalidRequest) as exc:
        make_policy("fastest", 2)
    assert "fastest" in str(exc.value) and "round_robin" in str(exc.value)
    with pytest.raises(InvalidRequest, match="llmd_precise"):
        check_policies(["round_robin", "nope"])
    assert check_policies(["session", "session", "random"]) == ["session", "random"]
    assert {"round_robin", "sglang_cache_aware", "sglang_cache_aware_code", "vllm_cache_aware",
            "vllm_kv_aware", "dynamo_kv", "dynamo_kv_approx", "llmd_precise",
            "llmd_precise_minmax"} <= set(policy_names())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 6),
                          st.integers(0, 12 * 512 * CHARS_PER_TOKEN)), max_size=40))
def test_sglang_tree_keeps_its_invariants_and_evicts_down_to_the_limit(ops):
    """Random inserts of prefix-consistent prompts (ids name whole prefixes) for random workers,
    each followed by an eviction to a random limit: the tree stays consistent and no worker
    keeps more than the limit (per-worker eviction), or all of them together (shared)."""
    tree, shared = ApproxTree(3), ApproxTree(3)
    for worker, root, depth, limit in ops:
        blocks = [root * 100 + k for k in range(depth)]  # id = (root, position): a chain per root
        for t in (tree, shared):
            t.insert(request(blocks, tokens=512 * depth - 7), worker)
            assert t.check() == []
        tree.evict(limit)
        shared.evict_shared(limit)
        assert tree.check() == [] and shared.check() == []
        assert all(size <= limit for size in tree.sizes) and sum(shared.sizes) <= limit
