"""History over REST: the map and stats at a past seq answer what the live routes said then;
points outside the history are 404 with the range; exports are token-gated stored bytes."""

from __future__ import annotations

import csv
import io
import pickle
import random

from support.apputil import SMALL, assert_error, make_client

from app.registry import Registry
from app.settings import Settings

POOL = "/api/pools/h1"


def make_pool(client, strategy: str = "contiguous") -> None:
    spec = {"name": "h1", "strategy": strategy, "num_blocks": 128, "block_bytes": 256}
    assert client.post("/api/pools", json=spec).status_code == 201


def test_blockmap_and_stats_at_seq_equal_what_the_live_routes_said_then(client):
    make_pool(client)
    rng = random.Random(3)
    ids: list[int] = []
    seen: dict[int, tuple[list, dict]] = {}
    for _ in range(80):
        r = rng.random()
        if r < 0.5 or not ids:
            resp = client.post(f"{POOL}/allocations", json={"bytes": rng.randint(1, 2048)})
            if resp.status_code == 201:
                ids.append(resp.json()["id"])
        elif r < 0.85:
            client.delete(f"{POOL}/allocations/{ids.pop(rng.randrange(len(ids)))}")
        elif r < 0.95:
            client.post(f"{POOL}/allocations/{rng.choice(ids)}/extend", json={"bytes": rng.randint(1, 1024)})
        else:
            client.post(f"{POOL}/defragment", json={})
        stats = client.get(f"{POOL}/stats").json()
        seen[stats["last_event_seq"]] = (client.get(f"{POOL}/blockmap?format=json").json()["runs"], stats)
    for seq, (runs, stats) in seen.items():
        past = client.get(f"{POOL}/blockmap", params={"format": "json", "at_seq": seq})
        assert past.status_code == 200
        assert past.json()["runs"] == runs and past.json()["at_seq"] == seq
        assert client.get(f"{POOL}/stats", params={"at_seq": seq}).json() == stats


def test_points_outside_the_history_are_404_and_bad_ones_422(client):
    make_pool(client, "paged")
    client.post(f"{POOL}/allocations", json={"bytes": 10})
    info = client.get(f"{POOL}/history").json()
    assert info["first_seq"] == 0 and info["last_seq"] == 1 and info["dropped_events"] == 0
    err = assert_error(client.get(f"{POOL}/blockmap", params={"format": "json", "at_seq": 2}), 404, "not_found")
    assert "0..1" in err["message"] and err["details"]["last_seq"] == 1
    assert_error(client.get(f"{POOL}/stats", params={"at_seq": 99}), 404, "not_found")
    assert_error(client.get(f"{POOL}/stats", params={"at_seq": -1}), 422, "invalid_request")
    assert_error(client.get(f"{POOL}/stats", params={"at_seq": "x"}), 422, "invalid_request")
    assert_error(client.get(f"{POOL}/blockmap", params={"format": "binary", "at_seq": 1}), 422, "invalid_request")
    assert client.get(f"{POOL}/blockmap", params={"at_seq": 0}).json()["runs"] == [[0, 128, -1, 0]]


def test_history_events_reach_past_the_ring_and_filter_by_kind(client):
    make_pool(client, "paged")
    for _ in range(30):
        aid = client.post(f"{POOL}/allocations", json={"bytes": 300}).json()["id"]
        client.delete(f"{POOL}/allocations/{aid}")
    client.post(f"{POOL}/allocations", json={"bytes": 100 * 256})
    client.post(f"{POOL}/allocations", json={"bytes": 60 * 256})  # fits the pool, not what is free: an OOM
    body = client.get(f"{POOL}/history/events", params={"kinds": "oom"}).json()
    assert [e["type"] for e in body["events"]] == ["oom"] and body["last_seq"] == 62
    page = client.get(f"{POOL}/history/events", params={"after": 10, "limit": 5}).json()["events"]
    assert [e["seq"] for e in page] == [11, 12, 13, 14, 15]
    assert_error(client.get(f"{POOL}/history/events", params={"kinds": "oom,bogus"}), 422, "invalid_request")


