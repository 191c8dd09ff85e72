"""`kvscope fleet`: two engines followed by a real server and recorded, the recording played back
into a second server with the same figures; and the arguments it refuses."""

from __future__ import annotations

import time

import httpx
import pytest
from support.kve_source import RefPrefixCache
from test_kve_cli import Cli, run
from test_real_publishers import DEADLINE, Engine

from app.cli import main


def fleet_state(cli, name="fleet") -> dict:
    return httpx.get(f"{cli.url}/api/fleets/{name}", timeout=5).json()


def test_fleet_command_records_and_the_recording_plays_back(ipc, vllm_kv, sglang_kv, tmp_path):
    rec = tmp_path / "fleet.kvevents"
    engines = {"e0": Engine(vllm_kv, "vllm", ipc("a"), ipc("ar")),
               "e1": Engine(sglang_kv, "sglang", ipc("b"), ipc("br"))}
    engines["e0"].source = RefPrefixCache(seed=1, hash_seed=5)
    engines["e1"].source = RefPrefixCache(seed=2, hash_seed=6)
    engines["e1"].source.prompts = engines["e0"].source.prompts
    cli = Cli("fleet", ipc("a"), ipc("b"), "--replay-endpoint", ipc("ar"), "--replay-endpoint",
              ipc("br"), "--topic", "kv", "--block-size", "4", "--record", str(rec))
    try:
        for _ in range(10):
            for e in engines.values():
                e.send(e.source.step())
        end = time.monotonic() + DEADLINE
        while True:
            rows = {r["name"]: r for r in fleet_state(cli)["engines"]}
            if all(rows[n]["batches"] >= e.seq + 1 for n, e in engines.items()):
                break
            assert time.monotonic() < end, rows
            for n, e in engines.items():
                if rows[n]["stream"]["last_seq"] is None:
                    e.send([])
            time.sleep(0.05)
        live = fleet_state(cli)
        assert {r["name"]: r["cached_blocks"] for r in live["engines"]} == \
            {n: len(e.source.cached) for n, e in engines.items()}
        assert live["stats"]["duplicated_blocks"] > 0
        assert live["recording"]["records"] == sum(e.seq + 1 for e in engines.values())
    finally:
        log = cli.stop()
        for e in engines.values():
            e.close()
    assert "Traceback" not in log, log
    player = Cli("fleet", "--play", str(rec), "--name", "again")
    try:
        end = time.monotonic() + DEADLINE
        while (fleet_state(player, "again").get("playback") or {}).get("state") != "done":
            assert time.monotonic() < end
            time.sleep(0.05)
        end = time.monotonic() + DEADLINE
        while fleet_state(player, "again")["stats"] != live["stats"]:
            assert time.monotonic() < end, fleet_state(player, "again")["stats"]
            time.sleep(0.05)
        rows = {r["name"]: r for r in fleet_state(player, "again")["engines"]}
        assert {n: r["cached_blocks"] for n, r in rows.items()} == \
            {r["name"]: r["cached_blocks"] for r in live["engines"]}
        assert rows["e0"]["stream"]["state"] == "recorded"
    finally:
        log = player.stop()
    assert "Traceback" not in log, log


@pytest.mark.parametrize("args, says", [
    ([], "at least one ENDPOINT"),
    (["tcp://h:1", "tcp://h:2", "--metrics-url", "http://m/metrics"], "--metrics-url once per endpoint"),
    (["nope://x"], "endpoint"),
    (["--play", "/nonexistent/f.kvevents"], "--play"),
    (["tcp://h:1", "--play", "x"], "--play takes no ENDPOINT"),
])
def test_fleet_command_refuses_bad_arguments(args, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(["fleet", *args])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_fleet_command_is_listed():
    r = run("--help")
    assert "fleet" in r.stdout and "many engines" in r.stdout
