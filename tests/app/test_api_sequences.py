"""REST for prefix caching: pools with prefix_caching, sequences, reset, batch ops, errors."""

from __future__ import annotations

import pytest
from support.apputil import JSON, assert_error, assert_ok_check, make_client, state_of

BASE = "/api/pools/px"
SPEC = {"name": "px", "num_blocks": 8, "block_bytes": 64, "tokens_per_block": 4, "device": "cpu",
        "prefix_caching": {"policy": "lru"}}


@pytest.fixture()
def client():
    with make_client() as c:
        assert c.post("/api/pools", json=SPEC).status_code == 201
        yield c


def test_pool_reports_prefix_caching_in_config_list_and_stats(client):
    pool = client.get(BASE).json()
    assert pool["config"]["prefix_caching"] == {"policy": "lru"}
    assert pool["config"]["tokens_per_block"] == 4
    listed = {p["name"]: p for p in client.get("/api/pools").json()["pools"]}
    assert listed["px"]["prefix_caching"] == {"policy": "lru"}
    assert listed["default"]["prefix_caching"] is None
    stats = client.get(f"{BASE}/stats").json()
    assert stats["prefix"]["hit_ratio"] == 0.0 and stats["blocks_by_state"]["shared"] == 0


def test_open_reuses_the_cached_prefix_and_stats_count_tokens(client):
    a = client.post(f"{BASE}/sequences", json={"tokens": list(range(10))})
    assert a.status_code == 201
    a = a.json()
    assert (a["num_tokens"], a["cached_tokens"], len(a["blocks"])) == (10, 0, 3)
    b = client.post(f"{BASE}/sequences", json={"tokens": list(range(8)) + [50]}).json()
    assert b["cached_tokens"] == 8 and b["blocks"][:2] == a["blocks"][:2]
    assert client.get(f"{BASE}/sequences/{b['id']}").json() == b
    assert client.get(f"{BASE}/sequences").json()["ids"] == [a["id"], b["id"]]
    grown = client.post(f"{BASE}/sequences/{b['id']}/append", json={"tokens": [51, 52, 53]}).json()
    assert grown["num_tokens"] == 12
    prefix = client.get(f"{BASE}/stats").json()["prefix"]
    assert (prefix["queries"], prefix["hits"]) == (19, 8)
    assert prefix["blocks"]["shared"] == 2
    info = client.get(f"{BASE}/prefix-cache/blocks/{a['blocks'][0]}").json()
    assert info["refcount"] == 2 and info["state"] == "shared" and info["depth"] == 0
    assert len(info["hash"]) == 16
    assert client.delete(f"{BASE}/sequences/{a['id']}").status_code == 204
    assert client.delete(f"{BASE}/sequences/{b['id']}").status_code == 204
    order = client.get(f"{BASE}/prefix-cache/order").json()
    assert order["total"] == 3 and len(order["blocks"]) == 3
    assert client.post(f"{BASE}/prefix-cache/reset", headers=JSON).json() == {"cleared": 3}
    assert client.get(f"{BASE}/prefix-cache/order").json()["total"] == 0
    types = [e["type"] for e in client.get(f"{BASE}/events").json()["events"]]
    assert {"open", "stored", "append", "close", "cleared"} <= set(types)
    assert_ok_check(client, "px")


def test_block_hashes_and_big_hash_values_round_trip(client):
    h = [2**64 - 1, 2**63]
    a = client.post(f"{BASE}/sequences", json={"block_hashes": h, "num_tokens": 8}).json()
    b = client.post(f"{BASE}/sequences", json={"block_hashes": h, "num_tokens": 8}).json()
    assert b["cached_tokens"] == 8 and b["blocks"] == a["blocks"]
    stored = [e for e in client.get(f"{BASE}/events").json()["events"] if e["type"] == "stored"]
    assert stored[0]["block_hashes"] == h and stored[0]["token_ids"] is None


@pytest.mark.parametrize("body, field", [
    ({"tokens": [1, -1]}, "tokens.1"),
    ({"tokens": [1, "2"]}, "tokens.1"),
    ({"tokens": [1.5]}, "tokens.0"),
    ({"block_hashes": [2**64], "num_tokens": 4}, "block_hashes.0"),
    ({"tokens": [1], "bogus": 1}, "bogus"),
    ({"num_tokens": 0}, "num_tokens"),
    ({"tokens": [1], "next_use": [-1]}, "next_use.0"),
])
def test_bad_open_bodies_are_422_naming_the_field_and_change_nothing(client, body, field):
    before = state_of(client, "px")
    r = client.post(f"{BASE}/sequences", json=body)
    assert_error(r, 422, "invalid_request")
    assert r.json()["error"]["details"]["field"] == field
    assert state_of(client, "px") == before


@pytest.mark.parametrize("body, words", [
    ({}, "give 'tokens'"),
    ({"tokens": []}, "empty"),
    ({"tokens": [1], "block_hashes": [1]}, "not both"),
    ({"block_hashes": [1, 2, 3], "num_tokens": 4}, "one hash per full block"),
    ({"tokens": [1, 2], "next_use": [1, 2]}, "one number per block"),
])
def test_inconsistent_open_is_422_with_a_message_saying_what_to_fix(client, body, words):
    before = state_of(client, "px")
    r = client.post(f"{BASE}/sequences", json=body)
    assert_error(r, 422, "invalid_request")
    assert words in r.json()["error"]["message"]
    assert state_of(client, "px") == before


