import pytest

from allocator import InvalidRequest
from workloads.scenarios import Geometry, make_scenario, run_scenario


def test_fragmentation_fails_a_large_request_on_contiguous_with_cause_fragmentation():
    r = run_scenario("fragmentation", "contiguous", seed=0)
    assert r["ooms"]["fragmentation"] == 1
    frag = [f for f in r["failures"] if f["cause"] == "fragmentation"][0]
    assert frag["requested_bytes"] <= frag["free_bytes"]
    assert frag["requested_bytes"] > frag["largest_free_bytes"]
    assert r["check"] == [] and r["held"] == 0


def test_fragmentation_never_fails_for_fragmentation_on_paged():
    r = run_scenario("fragmentation", "paged", seed=0)
    assert r["ooms"]["fragmentation"] == 0
    assert r["ooms"]["capacity"] == 1  # only the fill phase's deliberate "pool is full"
    assert r["check"] == []


def test_chat_hits_and_evicts_on_a_real_cache():
    r = run_scenario("chat", "paged", seed=0)
    assert 0.3 < r["hit_rate"] < 1.0
    assert r["evictions"] > 0
    assert r["check"] == []


def test_burst_fills_and_drains():
    r = run_scenario("burst", "paged", seed=3)
    assert r["peak_utilization"] > 0.9
    assert r["ooms"]["capacity"] > 0
    assert r["check"] == [] and r["held"] == 0


@pytest.mark.parametrize("name", ["fragmentation", "chat", "burst"])
def test_scenarios_are_deterministic_given_a_seed(name):
    a = run_scenario(name, "contiguous", seed=7)
    b = run_scenario(name, "contiguous", seed=7)
    assert a == b
    geo = Geometry(1024, 1000, 1 << 20)
    ops = lambda s: [op for op, _ in zip(make_scenario(name, s, geo), range(50))]  # noqa: E731
    assert ops(7) == ops(7)
    assert ops(7) != ops(8)


def test_unknown_scenario_and_chat_without_cache_are_rejected():
    with pytest.raises(InvalidRequest, match="unknown scenario"):
        make_scenario("nope", 0, Geometry(1, 1))
    with pytest.raises(InvalidRequest, match="needs a pool with a cache"):
        next(make_scenario("chat", 0, Geometry(1024, 100, 0)))
