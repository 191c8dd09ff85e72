"""Files put by hand in a real server's recordings directory (empty, random bytes, JSON, a
KV-event recording, real recordings cut short or with a byte flipped in a stored segment, a
prefix-caching pool's recording cut short): every route that touches recordings answers a 4xx
naming the recording and what is wrong, never a 5xx; the listing shows the bad file with its
`error`; the connection keeps answering; nothing in the directory changes."""

from __future__ import annotations

import json
import random
import sqlite3

import httpx
import pytest
from support.apputil import Server, assert_error, make_client
from support.kvtest_util import block_past_the_map, prefix_churn

from allocator import create_pool
from allocator.history import History
from allocator.history.recording import Recorder

PREFIX_BLOCKS = 12


def plain_recording(path, keyframe_every: int | None = None) -> int:
    """A contiguous pool's recording of 8 flushes (8 stored segments; with `keyframe_every`,
    keyframes that often, so that reading its end replays only its last events); returns its
    last seq."""
    pool = create_pool("contiguous", num_blocks=64, block_bytes=128, device="cpu", history=True, name="made-here",
                       event_capacity=8 if keyframe_every else 10_000)
    if keyframe_every:
        pool.history = History(pool, max_bytes=1 << 26, keyframe_every=keyframe_every)
    rec = Recorder(pool, path)
    for j in range(8):
        ids = [pool.allocate(100 + 37 * i) for i in range(6)]
        for aid in ids[j % 2::2]:
            pool.free(aid)
        rec.flush()
        for aid in ids[1 - j % 2::2]:
            pool.free(aid)
    rec.stop()
    return pool.events.last_seq


def prefix_recording(path) -> int:
    """A prefix-caching pool's recording: shared prompts, hits, evictions; returns its last seq."""
    pool = create_pool("paged", num_blocks=PREFIX_BLOCKS, block_bytes=30, tokens_per_block=4, device="cpu",
                       history=True, prefix_caching={"policy": "lru"}, event_capacity=8)
    rec = Recorder(pool, path)
    prefix_churn(pool, rec, 200)
    rec.stop()
    assert pool.prefix_stats()["evicted"] > 0
    return pool.events.last_seq


def segment_flipped(data: bytes, path, which: int, at: float) -> bytes:
    """`data` (the recording at `path`) with one byte of its `which`-th stored segment flipped,
    `at` (0..1) of the way into the segment's bytes."""
    db = sqlite3.connect(path)
    blobs = [b for (b,) in db.execute("SELECT blob FROM segments ORDER BY first")]
    db.close()
    blob = blobs[which]
    start = data.find(blob)
    assert start >= 0 and data.find(blob, start + 1) < 0  # stored whole, once, in the file
    out = bytearray(data)
    out[start + min(len(blob) - 1, int(len(blob) * at))] ^= 0xFF
    return bytes(out)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """The bad files, by the name they get in the directory."""
    src = tmp_path_factory.mktemp("made")
    plain_recording(src / "plain.kvrec")
    prefix_recording(src / "prefix.kvrec")
    plain = (src / "plain.kvrec").read_bytes()
    prefix = (src / "prefix.kvrec").read_bytes()
    files = {
        "empty": b"",
        "random": random.Random(1).randbytes(5000),
        "json": json.dumps({"pool": "default", "events": [1, 2, 3]}).encode(),
        "kv-events": b"KVSREC1\n" + bytes(200),
        "sqlite-header-only": plain[:100],
    }
    for cut in (0.1, 0.5, 0.9, 0.99):
        files[f"cut-{int(cut * 100)}"] = plain[: int(len(plain) * cut)]
        files[f"prefix-cut-{int(cut * 100)}"] = prefix[: int(len(prefix) * cut)]
    for which, at in ((0, 0.0), (3, 0.0), (-1, 0.0), (3, 0.5)):
        files[f"flip-seg{which}-{int(at * 100)}"] = segment_flipped(plain, src / "plain.kvrec", which, at)
    files["prefix-flip-seg2"] = segment_flipped(prefix, src / "prefix.kvrec", 2, 0.0)
    plain_recording(src / "replays-badly.kvrec", keyframe_every=16)
    block_past_the_map(src / "replays-badly.kvrec")
    files["replays-badly"] = (src / "replays-badly.kvrec").read_bytes()
    return files


@pytest.fixture(scope="module")
def srv(tmp_path_factory, made):
    rec_dir = tmp_path_factory.mktemp("recordings")
    for name, data in made.items():
        (rec_dir / f"{name}.kvrec").write_bytes(data)
    plain_recording(rec_dir / "good.kvrec")  # a sound one beside them
    server = Server(env={"KVSCOPE_RECORDINGS_DIR": str(rec_dir)})
    server.dir = rec_dir
    yield server
    log = server.stop()
    assert "Traceback" not in log, log


