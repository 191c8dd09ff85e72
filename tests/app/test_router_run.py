"""`kvscope route --router`: the bundled trace through the real sglang-router and vllm-router (from
their PyPI packages) in front of simulated engines, over real HTTP. Which engine served a request
is read at the engines; the hit ratio recomputed from the decision log equals the engines' own
counters; a missing router package or an unknown router is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.apputil import ROOT

from app.engines.router_run import run_router
from workloads.mooncake import load_mooncake
from workloads.routing.decisions import DecisionLog
from workloads.routing.real_router import ROUTERS, RouterKind, RouterUnavailable, require

REQUESTS = 200


@pytest.mark.parametrize("router", ["sglang", "vllm", "vllm-kv"])
def test_a_real_router_over_simulated_engines_adds_up_from_the_engines(router):
    trace = load_mooncake(limit=REQUESTS)
    # enough KV per engine for every token of the 200 requests (2,853,558): nothing is preempted,
    # so the engines' counters (which count a re-admission again) equal the log exactly
    capacity = 3_000_000
    log = DecisionLog(f"router:{router}", 3, capacity)
    row = run_router(trace, router=router, n=3, capacity_tokens=capacity, speed=20, decisions=log)
    assert row["failed"] == 0 and row["routed"] == REQUESTS and row["completed"] == REQUESTS, row
    # vllm-kv: vllm-router's kv_aware, on the engines' KV events (it says when it falls back)
    assert not row["router_fell_back_to_load"]
    assert sum(row["replica_requests"]) == REQUESTS
    assert row["preemptions"] == 0
    assert row["hit_ratio"] == pytest.approx(row["engine_hit_ratio"], abs=1e-9), row
    assert 0 < row["hit_ratio"] <= row["available_hit_ratio"] + 1e-9
    recs = list(log.records())
    assert sorted(r["request"] for r in recs) == list(range(REQUESTS))
    assert sum(r["captured_tokens"] for r in recs) == row["hit_tokens"]
    for r in recs:
        assert r["rule"] == "router" and len(r["candidates"]) == 3
        assert r["best_matched_blocks"] == max(c["matched_blocks"] for c in r["candidates"])
        assert 0 <= r["captured_tokens"] < trace.input_length[r["request"]]


@pytest.mark.parametrize("router, model", [("sglang", "sglang_cache_aware"),
                                           ("vllm-kv", "vllm_kv_aware")])
def test_the_route_router_cli_writes_its_row_and_decisions(tmp_path, router, model):
    out = tmp_path / "out"
    dec = tmp_path / "d.jsonl"
    r = subprocess.run([sys.executable, "-m", "app.cli", "route", "--router", router,
                        "--replicas", "2", "--limit", "120", "--speed", "20", "--capacity-tokens",
                        "300000", "--decisions", str(dec), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    row = json.loads((out / "route_router.json").read_text())
    assert row["policy"] == f"router:{router}" and row["routed"] == 120
    # the lab's model of that router, on the same requests in serving mode, beside it
    assert row["model"]["policy"] == model
    assert 0 <= row["model"]["hit_ratio"] <= row["model"]["available_hit_ratio"] + 1e-9
    assert len(dec.read_text().splitlines()) == 120
    assert f"| real {router} router |" in r.stdout
    assert f"| lab model `{model}` (serving mode) |" in r.stdout
    assert "fell back to load-only" not in r.stderr
    assert row["hit_ratio"] <= row["pooled_bound_hit_ratio"] <= row["infinite_bound_hit_ratio"]
    assert "pooled Belady" in r.stdout


def test_unknown_or_missing_routers_are_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "app.cli", "route", "--router", "nginx", "--limit", "5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown router 'nginx'" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1
    missing = RouterKind("sglang", "sglang-router", "no_such_router_module", "0.3.2", (), "x")
    with pytest.raises(RouterUnavailable, match=r"pip install 'kvscope\[routers\]'"):
        require(missing)
    assert set(ROUTERS) == {"sglang", "vllm"}
