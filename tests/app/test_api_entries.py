"""Cache entries: put (201/200), get (hit/miss), delete, list in eviction order, raw data."""

from __future__ import annotations

import pytest
from support.apputil import JSON, assert_error, assert_ok_check, make_client, state_of

BASE = "/api/pools/default/entries"


def test_put_new_is_201_existing_is_200(client):
    r = client.put(f"{BASE}/a", json={"bytes": 5000})
    assert r.status_code == 201
    body = r.json()
    assert body["evicted"] == [] and body["entry"]["key"] == "a" and body["entry"]["bytes"] == 5000
    assert body["entry"]["blocks"] == [[0, 2]]
    r = client.put(f"{BASE}/a", json={"bytes": 5000, "priority": 2})
    assert r.status_code == 200 and r.json()["entry"]["priority"] == 2
    assert_ok_check(client)


def test_get_hit_touches_miss_is_404_and_counted(client):
    client.put(f"{BASE}/a", json={"bytes": 10})
    r = client.get(f"{BASE}/a")
    assert r.status_code == 200 and r.json()["hits"] == 1
    assert_error(client.get(f"{BASE}/zzz"), 404, "not_found")
    cache = client.get("/api/pools/default/stats").json()["cache"]
    assert (cache["hits"], cache["misses"]) == (1, 1)


def test_capacity_evicts_lru_first_and_reports_keys(client):
    # 256 blocks of 4 KiB; each entry takes 64 blocks: the fifth put evicts the least recent.
    for k in "abcd":
        assert client.put(f"{BASE}/{k}", json={"bytes": 64 * 4096}).status_code == 201
    client.get(f"{BASE}/a")
    order = [e["key"] for e in client.get(BASE).json()["entries"]]
    assert order == ["b", "c", "d", "a"]
    r = client.put(f"{BASE}/e", json={"bytes": 64 * 4096})
    assert r.status_code == 201 and r.json()["evicted"] == ["b"]
    events = client.get("/api/pools/default/events", params={"after": 0, "limit": 1000}).json()["events"]
    evicts = [e for e in events if e["type"] == "evict"]
    assert evicts[-1]["key"] == "b" and evicts[-1]["reason"] == "capacity"
    assert_ok_check(client)


def test_entry_above_capacity_is_413_and_changes_nothing(client):
    client.put(f"{BASE}/a", json={"bytes": 100})
    before = state_of(client)
    err = assert_error(client.put(f"{BASE}/big", json={"bytes": 257 * 4096}), 413, "too_large")
    assert err["details"] == {"requested_bytes": 257 * 4096, "capacity_bytes": 256 * 4096, "of": "cache"}
    assert state_of(client) == before


def test_pinned_entries_block_eviction_with_507(client):
    client.put(f"{BASE}/p", json={"bytes": 200 * 4096, "pinned": True})
    before = state_of(client)
    err = assert_error(client.put(f"{BASE}/q", json={"bytes": 100 * 4096}), 507, "out_of_memory")
    assert err["details"]["cause"] == "capacity"
    assert state_of(client) == before


@pytest.mark.parametrize("body", [
    {}, {"bytes": 0}, {"bytes": 1, "tokens": 1}, {"bytes": 1, "ttl_s": 0}, {"bytes": 1, "ttl_s": -1},
    {"bytes": 1, "priority": 1.5}, {"bytes": 1, "pinned": "maybe"}, {"bytes": 1, "x": 1},
])
def test_bad_put_bodies_are_422(client, body):
    before = state_of(client)
    assert_error(client.put(f"{BASE}/k", json=body), 422, "invalid_request")
    assert state_of(client) == before


