"""The decision log: one record per routed request and policy, in sequence and serving mode, whose
figures add up to the run's own (hit tokens, available tokens, requests per replica), with the
rule and the candidates as the policy saw them; `kvscope route --decisions FILE`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from routing_util import random_rows, trace_of

from workloads.routing import make_policy, policy_names
from workloads.routing.cli import route_main
from workloads.routing.decisions import RULES, DecisionLog
from workloads.routing.sequence import requests, run_sequence
from workloads.routing.serving import run_serving


def logged(mode: str, trace, policy: str, n: int, capacity: int) -> tuple[dict, DecisionLog]:
    log = DecisionLog(policy, n, capacity)
    p = make_policy(policy, n, 0)
    run = run_sequence if mode == "sequence" else run_serving
    return run(trace, n, capacity, p, decisions=log), log


def check_against_the_run(figures: dict, log: DecisionLog, trace, n: int, mode: str) -> None:
    recs = list(log.records())
    reqs = list(requests(trace))
    assert [r["request"] for r in recs] == [q.index for q in reqs]  # every request, in order
    per_replica = [0] * n
    for rec, req in zip(recs, reqs):
        assert rec["rule"] in RULES and rec["why"], rec
        assert [c["replica"] for c in rec["candidates"]] == list(range(n))
        matched = [c["matched_blocks"] for c in rec["candidates"]]
        assert rec["best_matched_blocks"] == max(matched)
        best = req.prefix_tokens(max(matched))
        assert rec["available_tokens"] == (best if mode == "sequence" else min(best, req.tokens - 1))
        assert 0 <= rec["captured_tokens"] <= req.tokens
        per_replica[rec["replica"]] += 1
    assert per_replica == figures["replica_requests"]
    captured = sum(r["captured_tokens"] for r in recs)
    prompts = sum(q.tokens for q in reqs)
    assert captured / prompts == pytest.approx(figures["hit_ratio"], abs=1e-12)
    if mode == "serving":
        available = sum(r["available_tokens"] for r in recs)
        assert available / prompts == pytest.approx(figures["available_hit_ratio"], abs=1e-12)


@pytest.mark.parametrize("mode", ["sequence", "serving"])
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_logs_every_decision_and_the_log_adds_up_to_the_run(mode, policy):
    trace = trace_of(random_rows(3, requests=150))
    figures, log = logged(mode, trace, policy, 3, 16 * 512)  # holds the longest request
    check_against_the_run(figures, log, trace, 3, mode)
    assert log.summary()["decisions"] == 150 and log.dropped == 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 5), blocks=st.integers(1, 20))
def test_longest_prefix_always_captures_what_was_available(seed, n, blocks):
    """The policy that takes the replica with the longest cached prefix captures, request by
    request, exactly what the best replica held (sequence mode: nothing changes in between)."""
    trace = trace_of(random_rows(seed, requests=60))
    _, log = logged("sequence", trace, "longest_prefix", n, blocks * 512)
    for rec in log.records():
        assert rec["rule"] == "match"
        assert rec["captured_tokens"] == rec["available_tokens"], rec
        chosen = rec["candidates"][rec["replica"]]
        assert chosen["matched_blocks"] == rec["best_matched_blocks"]


def test_scores_and_loads_are_the_policys_own():
    trace = trace_of(random_rows(8, requests=80))
    _, dyn = logged("sequence", trace, "dynamo_kv", 3, 6 * 512)
    for rec in dyn.records():
        costs = [c["score"] for c in rec["candidates"]]
        assert rec["candidates"][rec["replica"]]["score"] == min(costs)  # temperature 0
    _, rr = logged("sequence", trace, "round_robin", 3, 6 * 512)
    for i, rec in enumerate(rr.records()):
        # sequence mode: the load is everything routed so far, round robin spreads it evenly
        assert [c["load"] for c in rec["candidates"]] == [i // 3 + (1 if r < i % 3 else 0)
                                                          for r in range(3)]
        assert rec["replica"] == i % 3 and rec["candidates"][0]["score"] is None


def test_a_log_keeps_at_most_its_bound_and_counts_the_rest():
    trace = trace_of(random_rows(1, requests=50))
    log = DecisionLog("round_robin", 2, 4096, keep=20)
    run_sequence(trace, 2, 4096, make_policy("round_robin", 2), decisions=log)
    assert len(log) == 20 and log.dropped == 30 and log.summary()["dropped"] == 30
    page, total = log.page(15, 10)
    assert total == 20 and [r["request"] for r in page] == list(range(15, 20))
    only, total = log.page(0, 100, replica=1)
    assert total == 10 and {r["replica"] for r in only} == {1}


def test_route_cli_writes_every_decision_of_every_point(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                         "hash_ids": ids}) + "\n"
                             for t, n, o, ids in random_rows(5, requests=90)))
    out = tmp_path / "decisions.jsonl"
    code = route_main(["--trace", str(trace), "--replicas", "2,3", "--capacity-tokens", "4096",
                       "--policies", "round_robin,sglang_cache_aware", "--decisions", str(out),
                       "--out", str(tmp_path / "r"), "--no-png", "--quiet", "--workers", "1"])
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4 * 90
    keys = [(r["policy"], r["replicas"]) for r in lines]
    assert keys == [(p, n) for p in ("round_robin", "sglang_cache_aware") for n in (2, 3)
                    for _ in range(90)]
    assert "wrote 360 decisions to" in capsys.readouterr().out
    report = json.loads((tmp_path / "r" / "route_report.json").read_text())
    rows = report["rows"] if "rows" in report else report["results"]
    assert all(row["decisions"]["decisions"] == 90 for row in rows)
    for row in rows:  # the log's captured tokens are the row's hit tokens
        assert row["decisions"]["captured_tokens"] == row["hit_tokens"]


def test_route_cli_refuses_a_decisions_file_it_cannot_write(tmp_path, capsys):
    code = route_main(["--limit", "10", "--policies", "round_robin", "--decisions",
                       str(tmp_path / "no" / "such" / "dir" / "d.jsonl"), "--out", str(tmp_path / "r"),
                       "--no-png", "--quiet"])
    assert code == 2
    assert "d.jsonl" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(40))))
def test_records_that_arrive_out_of_order_are_kept_in_request_order(order):
    # a real router's requests reach the engines out of order; the log pages them by request
    log = DecisionLog("router:x", 2, 1024)
    for i in order:
        log.add_record(i, i % 2, "router", "r", (0, 0), (0, 0), None, 0, None, 0)
    for i in order[::2]:
        log.captured(i, 10 * i)
    items, total = log.page(0, 100)
    assert total == 40 and [d["request"] for d in items] == list(range(40))
    caught = set(order[::2])
    assert all(d["captured_tokens"] == (10 * d["request"] if d["request"] in caught else None)
               for d in items)
