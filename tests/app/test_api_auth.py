"""Auth: with a token set, mutations need it (401 missing, 403 wrong); reads stay open, except
the entry GET, which touches the entry."""

from __future__ import annotations

import pytest
from apputil import assert_error, state_of

MUTATIONS = [
    ("POST", "/api/pools", {"name": "x", "num_blocks": 4, "block_bytes": 64}),
    ("DELETE", "/api/pools/default", None),
    ("POST", "/api/pools/default/reset", None),
    ("POST", "/api/pools/default/defragment", None),
    ("POST", "/api/pools/default/allocations", {"bytes": 1}),
    ("POST", "/api/pools/default/allocations/1/extend", {"bytes": 1}),
    ("DELETE", "/api/pools/default/allocations/1", None),
    ("PUT", "/api/pools/default/entries/a", {"bytes": 1}),
    ("DELETE", "/api/pools/default/entries/a", None),
    ("POST", "/api/pools/default/entries/a/evict", None),
    ("PUT", "/api/pools/default/entries/a/data", None),
    ("POST", "/api/pools/default/ops", {"ops": [{"op": "allocate", "bytes": 1}]}),
    ("PUT", "/api/pools/default/cache/policy", {"policy": "lfu"}),
    ("POST", "/api/pools/default/workload", {"kind": "scenario", "name": "burst"}),
    ("DELETE", "/api/pools/default/workload", None),
    ("GET", "/api/pools/default/entries/a", None),
    ("POST", "/api/pools/default/ops", {"ops": [{"op": "get", "key": "a"}]}),
]


@pytest.mark.parametrize("method,path,body", MUTATIONS)
def test_mutations_need_the_token(authed, method, path, body):
    before = state_of(authed)
    kw = {"json": body} if body is not None else {}
    assert_error(authed.request(method, path, **kw), 401, "unauthorized")
    assert_error(authed.request(method, path, headers={"Authorization": "Bearer nope"}, **kw), 403, "forbidden")
    assert_error(authed.request(method, path, headers={"Authorization": "Basic s3cret"}, **kw), 403, "forbidden")
    assert state_of(authed) == before


def test_entry_get_needs_the_token_and_touches_nothing_without_it(authed):
    h = {"Authorization": "Bearer s3cret"}
    authed.put("/api/pools/default/entries/a", json={"bytes": 1}, headers=h)
    before = authed.get("/api/pools/default/stats").json()["cache"]
    assert_error(authed.get("/api/pools/default/entries/a"), 401, "unauthorized")
    assert_error(authed.get("/api/pools/default/entries/zz"), 401, "unauthorized")
    assert authed.get("/api/pools/default/stats").json()["cache"] == before
    assert authed.get("/api/pools/default/entries/a", headers=h).json()["hits"] == 1


@pytest.mark.parametrize("authorization", ["Bearer", "Bearer ", "Bearer    "])
def test_empty_bearer_value_is_401_missing_not_403(authed, authorization):
    r = authed.post("/api/pools/default/reset", headers={"Authorization": authorization})
    assert_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"


def test_right_token_passes(authed):
    h = {"Authorization": "Bearer s3cret"}
    assert authed.post("/api/pools/default/allocations", json={"bytes": 1}, headers=h).status_code == 201
    assert authed.put("/api/pools/default/entries/a", json={"bytes": 1}, headers=h).status_code == 201


@pytest.mark.parametrize("path", ["/api/pools", "/api/pools/default", "/api/pools/default/stats",
                                  "/api/pools/default/blockmap", "/api/pools/default/entries",
                                  "/api/pools/default/events", "/metrics", "/healthz", "/openapi.json"])
def test_reads_stay_open(authed, path):
    assert authed.get(path).status_code == 200


def test_websocket_needs_the_token(authed):
    from starlette.websockets import WebSocketDisconnect

    for url, code in (("/ws/pools/default", 4401), ("/ws/pools/default?token=bad", 4403)):
        with authed.websocket_connect(url) as ws, pytest.raises(WebSocketDisconnect) as info:
            ws.receive_text()
        assert info.value.code == code
    with authed.websocket_connect("/ws/pools/default?token=s3cret") as ws:
        assert ws.receive_json()["type"] == "hello"
    with authed.websocket_connect("/ws/pools/default", headers={"Authorization": "Bearer s3cret"}) as ws:
        assert ws.receive_json()["type"] == "hello"


def test_page_says_a_token_is_required(authed, client):
    r = authed.get("/")
    assert r.status_code == 200, r.text
    assert 'data-token-required="true"' in r.text
    assert 'data-token-required="false"' in client.get("/").text
