"""The Mooncake replay as a live workload through the API, on a real prefix-caching pool."""

from __future__ import annotations

import time

import pytest
from support.apputil import assert_error, assert_ok_check, make_client, state_of

BASE = "/api/pools/mc"
SPEC = {"name": "mc", "num_blocks": 16_384, "block_bytes": 16, "tokens_per_block": 16,
        "device": "cpu", "prefix_caching": {"policy": "lru"}}


@pytest.fixture()
def client():
    with make_client() as c:
        assert c.post("/api/pools", json=SPEC).status_code == 201
        yield c


def test_mooncake_replay_runs_to_the_end_and_shares_prefixes(client):
    r = client.post(f"{BASE}/workload", json={"kind": "mooncake", "limit": 40, "speed": 1000.0})
    assert r.status_code == 202, r.text
    assert r.json()["workload"]["kind"] == "mooncake"
    deadline = time.monotonic() + 60
    while (wl := client.get(f"{BASE}/workload").json()["workload"])["state"] == "running":
        assert time.monotonic() < deadline, wl
        time.sleep(0.05)
    assert wl["state"] == "finished" and wl["done"] == wl["total"] == 40
    prefix = client.get(f"{BASE}/stats").json()["prefix"]
    assert prefix["hits"] > 0 and prefix["sequences"] == 0 and prefix["blocks"]["cached"] > 0
    assert_ok_check(client, "mc")


def test_mooncake_on_a_pool_without_prefix_caching_is_refused_and_changes_nothing(client):
    before = state_of(client)
    r = client.post("/api/pools/default/workload", json={"kind": "mooncake", "limit": 5})
    assert_error(r, 422, "invalid_request")
    assert "prefix caching" in r.json()["error"]["message"]
    assert state_of(client) == before
    for body in ({"kind": "mooncake", "limit": 0}, {"kind": "mooncake", "name": "chat"}):
        assert_error(client.post(f"{BASE}/workload", json=body), 422, "invalid_request")
