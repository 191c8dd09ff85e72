import json

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
