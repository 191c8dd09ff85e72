import json

import pytest

from workloads.cli import main, replay_main, scenario_main


def test_replay_writes_json_markdown_and_png(tmp_path, capsys):
    out = tmp_path / "rep"
    rc = replay_main(["--limit", "120", "--out", str(out), "--strategies", "paged,contiguous-max",
                      "--pool-tokens", "40000", "--quiet"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    row = report["strategies"]["paged"]
    for field in ("token_state_share", "reserved_share", "internal_waste_share",
                  "external_waste_share", "throughput_rps", "queueing_delay_p50_s",
                  "queueing_delay_p99_s", "preemptions", "ooms"):
        assert field in row
    assert "CC-BY 4.0" in report["attribution"] and "20.4%" in report["claim"]
    md = (out / "report.md").read_text()
    assert "| paged |" in md and "Splitwise" in md
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert "| contiguous-max |" in capsys.readouterr().out


def test_replay_progress_bar_goes_to_stderr(tmp_path, capsys):
    assert replay_main(["--limit", "50", "--out", str(tmp_path), "--strategies", "paged", "--no-png"]) == 0
    assert "100%" in capsys.readouterr().err


def test_replay_bad_trace_exits_2_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,5\n2.0,5\n")
    assert replay_main(["--trace", str(bad), "--out", str(tmp_path), "--quiet"]) == 2
    assert "line 3" in capsys.readouterr().err


def test_scenario_command_prints_a_report(tmp_path, capsys):
    assert scenario_main(["fragmentation", "--strategy", "contiguous", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ooms"]["fragmentation"] == 1
    assert json.loads((tmp_path / "scenario.json").read_text()) == printed


def test_module_entry_rejects_unknown_commands(capsys):
    assert main(["frobnicate"]) == 2


def test_scenario_fragmentation_compares_contiguous_and_paged_by_default(tmp_path, capsys):
    assert scenario_main(["fragmentation", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "contiguous" in text and "paged" in text
    assert "FAILED (fragmentation)" in text and "served" in text
    assert "largest free extent" in text and "utilization at the time" in text
    assert "contiguous failed a" in text and "paged served it and never failed for fragmentation" in text
    assert (tmp_path / "scenario.txt").read_text() == text
    cmp = json.loads((tmp_path / "scenario.json").read_text())
    contiguous, paged = cmp["strategies"]["contiguous"], cmp["strategies"]["paged"]
    assert contiguous["ooms"]["fragmentation"] == 1 and paged["ooms"]["fragmentation"] == 0
    (big,) = contiguous["probes"]
    assert not big["served"] and big["cause"] == "fragmentation"
    assert big["largest_free_bytes"] < big["requested_bytes"] <= big["free_bytes"]
    assert 0 < big["utilization"] < 1
    assert contiguous["peak_external_fragmentation"] > 0.5
    assert paged["probes"][0]["served"] and paged["peak_external_fragmentation"] == 0.0
    assert paged["probes"][0]["requested_bytes"] == big["requested_bytes"]  # the same seeded ops


def test_scenario_fragmentation_json_flag_prints_the_comparison_as_json(capsys):
    assert scenario_main(["fragmentation", "--json", "--seed", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["strategies"]) == {"contiguous", "paged"} and printed["seed"] == 3


def test_explicit_strategy_runs_only_that_one(capsys):
    assert scenario_main(["fragmentation", "--strategy", "paged"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["strategy"] == "paged" and "strategies" not in printed
    assert scenario_main(["burst", "--blocks", "256"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"] == "paged"


@pytest.mark.parametrize("argv, message", [
    (["scenario", "fragmentation", "--seed", "-1"], "--seed"),
    (["scenario", "burst", "--blocks", "0"], "--blocks"),
    (["scenario", "chat", "--policy", "nope"], "unknown policy"),
    (["replay", "--pool-tokens", "0", "--quiet"], "--pool-tokens"),
    (["replay", "--limit", "0", "--quiet"], "--limit"),
])
def test_bad_arguments_exit_2_with_a_message_naming_the_flag(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # a refused run leaves no output directory behind


def test_replay_with_an_unusable_out_fails_before_replaying(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert replay_main(["--limit", "20", "--out", str(blocker / "rep"), "--quiet"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_replay_deduplicates_strategies(tmp_path, capsys):
    assert replay_main(["--limit", "20", "--out", str(tmp_path), "--strategies", "paged,paged",
                        "--quiet", "--no-png"]) == 0
    assert capsys.readouterr().out.count("| paged |") == 1


def test_module_help_exits_0(capsys):
    assert main(["-h"]) == 0
    assert "scenario" in capsys.readouterr().out
