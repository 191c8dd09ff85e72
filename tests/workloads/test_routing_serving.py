"""Serving mode: N simulated replicas behind a router, at the trace's timestamps."""

import pytest
from routing_util import random_rows, trace_of

from allocator import InvalidRequest
from workloads.mooncake import load_mooncake
from workloads.routing import make_policy
from workloads.routing.serving import ServingCosts, run_serving


@pytest.fixture(scope="module")
def head():
    return load_mooncake(limit=1500)


def test_cache_aware_policies_beat_round_robin_hit_ratio(head):
    base = run_serving(head, 4, 1_000_000, make_policy("round_robin", 4))
    for name in ("sglang_cache_aware", "dynamo_kv", "llmd_precise"):
        got = run_serving(head, 4, 1_000_000, make_policy(name, 4))
        assert got["hit_ratio"] > base["hit_ratio"] + 0.02, (name, got["hit_ratio"], base["hit_ratio"])
        assert got["completed"] == base["completed"] == 1500


def test_ttft_is_queueing_plus_the_prefill_of_uncached_tokens():
    # one replica, two identical prompts far apart: the first computes all 1100 tokens, the
    # second finds its two full blocks cached and computes 76
    rows = [(0, 1100, 3, [1, 2, 3]), (100_000, 1100, 3, [1, 2, 3])]
    costs = ServingCosts(prefill_token_s=0.001, model="linear")
    got = run_serving(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1), costs)
    assert got["ttft_cdf_s"][0] == pytest.approx(76 * 0.001)
    assert got["ttft_cdf_s"][-1] == pytest.approx(1100 * 0.001)
    assert got["hit_ratio"] == pytest.approx(1024 / 2200)
    assert got["available_hit_ratio"] == pytest.approx(1024 / 2200)
    faster = run_serving(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1),
                         ServingCosts(prefill_token_s=0.0005, model="linear"))
    assert faster["ttft_cdf_s"][-1] == pytest.approx(1100 * 0.0005)


def test_requests_admitted_together_get_their_first_tokens_in_turn():
    # one replica: the first request is admitted alone and stalls the replica 1.1 s; the next two
    # arrive meanwhile and are admitted together at 1.1 s, prefilled first come first served:
    # the 300-token one has its first token after its own 300 tokens, the 200-token one after both
    rows = [(0, 1100, 3, [1, 2, 3]), (0, 300, 3, [7]), (0, 200, 3, [8])]
    got = run_serving(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1),
                      ServingCosts(prefill_token_s=0.001, model="linear"))
    assert [round(x, 6) for x in (got["ttft_cdf_s"][0], got["ttft_cdf_s"][50], got["ttft_cdf_s"][-1])] == \
        [1.1, 1.4, 1.6]


class Watcher:
    """Wraps a policy; records the load it saw at each decision."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []

    def route(self, req, cluster):
        self.seen.append((req.index, sum(cluster.requests), list(cluster.waiting)))
        return self.policy.route(req, cluster)

    def prefilled(self, index, replica):
        self.policy.prefilled(index, replica)

    def finished(self, index, replica):
        self.policy.finished(index, replica)


def test_load_aware_policies_see_requests_finish():
    trace = trace_of(random_rows(3, requests=200))
    dynamo = make_policy("dynamo_kv", 3)
    watcher = Watcher(dynamo)
    got = run_serving(trace, 3, 20 * 512, watcher)
    assert got["completed"] == 200
    # in flight at each decision is below what was routed before it: requests finished
    assert any(in_flight < index for index, in_flight, _ in watcher.seen[50:])
    assert dynamo.pending == {} and dynamo.active_prefill == [0, 0, 0]
    assert dynamo.active_refs == [{}, {}, {}]


def test_serving_is_deterministic_and_checks_its_costs():
    trace = trace_of(random_rows(4, requests=120))
    a = run_serving(trace, 2, 30 * 512, make_policy("llmd_precise", 2))
    b = run_serving(trace, 2, 30 * 512, make_policy("llmd_precise", 2))
    assert a == b
    with pytest.raises(InvalidRequest, match="prefill_token_s"):
        run_serving(trace, 2, 30 * 512, make_policy("round_robin", 2), ServingCosts(prefill_token_s=-1, model="linear"))
    # a linear cost given to the default (DynoSim's) model would be ignored: refused instead
    with pytest.raises(InvalidRequest, match="model='linear'"):
        run_serving(trace, 2, 30 * 512, make_policy("round_robin", 2), ServingCosts(step_base_s=0.5))
    with pytest.raises(InvalidRequest, match="at most"):  # refused before any pool is built
        run_serving(trace, 64, 1 << 25, make_policy("round_robin", 64))
