"""Pools: create, list, get, delete, reset, defragment, stats, check, events, block map, policy."""

from __future__ import annotations

import struct

import pytest
from support.apputil import JSON, assert_error, assert_ok_check, state_of


def test_default_pool_exists_and_is_paged_with_a_cache(client):
    pools = client.get("/api/pools").json()["pools"]
    assert [p["name"] for p in pools] == ["default"]
    body = client.get("/api/pools/default").json()
    assert body["config"]["strategy"] == "paged"
    assert body["config"]["num_blocks"] == 256
    assert body["stats"]["cache"]["policy"] == "lru"
    assert body["stats"]["cache"]["capacity_bytes"] == 256 * 4096


@pytest.mark.parametrize("spec", [
    {"name": "p1", "strategy": "paged", "num_blocks": 64, "block_bytes": 1024},
    {"name": "c1", "strategy": "contiguous", "num_blocks": 64, "block_bytes": 1024, "fit": "best"},
    {"name": "t1", "strategy": "tiered", "num_blocks": 256, "block_bytes": 1024,
     "tiers": [{"name": "s", "units": 1, "share": 0.5}, {"name": "l", "units": 4, "share": 0.5}]},
    {"name": "m1", "strategy": "paged", "capacity_bytes": 1 << 20, "model": "tiny", "tokens_per_block": 16,
     "cache": {"capacity_bytes": 1 << 19, "policy": "lfu"}},
])
def test_create_each_strategy_then_delete(client, spec):
    r = client.post("/api/pools", json=spec)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == spec["name"] and body["config"]["strategy"] == spec["strategy"]
    assert spec["name"] in [p["name"] for p in client.get("/api/pools").json()["pools"]]
    assert_ok_check(client, spec["name"])
    assert client.delete(f"/api/pools/{spec['name']}").status_code == 204
    assert_error(client.get(f"/api/pools/{spec['name']}"), 404, "not_found")


def test_token_sized_pool_takes_tokens(client):
    client.post("/api/pools", json={"name": "tok", "num_blocks": 64, "model": "tiny", "tokens_per_block": 4})
    r = client.post("/api/pools/tok/allocations", json={"tokens": 5})
    assert r.status_code == 201
    bpt = client.get("/api/pools/tok").json()["config"]["model"]["bytes_per_token"]
    assert r.json()["requested_bytes"] == 5 * bpt
    assert r.json()["blocks"] == [[0, 2]]
    # bytes-only pool refuses tokens, and nothing changes
    before = state_of(client)
    assert_error(client.post("/api/pools/default/allocations", json={"tokens": 5}), 422, "invalid_request")
    assert state_of(client) == before


@pytest.mark.parametrize("spec,status,code", [
    ({"name": "default", "num_blocks": 8, "block_bytes": 64}, 409, "conflict"),
    ({"name": "Bad Name", "num_blocks": 8, "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "-x", "num_blocks": 8, "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "x" * 65, "num_blocks": 8, "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8}, 422, "invalid_request"),
    ({"name": "x", "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "capacity_bytes": 512, "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 0, "block_bytes": 64}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "block_bytes": 64, "strategy": "buddy"}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "model": "gpt-9"}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "block_bytes": 64, "cache": {"capacity_bytes": 1 << 20}}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "block_bytes": 64, "cache": {"policy": "mru"}}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 8, "block_bytes": 64, "unknown": 1}, 422, "invalid_request"),
    ({"name": "x", "num_blocks": 1 << 21, "block_bytes": 1}, 413, "too_large"),
    ({"name": "x", "num_blocks": 1024, "block_bytes": 1 << 20}, 413, "too_large"),
    ({"name": "x", "capacity_bytes": 1 << 40, "block_bytes": 1 << 20}, 413, "too_large"),
    ({"name": "x", "num_blocks": 8, "block_bytes": 64, "device": "tpu"}, 422, "invalid_request"),
])
def test_bad_pool_create_is_refused_and_changes_nothing(client, spec, status, code):
    before = state_of(client)
    err = assert_error(client.post("/api/pools", json=spec), status, code)
    assert state_of(client) == before
    if status == 422 and "unknown" in spec:
        assert "unknown" in err["message"]


