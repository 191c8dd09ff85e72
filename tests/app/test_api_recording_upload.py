"""Uploading a recording (POST /api/recordings/upload) to a real server: a pool history is kept
under a name the server chooses and served read-only; anything else is refused with what the
file is, a body over the cap is 413 with the cap, a type other than octet-stream is 415, and a
refused upload leaves no pool and no file behind."""

from __future__ import annotations

import re
import sqlite3

import httpx
import pytest
from apputil import Server, assert_error

from allocator import create_pool
from allocator.recording import Recorder

OCTET = {"Content-Type": "application/octet-stream"}
MAX_UPLOAD = 256 * 1024
MAX_POOLS = 8
MAX_BODY = 8192  # every other body: an upload may be larger (its own cap, KVSCOPE_MAX_UPLOAD)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    rec_dir = tmp_path_factory.mktemp("recordings")
    server = Server(env={"KVSCOPE_RECORDINGS_DIR": str(rec_dir), "KVSCOPE_MAX_UPLOAD": str(MAX_UPLOAD),
                         "KVSCOPE_MAX_BODY": str(MAX_BODY), "KVSCOPE_MAX_POOLS": str(MAX_POOLS)})
    server.dir = rec_dir
    yield server
    log = server.stop()
    assert "Traceback" not in log, log


