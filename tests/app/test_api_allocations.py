"""Raw allocations: allocate, get, extend, free, and every way they can be refused."""

from __future__ import annotations

import pytest
from support.apputil import assert_error, assert_ok_check, state_of

BASE = "/api/pools/default/allocations"


def test_allocate_get_extend_free_roundtrip(client):
    r = client.post(BASE, json={"bytes": 10_000})
    assert r.status_code == 201
    alloc = r.json()
    assert alloc["requested_bytes"] == 10_000 and alloc["allocated_bytes"] == 3 * 4096
    assert alloc["blocks"] == [[0, 3]] and alloc["state"] == "used"
    aid = alloc["id"]
    assert client.get(f"{BASE}/{aid}").json()["blocks"] == [[0, 3]]
    r = client.post(f"{BASE}/{aid}/extend", json={"bytes": 5_000})
    assert r.status_code == 200 and r.json()["requested_bytes"] == 15_000
    assert r.json()["allocated_bytes"] == 4 * 4096
    assert_ok_check(client)
    assert client.delete(f"{BASE}/{aid}").status_code == 204
    assert_error(client.get(f"{BASE}/{aid}"), 404, "not_found")
    assert client.get("/api/pools/default/stats").json()["used_blocks"] == 0


def test_allocation_of_a_cache_entry_names_its_key_and_age(client):
    entry = client.put("/api/pools/default/entries/sess", json={"bytes": 100}).json()["entry"]
    body = client.get(f"{BASE}/{entry['id']}").json()
    assert body["key"] == "sess" and body["state"] == "cached"
    assert body["age_s"] >= 0 and body["idle_s"] >= 0
    raw = client.post(BASE, json={"bytes": 1}).json()
    assert client.get(f"{BASE}/{raw['id']}").json()["key"] is None


def test_out_of_memory_is_507_with_details_and_changes_nothing(client):
    client.post(BASE, json={"bytes": 4096 * 200})
    before = state_of(client)
    err = assert_error(client.post(BASE, json={"bytes": 4096 * 100}), 507, "out_of_memory")
    assert err["details"] == {"requested_bytes": 4096 * 100, "free_bytes": 56 * 4096,
                              "largest_free_bytes": 56 * 4096, "cause": "capacity"}
    assert state_of(client) == before


def test_failed_extend_leaves_the_allocation_unchanged(client):
    aid = client.post(BASE, json={"bytes": 4096}).json()["id"]
    before = state_of(client)
    # The whole pool's worth more: not now (507), since the allocation could be freed first.
    assert_error(client.post(f"{BASE}/{aid}/extend", json={"bytes": 4096 * 256}), 507, "out_of_memory")
    assert state_of(client) == before
    assert client.get(f"{BASE}/{aid}").json()["requested_bytes"] == 4096


@pytest.mark.parametrize("path,body", [
    ("", {"bytes": 10**18}), ("", {"bytes": 4096 * 256 + 1}), ("/extend", {"bytes": 4096 * 1000}),
])
def test_a_request_larger_than_the_pool_is_413_too_large_with_the_capacity(client, path, body):
    aid = client.post(BASE, json={"bytes": 4096}).json()["id"]
    before = state_of(client)
    url = f"{BASE}/{aid}{path}" if path else BASE
    err = assert_error(client.post(url, json=body), 413, "too_large")
    assert err["details"]["capacity_bytes"] == 256 * 4096
    assert err["details"]["requested_bytes"] == body["bytes"]
    assert state_of(client) == before
    assert client.get("/api/pools/default/stats").json()["ooms"]["capacity"] == 0, "not an OOM"


def test_entry_larger_than_the_cache_is_413_and_evicts_nothing(client):
    client.put("/api/pools/default/entries/keep", json={"bytes": 4096})
    before = state_of(client)
    err = assert_error(client.put("/api/pools/default/entries/huge", json={"bytes": 10**15}), 413, "too_large")
    assert err["details"]["of"] == "cache"
    assert state_of(client) == before
    r = client.post("/api/pools/default/ops", json={"ops": [{"op": "allocate", "bytes": 10**15},
                                                             {"op": "put", "key": "h", "bytes": 10**15}]})
    assert [x["error"]["code"] for x in r.json()["results"]] == ["too_large", "too_large"]
    assert state_of(client) == before


@pytest.mark.parametrize("body", [
    {}, {"bytes": 0}, {"bytes": -5}, {"bytes": 1.5}, {"bytes": "10"}, {"bytes": True},
    {"bytes": 1, "tokens": 1}, {"tokens": 3}, {"bytes": 1, "extra": 2}, [], "x", None,
])
def test_bad_sizes_are_422_and_change_nothing(client, body):
    before = state_of(client)
    kw = {"json": body} if body is not None else {"content": b"null", "headers": {"content-type": "application/json"}}
    assert_error(client.post(BASE, **kw), 422, "invalid_request")
    assert state_of(client) == before


def test_malformed_json_is_422(client):
    before = state_of(client)
    r = client.post(BASE, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_request")
    assert state_of(client) == before


def test_huge_size_is_413_not_a_crash(client):
    assert_error(client.post(BASE, json={"bytes": 1 << 60}), 413, "too_large")
    assert_error(client.post(BASE, json={"bytes": 1 << 70}), 422, "invalid_request")


@pytest.mark.parametrize("method,suffix,body", [
    ("get", "", None), ("delete", "", None), ("post", "/extend", {"bytes": 1}),
])
def test_unknown_allocation_is_404(client, method, suffix, body):
    before = state_of(client)
    kw = {"json": body} if body is not None else {}
    assert_error(client.request(method.upper(), f"{BASE}/999{suffix}", **kw), 404, "not_found")
    assert_error(client.request(method.upper(), f"{BASE}/abc{suffix}", **kw), 422, "invalid_request")
    assert state_of(client) == before


def test_double_free_is_404(client):
    aid = client.post(BASE, json={"bytes": 1}).json()["id"]
    assert client.delete(f"{BASE}/{aid}").status_code == 204
    before = state_of(client)
    assert_error(client.delete(f"{BASE}/{aid}"), 404, "not_found")
    assert state_of(client) == before


def test_cache_entries_cannot_be_freed_as_raw_allocations(client):
    aid = client.put("/api/pools/default/entries/k", json={"bytes": 10}).json()["entry"]["id"]
    before = state_of(client)
    assert_error(client.delete(f"{BASE}/{aid}"), 409, "conflict")
    assert_error(client.post(f"{BASE}/{aid}/extend", json={"bytes": 10}), 409, "conflict")
    assert state_of(client) == before
    assert_ok_check(client)