@pytest.fixture
def c(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


def directory(srv) -> dict:
    """Every file of the directory: name -> (bytes, mtime)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in srv.dir.iterdir()}


def pools(c) -> list[str]:
    return sorted(p["name"] for p in c.get("/api/pools").json()["pools"])


BAD = ["empty", "random", "json", "kv-events", "sqlite-header-only", "cut-10", "cut-50", "cut-90", "cut-99",
       "prefix-cut-10", "prefix-cut-50", "prefix-cut-90", "prefix-cut-99", "flip-seg0-0", "flip-seg3-0",
       "flip-seg-1-0", "flip-seg3-50", "prefix-flip-seg2", "replays-badly"]
# Each route that names a recording, as (method, path, JSON body); `{name}` is the file's.
ROUTES = [
    ("POST", "/api/recordings/{name}/open", None),
    ("POST", "/api/recordings/{name}/open", {"pool": "as-named"}),
    ("GET", "/api/recordings/{name}/file", None),
]


def test_every_bad_file_is_made(made) -> None:
    assert sorted(made) == sorted(BAD)


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("method,path,body", ROUTES)
def test_a_bad_file_in_the_directory_is_422_naming_it_and_changes_nothing(c, srv, name, method, path, body):
    before, served = directory(srv), pools(c)
    for _ in range(2):  # the second answer comes from the kept verdict: the same
        r = c.request(method, path.format(name=name), json=body if method == "POST" else None,
                      headers={"Content-Type": "application/json"} if method == "POST" else None)
        err = assert_error(r, 422, "invalid_request")
        assert f"recording {name!r} " in err["message"], err["message"]
        assert str(srv.dir) not in err["message"]  # named, not by the server's path
    assert c.get("/healthz").status_code == 200  # the same connection still answers
    assert directory(srv) == before and pools(c) == served


@pytest.mark.parametrize("name", BAD)
def test_the_listing_shows_a_bad_file_with_what_is_wrong_and_still_lists_the_rest(c, srv, name):
    c.post(f"/api/recordings/{name}/open", json={})  # checked whole: the listing knows the verdict
    r = c.get("/api/recordings")
    assert r.status_code == 200, r.text
    listed = {x["name"]: x for x in r.json()["recordings"]}
    assert sorted(listed) == sorted(p.name.removesuffix(".kvrec") for p in srv.dir.glob("*.kvrec"))
    assert listed[name]["error"].startswith(f"recording {name!r} "), listed[name]
    assert listed[name]["bytes"] == len((srv.dir / f"{name}.kvrec").read_bytes())
    good = listed["good"]
    assert "error" not in good and good["complete"] is True and good["strategy"] == "contiguous"


def test_a_sound_file_beside_them_opens_downloads_and_answers_everywhere(c, srv):
    before = directory(srv)
    r = c.post("/api/recordings/good/open", json={"pool": "good-one"})
    assert r.status_code == 201, r.text
    try:
        last = c.get("/api/pools/good-one/history").json()["last_seq"]
        for path, params in [("/api/pools/good-one/stats", {"at_seq": last // 2}),
                             ("/api/pools/good-one/blockmap", {"at_seq": last // 3, "format": "json"}),
                             ("/api/pools/good-one/history/series", {}),
                             ("/api/pools/good-one/history/events", {"limit": 10_000}),
                             ("/api/pools/good-one/export", {"format": "memory_viz"})]:
            got = c.get(path, params=params)
            assert got.status_code == 200, (path, got.text)
        assert c.get("/api/recordings/good/file").content == (srv.dir / "good.kvrec").read_bytes()
    finally:
        assert c.delete("/api/pools/good-one").status_code == 204
    assert directory(srv) == before


def test_a_file_replaced_by_a_bad_one_after_it_was_checked_is_checked_again(c, srv, made):
    """The kept verdict holds only while the file is unchanged: the same name, now cut short,
    is a 422; restored, it opens again."""
    path = srv.dir / "swapped.kvrec"
    plain_recording(path)
    good = path.read_bytes()
    try:
        r = c.post("/api/recordings/swapped/open", json={})
        assert r.status_code == 201, r.text
        assert c.delete(f"/api/pools/{r.json()['name']}").status_code == 204
        path.write_bytes(made["cut-90"])
        err = assert_error(c.post("/api/recordings/swapped/open", json={}), 422, "invalid_request")
        assert "recording 'swapped' " in err["message"]
        assert_error(c.get("/api/recordings/swapped/file"), 422, "invalid_request")
        path.write_bytes(good)
        r = c.post("/api/recordings/swapped/open", json={})
        assert r.status_code == 201, r.text
        assert c.delete(f"/api/pools/{r.json()['name']}").status_code == 204
    finally:
        path.unlink()


def test_a_recording_the_server_made_opens_without_a_second_check_and_a_damaged_one_not_at_all(c, srv, made):
    """Recorded by this server: downloaded and opened while in progress, opened as written once
    stopped. Cut short by hand afterwards: a 422."""
    assert c.post("/api/pools", json={"name": "rec-src", "num_blocks": 32, "block_bytes": 64}).status_code == 201
    try:
        assert c.post("/api/pools/rec-src/recording", json={"name": "mine"}).status_code == 201
        for _ in range(5):
            assert c.post("/api/pools/rec-src/allocations", json={"bytes": 100}).status_code == 201
        assert c.get("/api/recordings/mine/file").status_code == 200  # in progress: as it is now
        r = c.post("/api/recordings/mine/open", json={"pool": "mine-so-far"})
        assert r.status_code == 201, r.text
        assert c.delete("/api/pools/mine-so-far").status_code == 204
        assert c.delete("/api/pools/rec-src/recording").status_code == 200
        r = c.post("/api/recordings/mine/open", json={})
        assert r.status_code == 201, r.text
        assert c.delete(f"/api/pools/{r.json()['name']}").status_code == 204
        path = srv.dir / "mine.kvrec"
        path.write_bytes(path.read_bytes()[:-1000])
        err = assert_error(c.post("/api/recordings/mine/open", json={}), 422, "invalid_request")
        assert "recording 'mine' " in err["message"]
    finally:
        c.delete("/api/pools/rec-src")
        (srv.dir / "mine.kvrec").unlink(missing_ok=True)


def test_reading_a_recording_opened_unchecked_that_does_not_replay_is_422_naming_it(tmp_path):
    """`kvscope open FILE` reads a file without replaying it whole: a past map, stats, series or
    export that its damaged events break answer a 422 naming the recording, never a 500."""
    path = tmp_path / "badly.kvrec"
    last = plain_recording(path, keyframe_every=16)
    block_past_the_map(path)
    with make_client(open_recordings=(str(path),)) as client:
        pool = "rec-badly"
        assert client.get(f"/api/pools/{pool}/stats").status_code == 200  # its end replays
        for route, params in [("history/series", {}), ("blockmap", {"at_seq": 3, "format": "json"}),
                              ("stats", {"at_seq": 3}), ("export", {"format": "memory_viz"})]:
            err = assert_error(client.get(f"/api/pools/{pool}/{route}", params=params), 422, "invalid_request")
            assert err["message"].startswith("recording 'badly' is corrupt"), (route, err["message"])
        assert client.get(f"/api/pools/{pool}/stats", params={"at_seq": last}).status_code == 200


MUTATIONS = 40


def test_randomly_damaged_files_in_the_directory_are_422_or_served_never_a_500(c, srv, made, tmp_path):
    """Seeded: a sound recording (plain or prefix-caching) with bytes flipped or cut anywhere,
    put in the directory by hand. Each is refused with a 422 naming it on open and download, or
    opened and answers every route; the directory is left as it was."""
    plain_recording(tmp_path / "p.kvrec")
    prefix_recording(tmp_path / "q.kvrec")
    bases = [(tmp_path / "p.kvrec").read_bytes(), (tmp_path / "q.kvrec").read_bytes()]
    served = refused = 0
    for seed in range(MUTATIONS):
        rng = random.Random(seed)
        data = bytearray(rng.choice(bases))
        if rng.random() < 0.2:
            del data[rng.randrange(len(data)):]
        else:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data) // 3, len(data))] ^= 1 << rng.randrange(8)
        name = f"fuzz-{seed}"
        path = srv.dir / f"{name}.kvrec"
        path.write_bytes(bytes(data))
        before = directory(srv)
        r = c.post(f"/api/recordings/{name}/open", json={})
        assert r.status_code in (201, 422), (seed, r.status_code, r.text)
        d = c.get(f"/api/recordings/{name}/file")
        assert d.status_code == (200 if r.status_code == 201 else 422), (seed, d.status_code)
        listed = {x["name"]: x for x in c.get("/api/recordings").json()["recordings"]}
        if r.status_code == 422:
            refused += 1
            assert f"recording {name!r} " in r.json()["error"]["message"], seed
            assert listed[name]["error"] == r.json()["error"]["message"], seed
        else:
            served += 1
            assert "error" not in listed[name], seed
            pool = r.json()["name"]
            last = c.get(f"/api/pools/{pool}/history").json()["last_seq"]
            for route, params in [("", {}), ("/stats", {}), ("/events", {}), ("/history/series", {}),
                                  ("/history/events", {"limit": 10_000}), ("/export", {"format": "memory_viz"}),
                                  ("/stats", {"at_seq": max(1, last - 3)}),
                                  ("/blockmap", {"at_seq": max(1, last // 2), "format": "json"})]:
                got = c.get(f"/api/pools/{pool}{route}", params=params)
                assert got.status_code < 500, (seed, route, got.status_code, got.text)
            assert c.delete(f"/api/pools/{pool}").status_code == 204
        assert directory(srv) == before, seed
        path.unlink()
    assert refused > MUTATIONS // 4 and served > 2, (served, refused)  # both paths were exercised