@pytest.fixture
def c(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


def recording(tmp_path, name: str = "local.kvrec") -> tuple[bytes, dict]:
    """A pool history recording made here, and the pool's stats at its end."""
    pool = create_pool("contiguous", num_blocks=64, block_bytes=128, device="cpu", name="made-here")
    rec = Recorder(pool, tmp_path / name)
    ids = [pool.allocate(100 + 37 * i) for i in range(12)]
    for aid in ids[::3]:
        pool.free(aid)
    rec.stop()
    return (tmp_path / name).read_bytes(), pool.stats()


def listing(c, srv) -> tuple[list, list]:
    return sorted(p["name"] for p in c.get("/api/pools").json()["pools"]), sorted(p.name for p in srv.dir.iterdir())


def test_an_uploaded_recording_is_kept_under_the_servers_name_and_served_read_only(c, srv, tmp_path):
    data, stats = recording(tmp_path)
    assert len(data) > MAX_BODY  # past the cap of every other body
    assert_error(c.post("/api/pools", content=b" " * len(data), headers={"Content-Type": "application/json"}),
                 413, "too_large")
    r = c.post("/api/recordings/upload", content=data, headers=OCTET)
    assert r.status_code == 201, r.text
    body = r.json()
    name, pool = body["recording"], body["name"]
    assert name.startswith("upload-") and pool == f"rec-{name}"
    assert (srv.dir / f"{name}.kvrec").read_bytes() == data
    assert not [p for p in srv.dir.iterdir() if p.name.startswith(".")]  # no part file left
    live = c.get(f"/api/pools/{pool}/stats").json()
    for key in ("used_blocks", "requested_bytes", "allocation_count", "external_fragmentation"):
        assert live[key] == stats[key], key
    assert c.get(f"/api/pools/{pool}/history").json()["last_seq"] == stats["last_event_seq"]
    assert_error(c.post(f"/api/pools/{pool}/reset", json={}), 409, "conflict")
    listed = {x["name"]: x for x in c.get("/api/recordings").json()["recordings"]}
    assert listed[name]["pool"] == "made-here" and listed[name]["complete"] is True
    assert c.get(f"/api/recordings/{name}/file").content == data


def test_what_is_not_a_pool_history_is_422_saying_what_it_is(c, srv, tmp_path):
    from kvevents.recording import Recorder as EventRecorder

    events = EventRecorder(str(tmp_path / "mirror.kvevents"))
    events.write(1.0, 0, b"kv", b"\x93\x00\x90\x00")
    events.close()
    db = sqlite3.connect(tmp_path / "other.db")
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    data, _ = recording(tmp_path)
    big = bytearray(data)
    before = listing(c, srv)
    cases = [
        ((tmp_path / "mirror.kvevents").read_bytes(), "KV-event recording .*`kvscope recording FILE`"),
        (b"\x80\x04\x95 a pickle", "a pickle"),
        (b"just some text", "neither an SQLite pool history nor a KV-event recording"),
        ((tmp_path / "other.db").read_bytes(), "SQLite database but not a kvscope recording"),
        (data[: len(data) // 2], "not a kvscope recording|corrupt"),
        (bytes(big[:100]) + b"\0" * (len(big) - 100), "not a kvscope recording|corrupt"),
    ]
    for payload, what in cases:
        err = assert_error(c.post("/api/recordings/upload", content=payload, headers=OCTET), 422, "invalid_request")
        assert re.search(what, err["message"]), (what, err["message"])
        assert "the uploaded file" in err["message"] and str(srv.dir) not in err["message"]
    assert_error(c.post("/api/recordings/upload", content=b"", headers=OCTET), 422, "invalid_request")
    assert listing(c, srv) == before


def test_a_recording_of_a_pool_too_large_for_this_server_is_refused(c, srv, tmp_path):
    data, _ = recording(tmp_path)
    path = tmp_path / "local.kvrec"
    db = sqlite3.connect(path)
    db.execute("""UPDATE meta SET value = '{"strategy": "paged", "num_blocks": 1000000000000,
                  "block_bytes": 16, "scatter_fails": false}' WHERE key = 'geometry'""")
    db.commit()
    db.close()
    before = listing(c, srv)
    err = assert_error(c.post("/api/recordings/upload", content=path.read_bytes(), headers=OCTET),
                       422, "invalid_request")
    assert "too large" in err["message"]
    assert listing(c, srv) == before


def test_a_body_over_the_cap_is_413_with_the_cap_declared_or_streamed(c, srv):
    before = listing(c, srv)
    err = assert_error(c.post("/api/recordings/upload", content=b"\0" * (MAX_UPLOAD + 1), headers=OCTET),
                       413, "too_large")
    assert err["details"]["max_bytes"] == MAX_UPLOAD and str(MAX_UPLOAD) in err["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(MAX_UPLOAD // 65536 + 2):
            yield b"\0" * 65536

    with httpx.Client(base_url=srv.url, timeout=30) as fresh:  # the server closes the refused one
        r = fresh.post("/api/recordings/upload", content=chunks(), headers=OCTET)
    err = assert_error(r, 413, "too_large")
    assert err["details"]["max_bytes"] == MAX_UPLOAD
    assert listing(c, srv) == before


def test_only_octet_stream_from_the_servers_own_origin_is_taken(c, srv, tmp_path):
    data, _ = recording(tmp_path)
    before = listing(c, srv)
    for ctype in ("application/json", "text/plain", "multipart/form-data; boundary=x",
                  "application/x-www-form-urlencoded"):
        err = assert_error(c.post("/api/recordings/upload", content=data, headers={"Content-Type": ctype}),
                           415, "unsupported_media_type")
        assert "application/octet-stream" in err["message"]
    assert_error(c.post("/api/recordings/upload", content=data), 415, "unsupported_media_type")
    evil = {**OCTET, "Origin": "http://evil.example"}
    assert_error(c.post("/api/recordings/upload", content=data, headers=evil), 403, "origin_not_allowed")
    assert listing(c, srv) == before


def every_kind_recording(path) -> int:
    """A recording with every kind of event a pool makes (cache, pin, extend, truncate,
    defragment, OOM, policy, reset); returns its last seq."""
    from allocator import KVCache, OutOfMemory

    pool = create_pool("contiguous", num_blocks=64, block_bytes=128, device="cpu", name="kinds")
    cache = KVCache(pool, 32 * 128, "lru")
    rec = Recorder(pool, path)
    a = pool.allocate(300)
    pool.extend(a, 500)
    pool.truncate(a, 200)
    for i in range(12):
        cache.put(f"k{i}", 700)  # evicts once the cache is full
    cache.get("k11")
    cache.get("nope")
    cache.pin("k11")
    cache.pin("k11", False)
    cache.policy = "fifo"
    pool.free(a)
    pool.defragment()
    try:
        pool.allocate(64 * 128)
    except OutOfMemory:
        pass
    pool.reset()
    rec.stop()
    return pool.events.last_seq


def test_a_recording_of_every_kind_of_event_uploads_and_its_events_answer(c, tmp_path):
    last = every_kind_recording(tmp_path / "kinds.kvrec")
    r = c.post("/api/recordings/upload", content=(tmp_path / "kinds.kvrec").read_bytes(), headers=OCTET)
    assert r.status_code == 201, r.text
    pool = r.json()["name"]
    events = c.get(f"/api/pools/{pool}/history/events", params={"limit": 10_000}).json()["events"]
    kinds = {e["type"] for e in events}
    assert {"allocate", "extend", "truncate", "put", "evict", "hit", "miss", "state", "policy", "free",
            "defragment", "oom", "reset"} <= kinds, kinds
    assert events[-1]["seq"] == last
    cols = c.get(f"/api/pools/{pool}/history/series").json()["columns"]
    assert sum(cols["evictions"]) == sum(e["type"] == "evict" for e in events) > 0
    assert c.get(f"/api/pools/{pool}/export", params={"format": "csv"}).status_code == 200


def crafted(tmp_path, change) -> bytes:
    """The every-kind recording with one stored event changed by `change(row) -> row`."""
    from allocator.history import Segment

    path = tmp_path / "crafted.kvrec"
    path.unlink(missing_ok=True)
    every_kind_recording(path)
    db = sqlite3.connect(path)
    first, blob = db.execute("SELECT first, blob FROM segments ORDER BY first LIMIT 1").fetchone()
    rows = Segment(first, first, blob).rows()
    rows = [change(r) for r in rows]
    db.execute("UPDATE segments SET blob = ? WHERE first = ?", (Segment.pack(rows).blob, first))
    db.commit()
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("what,change", [
    ("an OOM of an unknown cause", lambda r: r[:6] + ("bogus",) if r[2] == "oom" else r),
    ("a block id past the map", lambda r: r[:7] + (10**6,) + r[8:] if r[2] == "allocate" else r),
    ("a key that is not text", lambda r: (*r[:3], b"\xff\xfe", *r[4:]) if r[2] == "put" else r),
    ("a time that is not a number", lambda r: (r[0], float("nan"), *r[2:]) if r[2] == "hit" else r),
    ("an unknown kind", lambda r: (*r[:2], "teleport", *r[3:]) if r[2] == "miss" else r),
    ("a seq out of order", lambda r: (r[0] + 1, *r[1:]) if r[2] == "miss" else r),
])
def test_a_recording_with_a_crafted_event_is_422_not_a_later_500(c, srv, tmp_path, what, change):
    before = listing(c, srv)
    err = assert_error(c.post("/api/recordings/upload", content=crafted(tmp_path, change), headers=OCTET),
                       422, "invalid_request")
    assert "the uploaded file is corrupt" in err["message"], (what, err["message"])
    assert listing(c, srv) == before


def test_with_no_room_for_another_pool_the_upload_is_409_and_keeps_nothing(c, srv, tmp_path):
    data, _ = recording(tmp_path)
    fillers = []
    while len(c.get("/api/pools").json()["pools"]) < MAX_POOLS:
        name = f"filler{len(fillers)}"
        assert c.post("/api/pools", json={"name": name, "num_blocks": 4, "block_bytes": 64}).status_code == 201
        fillers.append(name)
    try:
        before = listing(c, srv)
        err = assert_error(c.post("/api/recordings/upload", content=data, headers=OCTET), 409, "conflict")
        assert f"at most {MAX_POOLS} pools" in err["message"]
        assert listing(c, srv) == before
    finally:
        for name in fillers:
            c.delete(f"/api/pools/{name}")


def test_a_killed_servers_upload_parts_are_swept_at_start(tmp_path) -> None:
    """Part files untouched for an hour (a server killed mid-upload) go when the next server
    starts on the directory; a fresh one (another server's upload in flight) stays."""
    import os
    import time

    from app.recordings import STALE_PART_S, Recordings

    old = tmp_path / ".upload-0123456789abcdef.part"
    old_wal = tmp_path / ".upload-0123456789abcdef.part-wal"
    fresh = tmp_path / ".upload-fedcba9876543210.part"
    kept = tmp_path / "run1.kvrec"
    for f in (old, old_wal, fresh, kept):
        f.write_bytes(b"x")
    stale = time.time() - STALE_PART_S - 60
    for f in (old, old_wal, kept):
        os.utime(f, (stale, stale))
    Recordings(tmp_path, registry=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, kept.name]
