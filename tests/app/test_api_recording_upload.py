"""Uploading a recording (POST /api/recordings/upload) to a real server: a pool history is kept
under a name the server chooses and served read-only; anything else is refused with what the
file is, a body over the cap is 413 with the cap, a type other than octet-stream is 415, and a
refused upload leaves no pool and no file behind."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import sqlite3
import struct

import httpx
import pytest
from support.apputil import Server, assert_error

from allocator import create_pool
from allocator.history.recording import Recorder

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
    pool = create_pool("contiguous", num_blocks=64, block_bytes=128, device="cpu", history=True, name="made-here")
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

    pool = create_pool("contiguous", num_blocks=64, block_bytes=128, device="cpu", history=True, name="kinds")
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


def edited(tmp_path, sql: str, params=(), strategy: str = "contiguous") -> bytes:
    """A recording made here with one SQL statement run on its file."""
    path = tmp_path / f"{strategy}.kvrec"
    path.unlink(missing_ok=True)
    pool = create_pool(strategy, num_blocks=64, block_bytes=128, device="cpu", history=True, name="made-here")
    rec = Recorder(pool, path)
    ids = [pool.allocate(64 + 5 * i) for i in range(12)]  # each fits a tiered pool's small tier
    for aid in ids[::4]:
        pool.free(aid)
    rec.stop()
    db = sqlite3.connect(path)
    db.execute(sql, params)
    db.commit()
    db.close()
    return path.read_bytes()


def pickle_claiming(opcode: bytes, size: int) -> bytes:
    """A protocol-5 pickle whose one opcode declares `size` bytes and holds three."""
    return b"\x80\x05" + opcode + struct.pack("<Q", size) + b"abc."


def shared_lists(depth: int) -> list:
    """A list of two references to a list of two references ... `depth` deep: a 400-byte
    pickle that is 2^depth elements to whoever walks it (as encoding an event to JSON does)."""
    out: list = []
    for _ in range(depth):
        out = [out, out]
    return out


GEOMETRY = {"strategy": "contiguous", "num_blocks": 64, "block_bytes": 128, "scatter_fails": True, "fit": "first"}


@pytest.mark.parametrize("what,sql,params,strategy,says", [
    ("segments.last as text", "UPDATE segments SET last = 'abc'", (), "contiguous", "segment 1..'abc'"),
    ("segments.last as a float", "UPDATE segments SET last = 2.5", (), "contiguous", "segment 1..2.5"),
    ("a segment blob as text", "UPDATE segments SET blob = 'abc'", (), "contiguous", "not events first..last as bytes"),
    ("a keyframe's pages as text", "UPDATE keyframes SET state_z = 'abc'", (), "paged", "pages are str"),
    ("meta config nested 100,000 deep", "UPDATE meta SET value = ? WHERE key = 'config'",
     ("[" * 100_000 + "]" * 100_000,), "contiguous", "recursion"),
    ("meta config nested 40 deep", "UPDATE meta SET value = ? WHERE key = 'config'",
     ("[" * 40 + "]" * 40,), "contiguous", "nested more than 32 deep"),
    ("meta config a list", "UPDATE meta SET value = '[1, 2]' WHERE key = 'config'", (), "contiguous",
     "meta 'config' is \\[1, 2\\]"),
    ("meta started_at NaN", "UPDATE meta SET value = 'NaN' WHERE key = 'started_at'", (), "contiguous",
     "NaN is not a JSON number"),
    ("a keyframe's figures in a 2^63-byte frame", "UPDATE keyframes SET scalars = ?",
     (b"\x80\x05\x95" + struct.pack("<Q", 2**63) + b"N.",), "contiguous", "frame of 9223372036854775808 bytes"),
    ("a keyframe's pages in a 2^63-byte frame", "UPDATE keyframes SET owner_z = ?",
     (b"\x80\x05\x95" + struct.pack("<Q", 2**63) + b"N.",), "contiguous", "frame of 9223372036854775808 bytes"),
    ("a segment of a 2^50-byte BINBYTES8", "UPDATE segments SET blob = ?",
     (pickle_claiming(b"\x8e", 2**50),), "contiguous", "expected 1125899906842624 bytes"),
    ("a segment of a 2^40-byte BINUNICODE8", "UPDATE segments SET blob = ?",
     (pickle_claiming(b"\x8d", 2**40),), "contiguous", "expected 1099511627776 bytes"),
    ("a segment of an event holding 2^64 shared lists", "UPDATE segments SET blob = ?",
     (pickle.dumps([(1, 0.5, "policy", "lru", shared_lists(64))], 5),), "contiguous",
     "refer back to an object"),
    ("a keyframe's figures of the wrong shape", "UPDATE keyframes SET scalars = ?",
     (pickle.dumps((1, 2, "three", 4, ())),), "contiguous", "figures are not"),
    ("a geometry without scatter_fails", "UPDATE meta SET value = ? WHERE key = 'geometry'",
     (json.dumps({k: v for k, v in GEOMETRY.items() if k != "scatter_fails"}),), "contiguous",
     "lacks scatter_fails"),
    ("a contiguous geometry without its fit", "UPDATE meta SET value = ? WHERE key = 'geometry'",
     (json.dumps({k: v for k, v in GEOMETRY.items() if k != "fit"}),), "contiguous", "names no fit"),
    ("a tiered geometry without tiers", "UPDATE meta SET value = json_remove(value, '$.tiers') "
     "WHERE key = 'geometry'", (), "tiered", "lacks its tiers"),
    ("a tier past the map", "UPDATE meta SET value = json_set(value, '$.tiers[2].count', 99) "
     "WHERE key = 'geometry'", (), "tiered", "inside 64 blocks"),
])
def test_a_crafted_recording_is_422_naming_the_fault_and_keeps_nothing(c, srv, tmp_path, what, sql, params,
                                                                     strategy, says):
    before = listing(c, srv)
    err = assert_error(c.post("/api/recordings/upload", content=edited(tmp_path, sql, params, strategy),
                              headers=OCTET), 422, "invalid_request")
    assert re.search(says, err["message"], re.IGNORECASE), (what, err["message"])
    assert "the uploaded file" in err["message"]
    assert listing(c, srv) == before, what
    assert c.get("/healthz").status_code == 200  # the same connection still answers


def mutate(rng: random.Random, data: bytes, tmp_path) -> bytes:
    """One random change to a valid recording: bytes flipped anywhere in the file, or one value
    of one row rewritten (a stored blob's bytes, a type SQLite will keep, a pickle opcode claiming
    a huge size, a geometry field dropped or changed)."""
    how = rng.randrange(4)
    if how == 0:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    path = tmp_path / "fuzz.kvrec"
    path.write_bytes(data)
    db = sqlite3.connect(path)
    table, cols = rng.choice([("segments", ("first", "last", "blob")),
                              ("keyframes", ("seq", "owner_z", "state_z", "scalars")), ("meta", ("value",))])
    rowid = rng.choice([r for (r,) in db.execute(f"SELECT rowid FROM {table}")])
    col = rng.choice(cols)
    (old,) = db.execute(f"SELECT {col} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    if how == 1 and isinstance(old, (bytes, str)) and old:
        raw = bytearray(old.encode() if isinstance(old, str) else old)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(raw))
            if rng.random() < 0.5:
                raw[i] = rng.randrange(256)
            else:
                raw[i:i + 9] = rng.choice([b"\x8e", b"\x8d", b"\x96", b"\x95"]) + struct.pack("<Q", rng.choice(
                    [2**63, 2**50, 2**40, 2**31, len(raw) + 1]))
        new = bytes(raw).decode("utf-8", "replace") if isinstance(old, str) else bytes(raw)
    elif how == 2 and table == "meta":
        value = json.loads(old)
        if isinstance(value, dict) and value:
            key = rng.choice(sorted(value))
            if rng.random() < 0.5:
                del value[key]
            else:
                value[key] = rng.choice([None, "x", -1, 0, 2**70, 1.5, [], {}, True, [[[]]]])
        else:
            value = rng.choice([None, "x", -1, 0, 2**70, 1.5, [], {}, True])
        new = json.dumps(value)
    else:
        new = rng.choice([None, "text", -1, 0, 1, 2**62, 1.5, b"", b"\x80\x05N.", rng.randbytes(16)])
    try:
        db.execute(f"UPDATE {table} SET {col} = ? WHERE rowid = ?", (new, rowid))
        db.commit()
    except sqlite3.IntegrityError:  # a NOT NULL or a duplicate key: the file keeps its value
        pass
    db.close()
    return path.read_bytes()


FUZZ_SEED = int(os.environ.get("KVSCOPE_FUZZ_SEED", 0))
FUZZ_CASES = int(os.environ.get("KVSCOPE_FUZZ_CASES", 300))  # more for a deeper run by hand


def test_randomly_mutated_recordings_are_422_or_served_never_a_500(c, srv, tmp_path):
    """Seeded: each case names its seed. A served one answers its pool, stats, history and a
    past block map; a refused one keeps nothing; the server answers throughout."""
    paged = tmp_path / "paged"
    paged.mkdir()
    bases = [recording(tmp_path)[0], (tmp_path / "kinds.kvrec", every_kind_recording(tmp_path / "kinds.kvrec"))[0]
             .read_bytes(), edited(paged, "SELECT 1", (), "tiered"), edited(paged, "SELECT 1", (), "paged")]
    before = listing(c, srv)
    served = refused = 0
    for seed in range(FUZZ_SEED, FUZZ_SEED + FUZZ_CASES):
        rng = random.Random(seed)
        data = mutate(rng, rng.choice(bases), tmp_path)
        r = c.post("/api/recordings/upload", content=data, headers=OCTET)
        assert r.status_code in (201, 422), (seed, r.status_code, r.text)
        if r.status_code == 422:
            refused += 1
            assert "the uploaded file" in assert_error(r, 422, "invalid_request")["message"], seed
            continue
        served += 1
        pool, name = r.json()["name"], r.json()["recording"]
        last = c.get(f"/api/pools/{pool}/history").json()["last_seq"]
        for path, params in [(f"/api/pools/{pool}", {}), (f"/api/pools/{pool}/stats", {}), ("/api/pools", {}),
                             ("/api/recordings", {}), (f"/api/pools/{pool}/events", {}),
                             (f"/api/pools/{pool}/export", {"format": "csv"}),
                             (f"/api/pools/{pool}/export", {"format": "memory_viz"}),
                             (f"/api/pools/{pool}/history/events", {"limit": 100}),
                             (f"/api/pools/{pool}/history/series", {}),
                             (f"/api/pools/{pool}/stats", {"at_seq": max(1, last - 3)}),
                             (f"/api/pools/{pool}/blockmap", {"at_seq": max(1, last // 2)})]:
            got = c.get(path, params=params)
            assert got.status_code < 500, (seed, path, got.status_code, got.text)
        assert c.delete(f"/api/pools/{pool}").status_code == 204
        (srv.dir / f"{name}.kvrec").unlink()
    assert listing(c, srv) == before
    assert refused > FUZZ_CASES // 4 and served > 10, (served, refused)  # both paths were exercised
