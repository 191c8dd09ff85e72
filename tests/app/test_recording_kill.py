"""A real server killed with SIGKILL mid-recording: the file opens, holds everything committed
up to the last flush (at most the last second is lost), and replays the maps the server
answered while it ran. Then the same file is served read-only with `kvscope open`-style
settings and through POST /api/recordings/{name}/open."""

from __future__ import annotations

import os
import signal
import time

import httpx
from support.apputil import Server, assert_error

from allocator.history import map_runs
from allocator.history.recording import read_recording


def test_sigkill_mid_recording_loses_at_most_the_last_second(tmp_path):
    srv = Server(env={"KVSCOPE_RECORDINGS_DIR": str(tmp_path)})
    try:
        c = httpx.Client(base_url=srv.url, timeout=10)
        spec = {"name": "k1", "strategy": "contiguous", "num_blocks": 256, "block_bytes": 128}
        assert c.post("/api/pools", json=spec).status_code == 201
        r = c.post("/api/pools/k1/recording", json={"name": "killed"})
        assert r.status_code == 201, r.text
        assert_error(c.post("/api/pools/k1/recording", json={}), 409, "conflict")
        seen: list[tuple[float, int, list]] = []  # (time answered, seq, runs)
        ids: list[int] = []
        t_end = time.monotonic() + 2.5
        i = 0
        while time.monotonic() < t_end:
            i += 1
            if i % 3 and len(ids) < 40:
                resp = c.post("/api/pools/k1/allocations", json={"bytes": 100 + (i * 37) % 900})
                if resp.status_code == 201:
                    ids.append(resp.json()["id"])
            elif ids:
                c.delete(f"/api/pools/k1/allocations/{ids.pop(i % len(ids))}")
            bm = c.get("/api/pools/k1/blockmap?format=json").json()["runs"]
            seq = c.get("/api/pools/k1/stats").json()["last_event_seq"]
            seen.append((time.monotonic(), seq, bm))
        srv.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        srv.proc.wait(timeout=10)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    path = tmp_path / "killed.kvrec"
    assert path.exists() and os.path.exists(str(path) + "-wal")  # killed: the WAL was never checkpointed
    meta, view = read_recording(path)
    assert "stopped_at" not in meta and meta["pool"] == "k1"
    old_enough = [seq for t, seq, _ in seen if killed_at - t > 1.0]
    assert old_enough and view.last_seq >= max(old_enough)
    checked = 0
    for _, seq, runs in seen:
        if view.first_seq <= seq <= view.last_seq:
            rep = view.replay_to(seq)
            assert map_runs(rep.owner, rep.state) == runs, f"map differs at seq {seq}"
            checked += 1
    assert checked >= len(old_enough)

    # The killed file served read-only, like any pool.
    srv2 = Server(env={"KVSCOPE_RECORDINGS_DIR": str(tmp_path)})
    try:
        c = httpx.Client(base_url=srv2.url, timeout=10)
        listing = c.get("/api/recordings").json()["recordings"]
        assert [(x["name"], x["complete"], x["last_seq"]) for x in listing] == [("killed", False, view.last_seq)]
        r = c.post("/api/recordings/killed/open", json={})
        assert r.status_code == 201, r.text
        assert r.json()["name"] == "rec-killed"
        stats = c.get("/api/pools/rec-killed/stats").json()
        assert stats["last_event_seq"] == view.last_seq
        mid = (view.first_seq + view.last_seq) // 2
        past = c.get("/api/pools/rec-killed/blockmap", params={"format": "json", "at_seq": mid}).json()
        rep = view.replay_to(mid)
        assert past["runs"] == map_runs(rep.owner, rep.state)
        assert_error(c.post("/api/pools/rec-killed/allocations", json={"bytes": 10}), 409, "conflict")
        assert_error(c.post("/api/pools/rec-killed/defragment", json={}), 409, "conflict")
        assert c.get("/api/recordings/killed/file").content[:16] == b"SQLite format 3\x00"
    finally:
        log = srv2.stop()
    assert "Traceback" not in log, log
