"""`kvscope route`: the report it writes and how it refuses bad input."""

import json

import pytest
from routing_util import random_rows

from app.cli import main as kvscope
from workloads.routing.cli import route_main


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                        "hash_ids": ids}) + "\n"
                            for t, n, o, ids in random_rows(5, requests=150)))
    return path


def test_route_writes_json_markdown_and_png_for_every_point(trace_file, tmp_path, capsys):
    out = tmp_path / "out"
    rc = kvscope(["route", "--trace", str(trace_file), "--replicas", "2,3",
                  "--capacity-tokens", "4096,1e4", "--policies", "round_robin,longest_prefix",
                  "--out", str(out), "--workers", "1"])
    assert rc == 0
    rows = json.loads((out / "route_report.json").read_text())["results"]
    assert [(r["policy"], r["replicas"], r["capacity_tokens"]) for r in rows] == [
        (p, n, c) for p in ("round_robin", "longest_prefix") for n in (2, 3) for c in (4096, 10000)]
    for r in rows:
        assert r["mode"] == "sequence"
        assert 0 <= r["hit_ratio"] <= 1 and r["imbalance"] >= 1 and r["duplicated_blocks"] >= 0
        # the bounds of its (N, C), and its hit ratio as a share of the pooled one
        assert r["hit_ratio"] <= r["pooled_bound_hit_ratio"] <= r["infinite_bound_hit_ratio"] <= 1
        assert r["of_pooled_bound"] == r["hit_ratio"] / r["pooled_bound_hit_ratio"]
        assert r["pooled_bound_blocks"] == r["replicas"] * (r["capacity_tokens"] // 512)
    same = {(r["replicas"], r["capacity_tokens"]): r["pooled_bound_tokens"] for r in rows[:4]}
    assert all(same[r["replicas"], r["capacity_tokens"]] == r["pooled_bound_tokens"] for r in rows)
    assert (out / "route_report.png").stat().st_size > 1000
    md = (out / "route_report.md").read_text()
    assert "| Hit ratio | Imbalance | Duplicated blocks | Pooled bound | Of pooled bound | Infinite bound |" in md
    last = rows[-1]
    assert (f"| longest_prefix | 3 | 10,000 | {last['hit_ratio']:.1%} | {last['imbalance']:.2f} | "
            f"{last['duplicated_blocks']:,} | {last['pooled_bound_hit_ratio']:.1%} | "
            f"{last['of_pooled_bound']:.0%} | {last['infinite_bound_hit_ratio']:.1%} |") in md
    captured = capsys.readouterr()
    assert "route sequence" in captured.err  # the progress bar


def test_route_serving_mode_reports_ttft_and_available_hits(trace_file, tmp_path):
    out = tmp_path / "out"
    rc = route_main(["--trace", str(trace_file), "--replicas", "2", "--capacity-tokens", "20000",
                     "--policies", "round_robin,dynamo_kv", "--mode", "serving",
                     "--out", str(out), "--quiet", "--workers", "1"])
    assert rc == 0
    rows = json.loads((out / "route_report.json").read_text())["results"]
    assert len(rows) == 2
    for r in rows:
        assert r["mode"] == "serving" and r["completed"] == 150
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
        assert 0 <= r["hit_ratio"] <= 1 and 0 <= r["available_hit_ratio"] <= 1
        assert r["throughput_rps"] > 0
    assert "TTFT p50" in (out / "route_report.md").read_text()


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_unknown_policy_exits_2_naming_the_choices(trace_file, tmp_path, capsys):
    rc = route_main(["--trace", str(trace_file), "--policies", "round_robin,fastest",
                     "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 2
    line = _error(capsys)
    assert "'fastest'" in line and "sglang_cache_aware" in line and "llmd_precise" in line
    assert not (tmp_path / "o").exists()


def test_bad_trace_line_is_named_by_its_number(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 2, "input_length": 10, "output_length": 1}\n')
    assert route_main(["--trace", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    line = _error(capsys)
    assert "line 3" in line and "hash_ids" in line


@pytest.mark.parametrize("flag,value,words", [
    ("--replicas", "0", "below 1 replica"),
    ("--replicas", "2,-1", "below 1 replica"),
    ("--replicas", "two", "not a number"),
    ("--capacity-tokens", "100", "below one 512-token block"),
    ("--capacity-tokens", "1e6,511", "below one 512-token block"),
    ("--executor", "spark", "choose local, ray or ray:ADDRESS"),
])
def test_bad_grid_values_exit_2_with_a_clear_message(trace_file, tmp_path, capsys, flag, value, words):
    rc = route_main(["--trace", str(trace_file), flag, value, "--out", str(tmp_path / "o"),
                     "--quiet", "--policies", "round_robin"])
    assert rc == 2
    line = _error(capsys)
    assert words in line and (flag in line or flag == "--executor")


def test_unreachable_ray_address_is_one_line_and_exit_2(trace_file, tmp_path, capsys):
    rc = route_main(["--trace", str(trace_file), "--executor", "ray:127.0.0.1:9", "--quiet",
                     "--policies", "round_robin", "--out", str(tmp_path / "o")])
    assert rc == 2
    line = _error(capsys)
    assert "127.0.0.1:9" in line and line.startswith("error: ")


def test_a_serving_sweep_past_the_simulated_memory_is_refused_up_front(trace_file, tmp_path, capsys):
    rc = route_main(["--trace", str(trace_file), "--mode", "serving", "--replicas", "8",
                     "--capacity-tokens", "1e9", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 2
    assert "serving mode simulates at most" in _error(capsys)
