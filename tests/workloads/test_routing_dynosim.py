"""The serving simulator's DynoSim costs (`ServingCosts(model="dynosim")`, `kvscope route --costs
dynosim`): Dynamo's mocker's prefill and decode polynomials, exactly, on hand-computed cases; and
the lab's serving mode against Dynamo's own replay, DynoSim (`ai-dynamo-runtime`), on the same
trace, N and capacity: hit ratios within a point, TTFT within a factor of two."""

from __future__ import annotations

import os

import pytest
from routing_util import trace_of

from allocator import InvalidRequest
from workloads.mooncake import DEFAULT_MOONCAKE, load_mooncake
from workloads.routing import make_policy
from workloads.routing.serving import ServingCosts, run_serving
from workloads.simulator import DYNOSIM_CHUNK, dynosim_prefill_s, dynosim_step_s


def poly_ms(t: float) -> float:  # ai-dynamo lib/mocker/src/common/perf_model.rs
    return 4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01


def test_the_polynomials_are_dynamos():
    assert dynosim_prefill_s(0) == 0.0
    assert dynosim_prefill_s(100) == pytest.approx(poly_ms(100) / 1000)
    # a long prefill is chunked at the scheduler's token budget
    assert dynosim_prefill_s(2 * DYNOSIM_CHUNK + 100) == pytest.approx(
        (2 * poly_ms(DYNOSIM_CHUNK) + poly_ms(100)) / 1000)
    assert dynosim_step_s(0, 1000) == pytest.approx(5.74e-3)
    assert dynosim_step_s(500, 1000) == pytest.approx((-25.74 / 4 + 54.01 / 2 + 5.74) / 1000)
    assert dynosim_step_s(5000, 1000) == dynosim_step_s(1000, 1000) == pytest.approx(34.01e-3)


def test_a_lone_request_takes_the_mocker_s_prefill_and_its_repeat_only_the_rest():
    rows = [(0, 1100, 3, [1, 2, 3]), (100_000, 1100, 3, [1, 2, 3])]
    got = run_serving(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1),
                      ServingCosts(model="dynosim"))
    assert got["ttft_cdf_s"][-1] == pytest.approx(dynosim_prefill_s(1100))
    assert got["ttft_cdf_s"][0] == pytest.approx(dynosim_prefill_s(1100 - 1024))
    with pytest.raises(InvalidRequest, match="unknown cost model 'gpu'"):
        run_serving(trace_of(rows), 1, 10 * 512, make_policy("round_robin", 1), ServingCosts(model="gpu"))


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dynosim") / "head.jsonl"
    with open(DEFAULT_MOONCAKE) as src, open(path, "w") as dst:
        for i, line in enumerate(src):
            if i >= 1500:
                break
            dst.write(line)
    return path


@pytest.mark.parametrize("lab_policy, router_mode", [("round_robin", "round_robin"),
                                                     ("dynamo_kv", "kv_router")])
def test_serving_mode_with_dynosim_costs_agrees_with_dynosim(head_file, lab_policy, router_mode):
    os.environ.setdefault("DYN_LOG", "warn")
    import dynamo._core as dyn

    n, capacity = 4, 1_000_000
    out = dyn.run_mocker_trace_replay(
        [str(head_file)], extra_engine_args={"engine": {"block_size": 512,
                                                        "num_gpu_blocks": capacity // 512}},
        num_workers=n, trace_block_size=512, router_mode=router_mode,
        router_config=dyn.KvRouterConfig() if router_mode == "kv_router" else None)
    theirs = out.summary
    ours = run_serving(load_mooncake(head_file), n, capacity, make_policy(lab_policy, n),
                       ServingCosts(model="dynosim"))
    assert theirs["completed_requests"] == ours["completed"] == 1500
    assert ours["hit_ratio"] == pytest.approx(theirs["prefix_cache_reused_ratio"], abs=0.01)
    ratio = ours["ttft_p50_s"] / (theirs["median_ttft_ms"] / 1000)
    assert 0.5 < ratio < 2.0, (ours["ttft_p50_s"], theirs["median_ttft_ms"])
