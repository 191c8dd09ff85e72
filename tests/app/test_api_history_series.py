"""GET /api/pools/{pool}/history/series on a real server: each point equals what the stats route
answered at that event, points are evenly spaced and bounded, errors are 404 / 422 / 409, and an
opened recording answers over its whole span."""

from __future__ import annotations

import random

import httpx
import pytest
from support.apputil import Server, assert_error

from allocator.history.series import MAX_POINTS

POOL = "/api/pools/s1"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = Server(env={"KVSCOPE_RECORDINGS_DIR": str(tmp_path_factory.mktemp("recordings"))})
    yield server
    log = server.stop()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def c(srv):
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def seen(c) -> dict[int, dict]:
    """A contiguous pool (so external fragmentation moves) with a cache, driven over HTTP; the
    stats the server answered after each request, by event seq. Recorded to `s1-run`."""
    spec = {"name": "s1", "strategy": "contiguous", "num_blocks": 128, "block_bytes": 256,
            "cache": {"capacity_bytes": 64 * 256}}
    assert c.post("/api/pools", json=spec).status_code == 201
    assert c.post(f"{POOL}/recording", json={"name": "s1-run"}).status_code == 201
    rng = random.Random(5)
    ids: list[int] = []
    out = {}
    for _ in range(120):
        r = rng.random()
        if r < 0.4:
            resp = c.post(f"{POOL}/allocations", json={"bytes": rng.randint(1, 3000)})
            if resp.status_code == 201:
                ids.append(resp.json()["id"])
        elif r < 0.65 and ids:
            c.delete(f"{POOL}/allocations/{ids.pop(rng.randrange(len(ids)))}")
        elif r < 0.9:
            c.put(f"{POOL}/entries/k{rng.randrange(20)}", json={"bytes": rng.randint(1, 4000)})
        else:
            c.get(f"{POOL}/entries/k{rng.randrange(25)}")
        stats = c.get(f"{POOL}/stats").json()
        out[stats["last_event_seq"]] = stats
    assert c.delete(f"{POOL}/recording").status_code == 200
    return out


def test_every_point_is_what_the_stats_route_said_at_that_event(c, seen):
    last = max(seen)
    body = c.get(f"{POOL}/history/series", params={"points": MAX_POINTS}).json()
    cols = body["columns"]
    assert body["from_seq"] == 0 and body["to_seq"] == last and cols["seq"] == list(range(last + 1))
    at = {seq: i for i, seq in enumerate(cols["seq"])}
    for seq, stats in seen.items():
        i = at[seq]
        for name in ("utilization", "internal_fragmentation", "external_fragmentation", "requested_bytes",
                     "allocated_bytes", "free_blocks", "largest_free_bytes", "allocation_count"):
            assert cols[name][i] == stats[name], (name, seq)
        assert cols["ooms_capacity"][i] == stats["ooms"]["capacity"]
    events = c.get(f"{POOL}/history/events", params={"limit": 100_000}).json()["events"]
    kinds = [e["type"] for e in events]
    assert sum(cols["evictions"]) == kinds.count("evict") > 0
    assert sum(cols["hits"]) == kinds.count("hit") and sum(cols["misses"]) == kinds.count("miss")
    assert cols["ts"][0] is None and cols["ts"][1:] == [e["ts"] for e in events]


def test_points_are_evenly_spaced_and_the_ends_kept(c, seen):
    last = max(seen)
    cols = c.get(f"{POOL}/history/series", params={"from_seq": 10, "to_seq": last, "points": 7}).json()["columns"]
    seqs = cols["seq"]
    assert len(seqs) == 7 and seqs[0] == 10 and seqs[-1] == last
    gaps = [b - a for a, b in zip(seqs, seqs[1:])]
    assert max(gaps) - min(gaps) <= 1
    full = c.get(f"{POOL}/history/series", params={"points": MAX_POINTS}).json()["columns"]
    for i, seq in enumerate(seqs):  # rolled forward point to point = replayed from scratch
        assert cols["utilization"][i] == full["utilization"][seq]
        assert cols["external_fragmentation"][i] == full["external_fragmentation"][seq]
    # the evictions between two points are all those of the events between them
    assert sum(cols["evictions"][1:]) == sum(full["evictions"][11:last + 1])


def test_bad_requests_are_404_422_and_prefix_pools_answer(c, seen):
    last = max(seen)
    err = assert_error(c.get(f"{POOL}/history/series", params={"to_seq": last + 5}), 404, "not_found")
    assert f"0..{last}" in err["message"]
    err = assert_error(c.get(f"{POOL}/history/series", params={"from_seq": 9, "to_seq": 3}), 422, "invalid_request")
    assert "from_seq" in err["message"]
    for bad in ({"points": 0}, {"points": MAX_POINTS + 1}, {"points": "x"}, {"from_seq": -1}):
        assert_error(c.get(f"{POOL}/history/series", params=bad), 422, "invalid_request")
    assert_error(c.get("/api/pools/nope/history/series"), 404, "not_found")
    spec = {"name": "pfx", "num_blocks": 64, "block_bytes": 16, "tokens_per_block": 4,
            "device": "cpu", "prefix_caching": {"policy": "lru"}}
    assert c.post("/api/pools", json=spec).status_code == 201
    assert c.post("/api/pools/pfx/sequences", json={"tokens": list(range(9))}).status_code == 201
    # A prefix-caching pool replays exactly too: its series ends at the live stats.
    body = c.get("/api/pools/pfx/history/series").json()
    stats = c.get("/api/pools/pfx/stats").json()
    assert body["columns"]["used_blocks"][-1] == stats["used_blocks"] > 0


def test_an_opened_recording_answers_over_its_whole_span(c, seen):
    r = c.post("/api/recordings/s1-run/open", json={})
    assert r.status_code == 201, r.text
    body = c.get("/api/pools/rec-s1-run/history/series", params={"points": 50}).json()
    live = c.get(f"{POOL}/history/series", params={"from_seq": body["from_seq"], "to_seq": body["to_seq"],
                                                   "points": 50}).json()
    rec_rate, live_rate = body["columns"].pop("cache_hit_rate"), live["columns"].pop("cache_hit_rate")
    assert body["to_seq"] == max(seen) and body["columns"] == live["columns"]
    # The recording took a keyframe with the cache's figures when it started, so it knows the
    # lifetime hit rate from its first point; wherever the live history knows it, they agree.
    assert None not in rec_rate
    assert all(b == a for a, b in zip(live_rate, rec_rate) if a is not None)


def test_the_series_needs_the_token_when_one_is_set():
    srv = Server(env={"KVSCOPE_TOKEN": "s3cret"})
    try:
        assert_error(httpx.get(f"{srv.url}/api/pools/default/history/series"), 401, "unauthorized")
        ok = httpx.get(f"{srv.url}/api/pools/default/history/series",
                       headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["columns"]["seq"] == [0]
    finally:
        assert "Traceback" not in srv.stop()