def test_key_validation(client):
    before = state_of(client)
    assert_error(client.put(f"{BASE}/{'k' * 257}", json={"bytes": 1}), 422, "invalid_request")
    assert_error(client.put(f"{BASE}/a%01b", json={"bytes": 1}), 422, "invalid_request")
    assert state_of(client) == before
    assert client.put(f"{BASE}/{'k' * 256}", json={"bytes": 1}).status_code == 201
    assert client.put(f"{BASE}/caf%C3%A9 1", json={"bytes": 1}).status_code == 201
    assert client.get(f"{BASE}/caf%C3%A9 1").json()["key"] == "café 1"


@pytest.mark.parametrize("raw", ["a%FFb", "a%FEb", "%EF%BF%BD", "%C3", "a%E2%80%A8b"])
def test_invalid_utf8_and_unprintable_keys_are_422_on_every_route(client, raw):
    client.put(f"{BASE}/a", json={"bytes": 1})
    before = state_of(client)
    for method, suffix, kw in (("PUT", "", {"json": {"bytes": 1}}), ("GET", "", {}), ("DELETE", "", {}),
                               ("PUT", "/data", {"content": b"x",
                                                 "headers": {"content-type": "application/octet-stream"}}),
                               ("GET", "/data", {})):
        err = assert_error(client.request(method, f"{BASE}/{raw}{suffix}", **kw), 422, "invalid_request")
        assert err["details"]["field"] == "key"
    assert state_of(client) == before


def test_manual_evict_is_204_with_an_evict_event_of_reason_manual(client):
    client.put(f"{BASE}/a", json={"bytes": 10})
    client.put(f"{BASE}/b", json={"bytes": 10})
    r = client.post(f"{BASE}/a/evict", headers=JSON)
    assert r.status_code == 204 and r.content == b""
    assert [e["key"] for e in client.get(BASE).json()["entries"]] == ["b"]
    evicts = [e for e in client.get("/api/pools/default/events").json()["events"] if e["type"] == "evict"]
    assert [(e["key"], e["reason"]) for e in evicts] == [("a", "manual")]
    assert client.get("/api/pools/default/stats").json()["cache"]["evictions"]["manual"] == 1
    assert_error(client.post(f"{BASE}/a/evict", headers=JSON), 404, "not_found")
    assert_ok_check(client)


def test_manual_evict_of_a_pinned_entry_is_409_and_changes_nothing(client):
    client.put(f"{BASE}/p", json={"bytes": 10, "pinned": True})
    before = state_of(client)
    err = assert_error(client.post(f"{BASE}/p/evict", headers=JSON), 409, "conflict")
    assert "pinned" in err["message"]
    assert state_of(client) == before


def test_delete_then_404(client):
    client.put(f"{BASE}/a", json={"bytes": 10})
    assert client.delete(f"{BASE}/a").status_code == 204
    before = state_of(client)
    assert_error(client.delete(f"{BASE}/a"), 404, "not_found")
    assert state_of(client) == before


def test_list_limit_and_total(client):
    for i in range(5):
        client.put(f"{BASE}/k{i}", json={"bytes": 10})
    body = client.get(BASE, params={"limit": 2}).json()
    assert body["total"] == 5 and [e["key"] for e in body["entries"]] == ["k0", "k1"]
    assert_error(client.get(BASE, params={"limit": 0}), 422, "invalid_request")