def test_validation_message_names_the_field(client):
    err = assert_error(client.post("/api/pools", json={"name": "ok", "num_blocks": -1, "block_bytes": 64}),
                       422, "invalid_request")
    assert "num_blocks" in err["message"]
    assert err["details"]["field"] == "num_blocks"


@pytest.mark.parametrize("spec,field", [
    ({"strategy": "paged", "fit": "best"}, "fit"),
    ({"strategy": "tiered", "fit": "first"}, "fit"),
    ({"fit": "worst"}, "fit"),  # paged by default
    ({"strategy": "paged", "tiers": [{"name": "s", "units": 1, "share": 1.0}]}, "tiers"),
    ({"strategy": "contiguous", "tiers": [{"name": "s", "units": 1, "share": 1.0}]}, "tiers"),
])
def test_options_of_another_strategy_are_refused_not_ignored(client, spec, field):
    before = state_of(client)
    err = assert_error(client.post("/api/pools", json={"name": "x", "num_blocks": 8, "block_bytes": 64, **spec}),
                       422, "invalid_request")
    assert f"'{field}'" in err["message"]
    assert state_of(client) == before


def test_pool_count_is_capped(client):
    for i in range(7):
        assert client.post("/api/pools", json={"name": f"p{i}", "num_blocks": 4, "block_bytes": 64}).status_code == 201
    before = state_of(client)
    assert_error(client.post("/api/pools", json={"name": "p9", "num_blocks": 4, "block_bytes": 64}), 409, "conflict")
    assert state_of(client) == before


def test_reset_frees_everything_keeps_config(client):
    client.post("/api/pools/default/allocations", json={"bytes": 10_000})
    client.put("/api/pools/default/entries/a", json={"bytes": 100})
    r = client.post("/api/pools/default/reset", headers=JSON)
    assert r.status_code == 200 and r.json() == {"freed": 2}
    stats = client.get("/api/pools/default/stats").json()
    assert stats["used_blocks"] == 0 and stats["cache"]["entries"] == 0
    assert stats["total_blocks"] == 256
    assert_ok_check(client)


def test_defragment_compacts_a_contiguous_pool(client):
    client.post("/api/pools", json={"name": "c", "strategy": "contiguous", "num_blocks": 16, "block_bytes": 64})
    ids = [client.post("/api/pools/c/allocations", json={"bytes": 128}).json()["id"] for _ in range(8)]
    for aid in ids[::2]:
        assert client.delete(f"/api/pools/c/allocations/{aid}").status_code == 204
    # 8 blocks free in total, but only in 2-block holes: a 4-block request fails for fragmentation
    before = state_of(client, "c")
    err = assert_error(client.post("/api/pools/c/allocations", json={"bytes": 256}), 507, "out_of_memory")
    assert err["details"]["cause"] == "fragmentation"
    assert set(err["details"]) == {"requested_bytes", "free_bytes", "largest_free_bytes", "cause"}
    assert err["details"]["free_bytes"] == 8 * 64 and err["details"]["largest_free_bytes"] == 128
    assert state_of(client, "c") == before
    r = client.post("/api/pools/c/defragment", headers=JSON)
    assert r.status_code == 200
    report = r.json()
    assert report["moved_blocks"] > 0 and report["after"]["largest_free_bytes"] == 8 * 64
    assert client.post("/api/pools/c/allocations", json={"bytes": 256}).status_code == 201
    assert_ok_check(client, "c")


def test_stats_have_the_design_fields(client):
    stats = client.get("/api/pools/default/stats").json()
    for field in ("total_blocks", "used_blocks", "free_blocks", "utilization", "requested_bytes",
                  "allocated_bytes", "internal_fragmentation", "external_fragmentation",
                  "largest_free_bytes", "free_extents"):
        assert field in stats


def test_events_after_seq_and_limit(client):
    for _ in range(5):
        client.post("/api/pools/default/allocations", json={"bytes": 1})
    body = client.get("/api/pools/default/events", params={"after": 0, "limit": 3}).json()
    assert [e["type"] for e in body["events"]] == ["allocate"] * 3
    later = client.get("/api/pools/default/events", params={"after": body["events"][-1]["seq"]}).json()
    assert len(later["events"]) == 2 and later["last_seq"] == later["events"][-1]["seq"]
    assert_error(client.get("/api/pools/default/events", params={"limit": 0}), 422, "invalid_request")
    assert_error(client.get("/api/pools/default/events", params={"after": "x"}), 422, "invalid_request")