def test_out_of_memory_is_507_with_block_counts_and_nothing_changes(client):
    client.post(f"{BASE}/sequences", json={"tokens": list(range(28))})  # 7 of 8 blocks held
    before = state_of(client, "px")
    r = client.post(f"{BASE}/sequences", json={"tokens": list(range(100, 112))})
    assert_error(r, 507, "out_of_memory")
    details = r.json()["error"]["details"]
    assert (details["needed_blocks"], details["available_blocks"], details["held_blocks"]) == (3, 1, 7)
    assert state_of(client, "px") == before
    assert_ok_check(client, "px")


def test_unknown_sequences_are_404_and_plain_pools_409(client):
    assert_error(client.get(f"{BASE}/sequences/99"), 404, "not_found")
    assert_error(client.delete(f"{BASE}/sequences/99"), 404, "not_found")
    assert_error(client.post(f"{BASE}/sequences/99/append", json={"tokens": [1]}), 404, "not_found")
    assert_error(client.post("/api/pools/nope/sequences", json={"tokens": [1]}), 404, "not_found")
    assert_error(client.post("/api/pools/default/sequences", json={"tokens": [1]}), 409, "conflict")
    assert_error(client.post("/api/pools/default/prefix-cache/reset", headers=JSON), 409, "conflict")
    assert_error(client.get(f"{BASE}/prefix-cache/blocks/8"), 404, "not_found")


def test_append_mode_mismatch_is_422(client):
    a = client.post(f"{BASE}/sequences", json={"tokens": [1, 2]}).json()
    r = client.post(f"{BASE}/sequences/{a['id']}/append", json={"num_tokens": 3})
    assert_error(r, 422, "invalid_request")
    assert "append 'tokens'" in r.json()["error"]["message"]


@pytest.mark.parametrize("spec, words", [
    ({"strategy": "contiguous"}, "only to strategy 'paged'"),
    ({"tokens_per_block": None}, "needs 'tokens_per_block'"),
    ({"prefix_caching": {"policy": "mru"}}, "prefix_caching.policy"),
])
def test_bad_prefix_pool_specs_are_422(client, spec, words):
    body = {**SPEC, "name": "bad", **spec}
    body = {k: v for k, v in body.items() if v is not None}
    r = client.post("/api/pools", json=body)
    assert_error(r, 422, "invalid_request")
    assert words in r.text
    assert "bad" not in [p["name"] for p in client.get("/api/pools").json()["pools"]]


def test_batch_open_append_close_with_per_op_errors(client):
    ops = [{"op": "open", "tokens": list(range(8))},
           {"op": "open", "tokens": list(range(8)) + [9]},
           {"op": "append", "id": 2, "tokens": [10, 11, 12]},
           {"op": "close", "id": 1},
           {"op": "close", "id": 1},
           {"op": "open", "block_hashes": [1, 2, 3], "num_tokens": 4}]
    results = client.post(f"{BASE}/ops", json={"ops": ops}).json()["results"]
    assert results[0]["ok"] and results[0]["cached_tokens"] == 0
    assert results[1]["cached_tokens"] == 8
    assert results[2]["num_tokens"] == 12
    assert results[3] == {"ok": True}
    assert results[4]["error"]["code"] == "not_found"
    assert results[5]["error"]["code"] == "invalid_request"
    r = client.post("/api/pools/default/ops", json={"ops": [{"op": "open", "tokens": [1]}]}).json()
    assert r["results"][0]["error"]["code"] == "conflict"
    assert_ok_check(client, "px")


def test_metrics_expose_prefix_queries_hits_and_block_histograms(client):
    a = client.post(f"{BASE}/sequences", json={"tokens": list(range(8))}).json()
    client.delete(f"{BASE}/sequences/{a['id']}")
    client.post(f"{BASE}/sequences", json={"tokens": list(range(8))})
    client.post(f"{BASE}/sequences", json={"tokens": list(range(100, 124))})  # evicts nothing held
    text = client.get("/metrics").text
    assert 'kvscope_prefix_cache_queries_total{pool="px"} 40.0' in text
    assert 'kvscope_prefix_cache_hits_total{pool="px"} 8.0' in text
    assert 'kvscope_prefix_blocks{pool="px",state="shared"}' in text
    assert 'kvscope_kv_block_reuse_gap_seconds_count{pool="px"} 2.0' in text
    assert "kvscope_kv_block_lifetime_seconds_bucket" in text
    assert "kvscope_kv_block_idle_before_evict_seconds_bucket" in text


def test_stats_are_plain_json_without_infinities(client):
    import json
    a = client.post(f"{BASE}/sequences", json={"tokens": list(range(8))}).json()
    client.delete(f"{BASE}/sequences/{a['id']}")
    stats = client.get(f"{BASE}/stats").json()
    json.dumps(stats, allow_nan=False)  # the stream sends these with json.dumps
    hist = stats["prefix"]["histograms"]["lifetime"]
    assert len(hist["counts"]) == len(hist["bounds"]) + 1
