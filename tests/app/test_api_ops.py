"""Batch ops: run in order, one result per op, per-op errors, stop_on_error, caps."""

from __future__ import annotations

import pytest
from apputil import assert_error, assert_ok_check, state_of

OPS = "/api/pools/default/ops"


def test_every_op_kind_in_order(client):
    ops = [
        {"op": "allocate", "bytes": 10_000},
        {"op": "extend", "id": 1, "bytes": 4096},
        {"op": "put", "key": "a", "bytes": 100},
        {"op": "get", "key": "a"},
        {"op": "get", "key": "missing"},
        {"op": "delete", "key": "a"},
        {"op": "free", "id": 1},
        {"op": "defragment"},
    ]
    r = client.post(OPS, json={"ops": ops})
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["ok"] for x in res] == [True, True, True, True, False, True, True, True]
    assert res[0]["id"] == 1 and res[0]["allocated_bytes"] == 3 * 4096 and res[0]["blocks"] == [[0, 3]]
    assert res[1]["allocated_bytes"] == 4 * 4096 and res[1]["moved"] is False
    assert res[2]["created"] is True and res[2]["evicted"] == [] and res[2]["entry"]["key"] == "a"
    assert res[3]["key"] == "a" and res[3]["id"] == res[2]["entry"]["id"] and res[3]["hits"] == 1
    assert res[4]["error"]["code"] == "not_found"  # a miss, as GET .../entries/{key} answers 404
    assert "moved_blocks" in res[7]
    stats = client.get("/api/pools/default/stats").json()
    assert stats["used_blocks"] == 0 and stats["cache"]["hits"] == 1 and stats["cache"]["misses"] == 1
    assert_ok_check(client)


def test_per_op_errors_do_not_stop_the_batch(client):
    ops = [{"op": "free", "id": 42}, {"op": "allocate", "bytes": 1 << 40}, {"op": "allocate", "bytes": 1},
           {"op": "allocate", "tokens": 1}, {"op": "allocate"}]
    res = client.post(OPS, json={"ops": ops}).json()["results"]
    assert [x["ok"] for x in res] == [False, False, True, False, False]
    assert res[0]["error"]["code"] == "not_found"
    assert res[1]["error"]["code"] == "too_large" and res[1]["error"]["details"]["capacity_bytes"] == 256 * 4096
    assert res[3]["error"]["code"] == "invalid_request"
    assert_ok_check(client)


def test_stop_on_error_stops_at_the_first_failure(client):
    ops = [{"op": "allocate", "bytes": 1}, {"op": "free", "id": 99}, {"op": "allocate", "bytes": 1}]
    res = client.post(OPS, json={"ops": ops, "stop_on_error": True}).json()["results"]
    assert [x["ok"] for x in res] == [True, False]
    assert client.get("/api/pools/default/stats").json()["allocation_count"] == 1


def test_malformed_batch_is_422_and_runs_nothing(client):
    before = state_of(client)
    for body in ({"ops": [{"op": "allocate", "bytes": 1}, {"op": "explode"}]},
                 {"ops": [{"op": "allocate", "bytes": 1}, {"op": "free"}]},
                 {"ops": "nope"}, {}, {"ops": [], "x": 1}):
        assert_error(client.post(OPS, json=body), 422, "invalid_request")
    assert state_of(client) == before


@pytest.mark.parametrize("op", ["put", "get", "delete"])
@pytest.mark.parametrize("key", ["a\u2028b", "\ufffd", "a\U000e0001", "a\x85"])
def test_batch_keys_are_validated_like_path_keys(client, op, key):
    before = state_of(client)
    body = {"ops": [{"op": "allocate", "bytes": 1}, {"op": op, "key": key, **({"bytes": 1} if op == "put" else {})}]}
    err = assert_error(client.post(OPS, json=body), 422, "invalid_request")
    assert err["details"]["field"] == f"ops.1.{op}.key"
    assert state_of(client) == before


def test_evict_op_evicts_manually_and_fails_per_op_on_pinned_or_missing(client):
    ops = [{"op": "put", "key": "a", "bytes": 10}, {"op": "put", "key": "p", "bytes": 10, "pinned": True},
           {"op": "evict", "key": "a"}, {"op": "evict", "key": "p"}, {"op": "evict", "key": "a"}]
    res = client.post(OPS, json={"ops": ops}).json()["results"]
    assert res[2] == {"ok": True}
    assert [r["ok"] for r in res] == [True, True, True, False, False]
    assert (res[3]["error"]["code"], res[4]["error"]["code"]) == ("conflict", "not_found")
    assert [e["key"] for e in client.get("/api/pools/default/entries").json()["entries"]] == ["p"]
    evicts = [e for e in client.get("/api/pools/default/events").json()["events"] if e["type"] == "evict"]
    assert [(e["key"], e["reason"]) for e in evicts] == [("a", "manual")]
    assert_ok_check(client)


def test_batch_cap_is_413_and_runs_nothing(client):
    before = state_of(client)
    ops = [{"op": "allocate", "bytes": 1}] * 1001
    assert_error(client.post(OPS, json={"ops": ops}), 413, "too_large")
    assert state_of(client) == before


def test_cache_ops_on_a_pool_without_cache_fail_per_op(client):
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    res = client.post("/api/pools/raw/ops", json={"ops": [{"op": "put", "key": "a", "bytes": 1},
                                                         {"op": "allocate", "bytes": 64}]}).json()["results"]
    assert res[0]["error"]["code"] == "conflict" and res[1]["ok"]


def test_entry_allocations_are_protected_in_batches(client):
    res = client.post(OPS, json={"ops": [{"op": "put", "key": "a", "bytes": 1}]}).json()["results"]
    aid = res[0]["entry"]["id"]
    res = client.post(OPS, json={"ops": [{"op": "free", "id": aid}, {"op": "extend", "id": aid, "bytes": 1}]}).json()
    assert [x["error"]["code"] for x in res["results"]] == ["conflict", "conflict"]
    # one guard for batches and REST alike: the same refusal, naming the entry's key
    rest = client.delete(f"/api/pools/default/allocations/{aid}").json()["error"]
    assert res["results"][0]["error"]["message"] == rest["message"] and "'a'" in rest["message"]
    assert_ok_check(client)


def test_cache_ops_without_a_cache_say_how_to_get_one_like_rest(client):
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    res = client.post("/api/pools/raw/ops", json={"ops": [{"op": "get", "key": "a"}]}).json()["results"]
    rest = client.get("/api/pools/raw/entries/a").json()["error"]
    assert res[0]["error"]["message"] == rest["message"] and "'cache'" in rest["message"]


def test_openapi_example_of_a_batch_matches_what_allocate_returns(client):
    example = client.get("/openapi.json").json()["components"]["schemas"]["BatchOut"]["examples"][0]
    shown = example["results"][0]
    got = client.post(OPS, json={"ops": [{"op": "allocate", "bytes": 65536}]}).json()["results"][0]
    # (the OpenAPI document leaves out null values: `tier` is null on a paged pool)
    assert set(shown) == {k for k, v in got.items() if v is not None}


def test_empty_batch(client):
    assert client.post(OPS, json={"ops": []}).json() == {"results": []}
