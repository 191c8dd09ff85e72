"""Auth: with a token set, every route under /api and /ws needs it (reads too: they reveal keys,
allocations and stored bytes); only the pages, /healthz, /metrics and the static files are open.
The routes are enumerated from the app's router, so a new route cannot be forgotten."""

from __future__ import annotations

import re

import pytest
from starlette.routing import Mount
from starlette.websockets import WebSocketDisconnect
from support.apputil import JSON, assert_error, make_client, state_of

from app.http.routing_index import flat_routes

H = {"Authorization": "Bearer s3cret"}
# Exactly what is answered without the token (method, path template).
PUBLIC = {("GET", "/"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/healthz"),
          ("GET", "/metrics"), ("GET", "/static")}
SAMPLE = {"pool": "default", "key": "a", "id": "1", "block": "0", "name": "r1",  # name: a recording
          "run_id": "r1",  # run_id: a routing run
          "fleet": "f", "engine": "e0"}
# Routes that only a prefix-caching pool serves are tried on one (PREFIX_POOL), so they answer
# for real rather than with "this pool has no prefix caching".
PREFIX_ROUTES = ("/sequences", "/prefix-cache")
PREFIX_POOL = {"name": "pfx", "num_blocks": 64, "block_bytes": 16, "tokens_per_block": 4,
               "device": "cpu", "prefix_caching": {"policy": "lru"}}


def every_route(app) -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves; "WS" for websockets."""
    out = []
    for route in flat_routes(app):
        if isinstance(route, Mount):
            out.append(("GET", route.path))
        elif getattr(route, "methods", None):
            out += [(m, route.path) for m in sorted(route.methods) if m != "HEAD"]
        else:
            out.append(("WS", route.path))
    return out


def concrete(template: str) -> str:
    sample = dict(SAMPLE, pool="pfx") if any(p in template for p in PREFIX_ROUTES) else SAMPLE
    return re.sub(r"\{(\w+)\}", lambda m: sample[m.group(1)], template)


def test_every_route_but_the_public_ones_needs_the_token(authed):
    authed.put("/api/pools/default/entries/a", json={"bytes": 1}, headers=H)
    routes = every_route(authed.app)
    assert len(routes) > 25, routes  # the enumeration sees the included routers
    before = state_of_authed(authed)
    public = set()
    for method, template in routes:
        path = concrete(template) + ("/js/main.js" if template == "/static" else "")
        if method == "WS":
            with authed.websocket_connect(path) as ws, pytest.raises(WebSocketDisconnect) as info:
                ws.receive_text()
            assert info.value.code == 4401, template
            continue
        r = authed.request(method, path, headers=JSON if method != "GET" else {})
        if r.status_code == 401:
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        else:
            public.add((method, template))
    assert public == PUBLIC
    assert state_of_authed(authed) == before, "a refused request changed nothing"


def state_of_authed(client) -> dict:
    client.headers.update(H)
    try:
        return state_of(client)
    finally:
        del client.headers["Authorization"]


def test_stored_bytes_and_keys_need_the_token(authed):
    authed.put("/api/pools/default/entries/a", json={"bytes": 8}, headers=H)
    authed.put("/api/pools/default/entries/a/data", content=b"secret!!",
               headers={**H, "content-type": "application/octet-stream"})
    for path in ("/api/pools/default/entries/a/data", "/api/pools/default/entries",
                 "/api/pools/default/events", "/api/pools/default/allocations/0"):
        assert_error(authed.get(path), 401, "unauthorized")
        assert_error(authed.get(path, headers={"Authorization": "Bearer nope"}), 403, "forbidden")
    assert authed.get("/api/pools/default/entries/a/data", headers=H).content == b"secret!!"


@pytest.mark.parametrize("authorization", ["Bearer", "Bearer ", "Bearer    ", "  "])
def test_empty_bearer_value_is_401_missing_not_403(authed, authorization):
    r = authed.post("/api/pools/default/reset", headers={**JSON, "Authorization": authorization})
    assert_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("authorization,status", [
    ("Bearer  s3cret  ", 0), ("bearer s3cret", 0), ("Basic s3cret", 403), ("Bearer s3cret2", 403),
    ("Bearer s3cr\u00e9t", 403), ("Bearer S3CRET", 403),
])
def test_the_token_compares_the_same_on_rest(authed, authorization, status):
    r = authed.get("/api/pools", headers={"Authorization": authorization.encode("utf-8")})
    assert r.status_code == (status or 200), r.text


@pytest.mark.parametrize("query,code", [
    ("", 4401), ("?token=", 4401), ("?token=%20", 4401), ("?token=bad", 4403), ("?token=s3cr%C3%A9t", 4403),
    ("?token=S3CRET", 4403),
])
def test_websocket_refusals_use_the_same_rules(authed, query, code):
    with authed.websocket_connect(f"/ws/pools/default{query}") as ws, pytest.raises(WebSocketDisconnect) as info:
        ws.receive_text()
    assert info.value.code == code


def test_websocket_with_the_token_gets_hello(authed):
    for url, headers in (("/ws/pools/default?token=s3cret", {}), ("/ws/pools/default?token=%20s3cret%20", {}),
                         ("/ws/pools/default", H)):
        with authed.websocket_connect(url, headers=headers) as ws:
            assert ws.receive_json()["type"] == "hello"


def test_right_token_passes(authed):
    assert authed.post("/api/pools/default/allocations", json={"bytes": 1}, headers=H).status_code == 201
    assert authed.put("/api/pools/default/entries/a", json={"bytes": 1}, headers=H).status_code == 201
    assert authed.get("/api/pools/default/entries/a", headers=H).json()["hits"] == 1


def test_without_a_token_everything_is_open(client):
    assert client.get("/api/pools/default/entries").status_code == 200
    with client.websocket_connect("/ws/pools/default") as ws:
        assert ws.receive_json()["type"] == "hello"


def test_page_says_a_token_is_required(authed, client):
    r = authed.get("/")
    assert r.status_code == 200, r.text
    assert 'data-token-required="true"' in r.text
    assert 'data-token-required="false"' in client.get("/").text


def test_without_a_token_the_bearer_scheme_is_optional(client):
    spec = client.get("/openapi.json").json()
    assert spec["paths"]["/api/pools"]["get"]["security"] == [{}, {"bearer": []}]


def test_openapi_declares_bearer_on_gated_routes_only():
    with make_client(token="t") as c:
        spec = c.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearer"]["description"]}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            gated = path.startswith("/api/")
            assert (op.get("security") == [{"bearer": []}]) == gated, (method, path)