def test_data_roundtrip_as_raw_bytes(client):
    client.put(f"{BASE}/d", json={"bytes": 10_000})
    payload = bytes(range(256)) * 39
    r = client.put(f"{BASE}/d/data", content=payload, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 204
    r = client.get(f"{BASE}/d/data")
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content == payload  # exactly what was written, not the entry's whole reservation
    # data survives defragmentation (blocks move, bytes do not change)
    client.post("/api/pools/default/defragment", headers=JSON)
    assert client.get(f"{BASE}/d/data").content[: len(payload)] == payload


def test_data_errors(client):
    client.put(f"{BASE}/d", json={"bytes": 10})
    assert_error(client.put(f"{BASE}/d/data", content=b"x" * 11, headers={"content-type": "application/octet-stream"}),
                 422, "invalid_request")
    assert_error(client.put(f"{BASE}/none/data", content=b"x", headers={"content-type": "application/octet-stream"}),
                 404, "not_found")
    assert_error(client.get(f"{BASE}/none/data"), 404, "not_found")


def test_body_cap_is_413(client):
    client.put(f"{BASE}/d", json={"bytes": 100})
    before = state_of(client)
    assert_error(client.put(f"{BASE}/d/data", content=b"x" * ((1 << 20) + 1),
                            headers={"content-type": "application/octet-stream"}), 413, "too_large")

    def chunks():
        for _ in range(3):
            yield b"y" * (1 << 19)

    assert_error(client.put(f"{BASE}/d/data", content=chunks(), headers={"content-type": "application/octet-stream"}),
                 413, "too_large")
    assert state_of(client) == before
    assert client.get(f"{BASE}/d/data").content != b"y" * 100


def test_pool_without_cache_is_409_on_entries(client):
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    assert_error(client.put("/api/pools/raw/entries/a", json={"bytes": 1}), 409, "conflict")
    assert_error(client.get("/api/pools/raw/entries"), 409, "conflict")


def test_ttl_expired_entry_misses():
    import time

    with make_client() as c:
        c.put(f"{BASE}/t", json={"bytes": 10, "ttl_s": 0.05})
        time.sleep(0.1)
        assert_error(c.get(f"{BASE}/t"), 404, "not_found")
        evicts = [e for e in c.get("/api/pools/default/events").json()["events"] if e["type"] == "evict"]
        assert evicts and evicts[-1]["reason"] == "ttl"


def test_ttl_entries_are_reaped_without_being_asked_for():
    import time

    with make_client() as c:
        c.put(f"{BASE}/t", json={"bytes": 10, "ttl_s": 0.2})
        c.put(f"{BASE}/keep", json={"bytes": 10})
        # no GET of the key: only the server's own reaping can remove it (wait for its event)
        deadline = time.monotonic() + 30
        while not any(e["type"] == "evict" for e in c.get("/api/pools/default/events").json()["events"]):
            assert time.monotonic() < deadline, "the expired entry was never reaped"
            time.sleep(0.05)
        listed = c.get(BASE).json()
        assert [e["key"] for e in listed["entries"]] == ["keep"] and listed["total"] == 1
        evicts = [e for e in c.get("/api/pools/default/events").json()["events"] if e["type"] == "evict"]
        assert [(e["key"], e["reason"]) for e in evicts] == [("t", "ttl")]
        assert c.get("/api/pools/default/stats").json()["cache"]["evictions"]["ttl"] == 1


def test_unwritten_entry_reads_empty_never_a_previous_owners_bytes(client):
    client.put(f"{BASE}/old", json={"bytes": 4096})
    client.put(f"{BASE}/old/data", content=b"secret" * 100, headers={"content-type": "application/octet-stream"})
    client.delete(f"{BASE}/old")
    client.put(f"{BASE}/new", json={"bytes": 4096})  # takes the blocks "old" just released
    r = client.get(f"{BASE}/new/data")
    assert r.status_code == 200 and r.content == b""


def test_put_on_an_existing_key_keeps_what_it_does_not_name(client):
    client.put(f"{BASE}/keep", json={"bytes": 4096, "priority": 3, "pinned": True, "ttl_s": 600})
    entry = client.put(f"{BASE}/keep", json={"bytes": 8192}).json()["entry"]  # only resized
    assert (entry["priority"], entry["pinned"], entry["ttl_s"]) == (3, True, 600)
    entry = client.put(f"{BASE}/keep", json={"bytes": 8192, "pinned": False}).json()["entry"]
    assert (entry["priority"], entry["pinned"]) == (3, False)
    fresh = client.put(f"{BASE}/new-one", json={"bytes": 4096}).json()["entry"]
    assert (fresh["priority"], fresh["pinned"], fresh["ttl_s"]) == (0, False, None)
