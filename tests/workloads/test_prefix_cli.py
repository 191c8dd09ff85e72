"""`kvscope prefix` end to end on a slice of the bundled Mooncake trace."""

import json

import pytest

from app.cli import main as kvscope
from workloads.cli import prefix_main
from workloads.mooncake import load_mooncake
from workloads.prefix_curve import prepare, run_point


def test_prefix_writes_json_markdown_and_png_for_every_point(tmp_path, capsys):
    out = tmp_path / "rep"
    rc = kvscope(["prefix", "--limit", "400", "--out", str(out),
                  "--capacity-tokens", "1e5,300000,1_000_000", "--policies", "lru,s3fifo,belady"])
    assert rc == 0
    report = json.loads((out / "prefix_report.json").read_text())
    assert [(r["capacity_tokens"], r["policy"]) for r in report["curve"]] == [
        (c, p) for c in (100_000, 300_000, 1_000_000) for p in ("lru", "s3fifo", "belady")]
    assert report["trace"]["requests"] == 400 and report["tokens_per_block"] == 512
    assert 0 < report["max_hit_ratio"] < 1
    assert all(0 <= r["hit_ratio"] <= report["max_hit_ratio"] for r in report["curve"])
    assert report["checks"]["belady_bounds_policies"] and report["checks"]["lru_non_decreasing"]
    # The file holds what the driver computes on the same slice.
    prep = prepare(load_mooncake(limit=400))
    assert report["curve"][0]["hit_ratio"] == run_point(prep, 100_000, "lru").hit_ratio
    assert report["max_hit_ratio"] == run_point(prep, None, "lru").hit_ratio
    md = (out / "prefix_report.md").read_text()
    assert "| 300k (300,000) |" in md and "Bélády MIN" in md and "Table 2" in md
    assert "Apache-2.0" in md and "prefix_report.png" in md
    assert (out / "prefix_report.png").read_bytes()[:4] == b"\x89PNG"
    captured = capsys.readouterr()
    assert "100%" in captured.err and "wrote" in captured.out


def test_prefix_quiet_no_png_and_sixteen_token_blocks(tmp_path, capsys):
    rc = prefix_main(["--limit", "60", "--out", str(tmp_path), "--capacity-tokens", "65536",
                      "--policies", "fifo", "--tokens-per-block", "16", "--quiet", "--no-png"])
    assert rc == 0
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "prefix_report.png").exists()
    report = json.loads((tmp_path / "prefix_report.json").read_text())
    assert report["tokens_per_block"] == 16 and len(report["curve"]) == 1
    assert "prefix_report.png" not in (tmp_path / "prefix_report.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--capacity-tokens", "100"], "--capacity-tokens: capacities must be integers of at least one block (512 tokens)"),
    (["--capacity-tokens", "lots"], "--capacity-tokens: 'lots' is not a number"),
    (["--capacity-tokens", "1.5"], "--capacity-tokens: '1.5' is not a positive whole number"),
    (["--policies", "lru,mru"], "--policies: unknown policies ['mru']"),
    (["--tokens-per-block", "48"], "--tokens-per-block must divide 512"),
    (["--limit", "0"], "limit must be a positive integer"),
])
def test_bad_arguments_exit_2_naming_the_flag(argv, message, tmp_path, capsys):
    assert prefix_main(["--out", str(tmp_path), "--quiet", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "prefix_report.json").exists()


def test_bad_trace_line_and_unwritable_out_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 10, "output_length": 1}\n')
    assert prefix_main(["--trace", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "bad.jsonl: line 2: missing field(s) hash_ids" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert prefix_main(["--out", str(blocker / "sub"), "--quiet"]) == 2
    assert "cannot write to output directory" in capsys.readouterr().err


def test_simulate_adds_the_serving_comparison(tmp_path, capsys):
    rc = prefix_main(["--limit", "120", "--out", str(tmp_path), "--capacity-tokens", "1e6",
                      "--policies", "lru", "--simulate", "--sim-pool-tokens", "300000", "--no-png"])
    assert rc == 0
    report = json.loads((tmp_path / "prefix_report.json").read_text())
    serving = report["serving"]
    assert serving["config"]["pool_tokens"] == 300_000
    assert serving["modes"]["prefix"]["completed"] == serving["modes"]["no-prefix"]["completed"] == 120
    assert serving["modes"]["prefix"]["prefill_tokens"] < serving["modes"]["no-prefix"]["prefill_tokens"]
    md = (tmp_path / "prefix_report.md").read_text()
    assert "## Serving with prefix caching" in md and "| on |" in md and "| off |" in md
    err = capsys.readouterr().err
    assert "serving prefix" in err and "serving no-prefix" in err


def test_simulate_with_a_pool_too_small_names_the_flag(tmp_path, capsys):
    assert prefix_main(["--out", str(tmp_path), "--simulate", "--sim-pool-tokens", "1000", "--quiet"]) == 2
    assert "--sim-pool-tokens: the pool (992 tokens) must hold one max-length sequence" in capsys.readouterr().err


def test_simulate_rejects_a_non_positive_prefill_speed(tmp_path, capsys):
    assert prefix_main(["--out", str(tmp_path), "--simulate", "--sim-prefill-tokens-per-s", "0", "--quiet"]) == 2
    assert "--sim-prefill-tokens-per-s must be a positive number" in capsys.readouterr().err
