"""`kvscope record` writes a complete recording of a headless workload; `kvscope open` serves it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from allocator.history.recording import read_recording

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def open_server(path) -> tuple[subprocess.Popen, str]:
    """`kvscope open PATH --port P` on a free P, once it answers /healthz. P is chosen before the
    server binds it: a start that fails on "address already in use" tries a fresh P."""
    for attempt in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "app.cli", "open", str(path), "--port",
                                   str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60  # importing torch on a loaded machine takes a while
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    return server, url
            except httpx.HTTPError:
                time.sleep(0.1)
        if server.poll() is None:
            server.kill()
        text = server.communicate(timeout=10)[0].decode(errors="replace")
        if attempt == 2 or "address already in use" not in text.lower():
            raise AssertionError(f"kvscope open did not start:\n{text}")
    raise AssertionError("unreachable")


def test_record_a_scenario_then_open_it(tmp_path):
    out = tmp_path / "frag.kvrec"
    proc = run_cli("record", "fragmentation", "-o", str(out), "--strategy", "contiguous", "--blocks", "512")
    assert proc.returncode == 0, proc.stderr
    assert "recorded" in proc.stdout and str(out) in proc.stdout
    meta, view = read_recording(out)
    assert meta["workload"] == "fragmentation" and "stopped_at" in meta
    kinds = [e["type"] for e in view.events(limit=100_000)]
    assert kinds[0] == "workload" and kinds.count("allocate") > 10 and "oom" in kinds
    phases = [e["state"] for e in view.events(limit=100_000, kinds={"workload"})]
    assert phases[0] == "running" and phases[-1] == "finished"
    assert view.stats_at(view.last_seq)["allocation_count"] == 0  # the workload frees what it held
    again = run_cli("record", "fragmentation", "-o", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr

    server, url = open_server(out)
    try:
        names = [p["name"] for p in httpx.get(url + "/api/pools").json()["pools"]]
        assert "rec-frag" in names
        info = httpx.get(url + "/api/pools/rec-frag/history").json()
        assert (info["first_seq"], info["last_seq"]) == (view.first_seq, view.last_seq)
        ooms = httpx.get(url + "/api/pools/rec-frag/history/events", params={"kinds": "oom"}).json()["events"]
        assert ooms and all(e["type"] == "oom" for e in ooms)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_open_refuses_what_is_not_a_recording(tmp_path):
    bad = tmp_path / "bad.kvrec"
    bad.write_text("nope")
    proc = run_cli("open", str(bad))
    assert proc.returncode == 2 and "not a kvscope recording" in proc.stderr


def test_record_prefix_chat_on_a_prefix_caching_pool_replays_its_sharing(tmp_path):
    from workloads.record import record, record_parser

    out = tmp_path / "pc.kvrec"
    args = record_parser().parse_args(
        ["prefix-chat", "-o", str(out), "--blocks", "96", "--block-bytes", "64", "--quiet"])
    info = record(args, out=None)
    assert info["events"] > 0
    meta, view = read_recording(out)
    assert meta["config"]["prefix_caching"] == {"policy": "lru"}
    assert view.geometry["prefix_caching"]["policy"] == "lru"
    kinds = {e["type"] for e in view.events(limit=1_000_000)}
    assert {"open", "close", "stored"} <= kinds
    # some past moment had blocks shared between sequences, and it replays with its stats
    opens = [e for e in view.events(limit=1_000_000, kinds={"open"}) if e["shared_ids"]]
    assert opens
    seq = opens[0]["seq"]
    rep = view.replay_to(seq)
    assert (rep.state[opens[0]["shared_ids"]] == 4).all()
    stats = view.stats_at(seq)
    assert stats["blocks_by_state"]["shared"] >= len(opens[0]["shared_ids"]) and stats["used_blocks"] > 0
    plain = record_parser().parse_args(["prefix-chat", "-o", str(tmp_path / "plain.kvrec"), "--blocks", "96",
                                        "--block-bytes", "64", "--quiet", "--no-prefix-caching"])
    record(plain, out=None)
    assert "prefix_caching" not in read_recording(tmp_path / "plain.kvrec")[1].geometry