def test_blockmap_json_runs_and_binary_snapshot(client):
    a = client.post("/api/pools/default/allocations", json={"bytes": 3 * 4096}).json()["id"]
    client.put("/api/pools/default/entries/k", json={"bytes": 4096, "pinned": True})
    runs = client.get("/api/pools/default/blockmap").json()["runs"]
    assert runs[0] == [0, 3, a, 1]
    assert runs[1][1:] == [1, a + 1, 3]
    assert runs[-1] == [4, 252, -1, 0]
    r = client.get("/api/pools/default/blockmap", headers={"Accept": "application/octet-stream"})
    assert r.headers["content-type"] == "application/octet-stream"
    magic, version, kind, _, frame, blocks, nruns = struct.unpack_from("<BBBBIII", r.content)
    assert (magic, version, kind, frame, blocks, nruns) == (0x4B, 1, 1, 0, 256, 1)
    start, count = struct.unpack_from("<II", r.content, 16)
    owners = struct.unpack_from(f"<{count}i", r.content, 24)
    states = r.content[24 + 4 * count: 24 + 5 * count]
    assert (start, count) == (0, 256)
    assert owners[:4] == (a, a, a, a + 1) and owners[4] == -1
    assert list(states[:5]) == [1, 1, 1, 3, 0]
    assert len(r.content) == 16 + 8 + 5 * 256


def test_blockmap_format_picks_json_or_binary_and_anything_else_is_422(client):
    binary = client.get("/api/pools/default/blockmap", params={"format": "binary"})
    assert binary.headers["content-type"] == "application/octet-stream" and binary.content[0] == 0x4B
    as_json = client.get("/api/pools/default/blockmap", params={"format": "json"},
                         headers={"Accept": "application/octet-stream"})
    assert as_json.json()["num_blocks"] == 256
    for bad in ("xml", "BINARY", ""):
        err = assert_error(client.get("/api/pools/default/blockmap", params={"format": bad}), 422, "invalid_request")
        assert err["details"]["field"] == "format"
    described = client.get("/openapi.json").json()["paths"]["/api/pools/{pool}/blockmap"]["get"]["description"]
    assert "format=binary" in described


def test_unknown_cuda_device_is_422_echoing_what_was_asked(client):
    before = state_of(client)
    err = assert_error(client.post("/api/pools", json={"name": "g", "num_blocks": 8, "block_bytes": 64,
                                                      "device": "cuda:99"}), 422, "invalid_request")
    assert "'cuda:99'" in err["message"]
    assert state_of(client) == before


def test_check_reports_ok(client):
    assert client.get("/api/pools/default/check").json() == {"ok": True, "problems": []}


def test_policy_switch(client):
    r = client.put("/api/pools/default/cache/policy", json={"policy": "lfu"})
    assert r.status_code == 200 and r.json() == {"policy": "lfu"}
    assert client.get("/api/pools/default/stats").json()["cache"]["policy"] == "lfu"
    before = state_of(client)
    assert_error(client.put("/api/pools/default/cache/policy", json={"policy": "mru"}), 422, "invalid_request")
    assert state_of(client) == before
    client.post("/api/pools", json={"name": "nocache", "num_blocks": 8, "block_bytes": 64})
    assert_error(client.put("/api/pools/nocache/cache/policy", json={"policy": "lru"}), 409, "conflict")


@pytest.mark.parametrize("method,path", [
    ("get", "/api/pools/nope"), ("delete", "/api/pools/nope"), ("post", "/api/pools/nope/reset"),
    ("post", "/api/pools/nope/defragment"), ("get", "/api/pools/nope/stats"),
    ("get", "/api/pools/nope/blockmap"), ("get", "/api/pools/nope/events"), ("get", "/api/pools/nope/check"),
    ("get", "/api/pools/nope/entries"), ("get", "/api/pools/nope/allocations/1"),
])
def test_unknown_pool_is_404(client, method, path):
    before = state_of(client)
    assert_error(client.request(method.upper(), path, headers=JSON), 404, "not_found")
    assert state_of(client) == before