def test_exports_csv_and_memory_viz(client):
    make_pool(client, "paged")
    a = client.post(f"{POOL}/allocations", json={"bytes": 600}).json()["id"]
    client.post(f"{POOL}/allocations", json={"bytes": 100})
    client.delete(f"{POOL}/allocations/{a}")
    r = client.get(f"{POOL}/export", params={"format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [x["type"] for x in rows] == ["allocate", "allocate", "free"] and rows[0]["block_ids"] == "0 1 2"
    snap = pickle.loads(client.get(f"{POOL}/export", params={"format": "memory_viz"}).content)
    assert [e["action"] for e in snap["device_traces"][0]] == [
        "alloc", "alloc", "free_requested", "free_completed"]
    assert snap["segments"][0]["total_size"] == 128 * 256
    assert_error(client.get(f"{POOL}/export", params={"format": "png"}), 422, "invalid_request")


def test_exports_need_the_token_like_other_stored_bytes(authed):
    r = authed.get("/api/pools/default/export", params={"format": "csv"})
    assert_error(r, 401, "unauthorized")
    ok = authed.get("/api/pools/default/export", params={"format": "csv"},
                    headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_a_pool_without_history_says_so(client):
    from allocator import create_pool
    from app.registry import PoolHandle

    pool = create_pool("paged", num_blocks=8, block_bytes=64, device="cpu", name="nohist", history_bytes=0)
    client.app.state.services.registry._pools["nohist"] = PoolHandle("nohist", pool)
    assert_error(client.get("/api/pools/nohist/stats", params={"at_seq": 0}), 409, "conflict")


def test_recording_routes_refuse_clearly_and_record_in_order(tmp_path):
    with make_client(recordings_dir=str(tmp_path)) as client:
        make_pool(client, "paged")
        assert_error(client.delete(f"{POOL}/recording"), 404, "not_found")
        assert client.get(f"{POOL}/recording").json() == {"pool": "h1", "recording": False}
        assert_error(client.post(f"{POOL}/recording", json={"name": "../x"}), 422, "invalid_request")
        r = client.post(f"{POOL}/recording", json={"name": "one"})
        assert r.status_code == 201 and r.json()["start_seq"] == 0
        client.post(f"{POOL}/allocations", json={"bytes": 300})
        assert client.get(f"{POOL}/recording").json()["recording"] is True
        stopped = client.delete(f"{POOL}/recording").json()
        assert stopped["events"] == 1 and stopped["recording"] is False
        assert_error(client.post(f"{POOL}/recording", json={"name": "one"}), 409, "conflict")  # file exists
        listing = client.get("/api/recordings").json()["recordings"]
        assert [(x["name"], x["complete"], x["last_seq"]) for x in listing] == [("one", True, 1)]
        opened = client.post("/api/recordings/one/open", json={})
        assert opened.status_code == 201 and opened.json()["name"] == "rec-one"
        # a recording cannot itself be recorded, nor changed
        assert_error(client.post("/api/pools/rec-one/recording", json={}), 409, "conflict")
        assert_error(client.post("/api/pools/rec-one/reset", json={}), 409, "conflict")
        assert_error(client.post("/api/recordings/nope/open", json={}), 404, "not_found")
        assert client.get("/api/pools/rec-one/export", params={"format": "csv"}).text.count("\n") == 2


def test_past_points_of_a_prefix_caching_pool_answer_what_the_live_routes_said_then(client):
    spec = {"name": "pfx", "num_blocks": 12, "block_bytes": 30, "tokens_per_block": 4,
            "device": "cpu", "prefix_caching": {"policy": "lru"}}
    assert client.post("/api/pools", json=spec).status_code == 201
    base = "/api/pools/pfx"
    rng = random.Random(7)
    systems = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], []]
    seqs: list[int] = []
    seen: dict[int, tuple[list, dict]] = {}
    for _ in range(70):
        r = rng.random()
        if r < 0.45 or not seqs:  # shared system prompts: hits on idle and on held blocks
            tokens = rng.choice(systems) + [rng.randint(0, 50) for _ in range(rng.randint(1, 12))]
            resp = client.post(f"{base}/sequences", json={"tokens": tokens})
            if resp.status_code == 201:
                seqs.append(resp.json()["id"])
            else:  # every block held: refused, nothing changed
                assert resp.status_code == 507
        elif r < 0.65:
            resp = client.post(f"{base}/sequences/{rng.choice(seqs)}/append",
                               json={"tokens": [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]})
            assert resp.status_code in (200, 507)
        elif r < 0.95:
            assert client.delete(f"{base}/sequences/{seqs.pop(rng.randrange(len(seqs)))}").status_code == 204
        else:
            assert client.post(f"{base}/prefix-cache/reset", json={}).status_code == 200
        stats = client.get(f"{base}/stats").json()
        stats.pop("prefix")  # the core's hit counts and block-time histograms: not replayed
        seen[stats["last_event_seq"]] = (client.get(f"{base}/blockmap?format=json").json()["runs"], stats)
    assert client.get(f"{base}/stats").json()["prefix"]["evicted"] > 0  # the pool ran full
    for seq, (runs, stats) in seen.items():
        past = client.get(f"{base}/blockmap", params={"format": "json", "at_seq": seq})
        assert past.status_code == 200 and past.json()["runs"] == runs
        assert client.get(f"{base}/stats", params={"at_seq": seq}).json() == stats


def test_every_pool_the_server_makes_keeps_a_history_of_its_budget():
    with make_client(history_bytes=3 << 20) as client:
        make_pool(client, "paged")
        client.post(f"{POOL}/allocations", json={"bytes": 300})
        info = client.get(f"{POOL}/history").json()
        assert info["max_bytes"] == 3 << 20 and info["first_seq"] == 0 and info["last_seq"] == 1
        assert client.get(f"{POOL}/stats", params={"at_seq": 1}).json()["used_blocks"] == 2
        assert "history" not in client.get(f"{POOL}/stats").json()  # its figures are /history's
        assert client.get("/api/pools/default/history").json()["max_bytes"] == 3 << 20
    with make_client(history_bytes=0) as client:  # KVSCOPE_HISTORY_BYTES=0: none kept
        make_pool(client, "paged")
        assert_error(client.get(f"{POOL}/history"), 409, "conflict")
        assert_error(client.get(f"{POOL}/stats", params={"at_seq": 0}), 409, "conflict")
        assert client.get(f"{POOL}/stats").status_code == 200


def test_the_registry_keeps_a_history_of_mirrors_too():
    registry = Registry(Settings(**{**SMALL, "history_bytes": 1 << 20}))
    mirror = registry.create({"name": "m", "strategy": "mirror", "num_blocks": 16}).pool
    assert mirror.history is not None and mirror.history.max_bytes == 1 << 20
    mirror.store([7, 8, 9], None)
    view = mirror.history.view()
    rep = view.replay_to(view.last_seq)
    assert (rep.owner == mirror.blockmap.owners_np()).all() and (rep.state == mirror.blockmap.states_np()).all()
    assert view.stats_at(view.last_seq)["used_blocks"] == 3
    assert Registry(Settings(**{**SMALL, "history_bytes": 0})).create(
        {"name": "m", "strategy": "mirror", "num_blocks": 16}).pool.history is None
