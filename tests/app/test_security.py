"""Cross-site protection (app/http/security.py): Host and Origin allow-lists, JSON on mutations so a
browser must preflight, security headers; HEAD and 405 Allow on every route."""

from __future__ import annotations

import httpx
import pytest
from starlette.websockets import WebSocketDisconnect
from support.apputil import JSON, Server, assert_error, make_client, state_of

from app.http.security import allowed_hosts_for

FORM = {"content-type": "application/x-www-form-urlencoded"}
EVIL = {"Origin": "http://evil.example"}


@pytest.fixture
def strict():
    """A server that, like the CLI's default, listens on loopback and trusts no other host."""
    with make_client(allowed_hosts=None) as c:
        yield c


@pytest.mark.parametrize("path,body", [
    ("/api/pools/default/reset", None), ("/api/pools/default/defragment", None),
    ("/api/pools/default/allocations", "bytes=10"), ("/api/pools/default/entries/a/evict", None),
    ("/api/pools", "name=x&num_blocks=4&block_bytes=64"),
])
def test_a_cross_site_form_post_is_refused_and_changes_nothing(client, path, body):
    client.post("/api/pools/default/allocations", json={"bytes": 4096})
    client.put("/api/pools/default/entries/a", json={"bytes": 1})
    before = state_of(client)
    # what <form method=post> on another site sends: its Origin, a form body
    assert_error(client.post(path, content=body or b"", headers={**FORM, **EVIL}), 403, "origin_not_allowed")
    # the same without an Origin (a non-browser client): still not JSON
    err = assert_error(client.post(path, content=body or b"", headers=FORM), 415, "unsupported_media_type")
    assert "application/json" in err["message"]
    for ctype in ("text/plain", "multipart/form-data; boundary=x"):
        assert_error(client.post(path, content=b"{}", headers={"content-type": ctype}), 415, "unsupported_media_type")
    # a bodiless POST without a Content-Type is a "simple" request too (no preflight): a browser
    # sends it cross-site with the page's Origin and Sec-Fetch-Site, and either refuses it
    assert_error(client.post(path, headers=EVIL), 403, "origin_not_allowed")
    for site in ("cross-site", "same-site", "Cross-Site"):
        err = assert_error(client.post(path, headers={"Sec-Fetch-Site": site}), 415, "unsupported_media_type")
        assert "application/json" in err["message"]
    assert state_of(client) == before


def test_json_posts_from_the_servers_own_origin_pass(client):
    own = {"Origin": "http://localhost"}
    assert client.post("/api/pools/default/reset", headers={**JSON, **own}).status_code == 200
    assert client.post("/api/pools/default/allocations", json={"bytes": 1}, headers=own).status_code == 201
    ctype = {"content-type": "application/json; charset=utf-8"}
    assert client.post("/api/pools/default/allocations", content=b'{"bytes": 1}', headers=ctype).status_code == 201


@pytest.mark.parametrize("method,path", [
    ("DELETE", "/api/pools/default"), ("PUT", "/api/pools/default/entries/a"),
    ("PUT", "/api/pools/default/cache/policy"), ("DELETE", "/api/pools/default/entries/a"),
])
def test_every_mutating_method_checks_the_origin(client, method, path):
    client.put("/api/pools/default/entries/a", json={"bytes": 1})
    before = state_of(client)
    for origin in ("http://evil.example", "null", "http://localhost.evil.example", "http://localhost:1"):
        r = client.request(method, path, json={"bytes": 1, "policy": "lfu"}, headers={"Origin": origin})
        assert_error(r, 403, "origin_not_allowed")
    assert state_of(client) == before


def test_a_put_body_needs_its_routes_media_type(client):
    client.put("/api/pools/default/entries/a", json={"bytes": 4})
    before = state_of(client)
    assert_error(client.put("/api/pools/default/entries/b", content=b'{"bytes": 1}', headers=FORM), 415,
                 "unsupported_media_type")
    err = assert_error(client.put("/api/pools/default/entries/a/data", content=b"abcd", headers=JSON), 415,
                       "unsupported_media_type")
    assert err["details"]["accepted"] == ["application/octet-stream"]
    assert state_of(client) == before
    # a bodiless DELETE needs no Content-Type: browsers preflight DELETE anyway
    assert client.delete("/api/pools/default/entries/a").status_code == 204


def test_allowed_origins_setting_lets_another_origin_in():
    with make_client(allowed_origins=("http://dash.example:3000",)) as c:
        ok = c.post("/api/pools/default/reset", headers={**JSON, "Origin": "http://dash.example:3000"})
        assert ok.status_code == 200
        assert_error(c.post("/api/pools/default/reset", headers={**JSON, **EVIL}), 403, "origin_not_allowed")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "localhost.evil"])
def test_a_foreign_host_header_is_refused_dns_rebinding(strict, host):
    for method, path in (("GET", "/api/pools"), ("GET", "/"), ("POST", "/api/pools/default/reset")):
        r = strict.request(method, path, headers={**JSON, "Host": host})
        assert_error(r, 403, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:9", "[::1]:8000", "app.localhost",
                                  "127.1.2.3"])
def test_loopback_hosts_pass(strict, host):
    assert strict.get("/api/pools", headers={"Host": host}).status_code == 200


def test_allowed_hosts_defaults_follow_the_listen_address():
    assert allowed_hosts_for("127.0.0.1", None) == ("127.0.0.1",)
    assert allowed_hosts_for("0.0.0.0", None) == ("*",)
    assert allowed_hosts_for("kv.lan", None) == ("kv.lan",)
    assert allowed_hosts_for("0.0.0.0", ("kv.lan",)) == ("kv.lan",)
    with make_client(allowed_hosts=("kv.lan",)) as c:
        assert c.get("/api/pools", headers={"Host": "kv.lan:8000"}).status_code == 200
        assert_error(c.get("/api/pools", headers={"Host": "other.lan"}), 403, "host_not_allowed")


def test_websocket_handshake_checks_origin_and_host(strict):
    from starlette.testclient import WebSocketDenialResponse

    own = "ws://localhost/ws/pools/default"  # the test client's own host name is "testserver"
    with strict.websocket_connect(own, headers={"Origin": "http://localhost"}) as ws:
        assert ws.receive_json()["type"] == "hello"
    for url, headers in ((own, EVIL), ("ws://evil.example/ws/pools/default", {}), (own, {"Origin": "null"})):
        with pytest.raises((WebSocketDisconnect, WebSocketDenialResponse)):
            with strict.websocket_connect(url, headers=headers) as ws:
                ws.receive_text()


def test_security_headers_on_every_answer(client):
    for path in ("/", "/api/pools", "/static/js/main.js", "/healthz", "/api/pools/nope"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    docs = client.get("/docs")
    assert "script-src 'self'" in docs.headers["content-security-policy"]
    assert "<script>" not in docs.text, "no inline script: the CSP would block it"


def test_templates_and_static_have_no_inline_scripts_or_handlers():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("templates/*.html"), *root.glob("static/js/*.js")]:
        text = path.read_text()
        # a data block (type="application/json") is never run, so the CSP has nothing to block
        assert not re.search(r"<script(?![^>]*\b(src=|type=\"application/json\"))[^>]*>", text), \
            f"inline <script> in {path}"
        assert not re.search(r"\son[a-z]+=\"", text), f"inline event handler in {path}"
        assert 'style="' not in text, f"inline style attribute in {path} (CSP style-src 'self')"


def test_head_works_on_every_get_route(client):
    from test_api_auth import PREFIX_POOL, concrete, every_route

    assert client.post("/api/pools", json=PREFIX_POOL).status_code == 201
    seq = client.post("/api/pools/pfx/sequences", json={"tokens": list(range(9))}).json()
    assert seq["id"] == 1 and seq["blocks"][0] == 0, seq  # what concrete() names
    client.put("/api/pools/default/entries/a", json={"bytes": 1})
    client.post("/api/pools/default/allocations", json={"bytes": 1})
    client.post("/api/pools/default/workload", json={"kind": "scenario", "name": "burst"})
    assert client.post("/api/routing", json={"limit": 10, "policies": ["session"]}).status_code == 202  # r1
    # fleet f with engine e0 (nothing listens there: the engine shows as unreachable)
    fleet = {"name": "f", "engines": [{"name": "e0", "endpoint": "tcp://127.0.0.1:9"}]}
    assert client.post("/api/fleets", json=fleet).status_code == 201
    for method, template in every_route(client.app):
        if method != "GET":
            continue
        path = concrete(template)
        path += "/js/main.js" if template == "/static" else ""
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code, (path, get.text[:200])
        # not a mirror (/forest); no recording file has the sample's name (/file)
        assert get.status_code == 200 or template.endswith(("/forest", "/file")), (path, get.text[:200])
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"]


@pytest.mark.parametrize("method,path,allow", [
    ("PUT", "/api/pools/default", "DELETE, GET, HEAD"),
    ("PATCH", "/api/pools/default/entries/a", "DELETE, GET, HEAD, PUT"),
    ("GET", "/api/pools/default/reset", "POST"),
    ("POST", "/healthz", "GET, HEAD"),
    ("DELETE", "/api/pools/default/workload", None),
])
def test_405_names_every_allowed_method(client, method, path, allow):
    r = client.request(method, path, headers=JSON)
    if allow is None:
        assert r.status_code == 404  # DELETE is allowed there: no workload is the 404
        return
    err = assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == allow
    assert err["details"]["allow"] == allow.split(", ")


def test_a_post_to_a_path_without_post_is_405_not_415(client):
    r = client.post("/api/pools/default/stats")  # no Content-Type either: the method is what is wrong
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, HEAD"


class HttpState:
    """`state_of` over plain HTTP, for a real server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **kw):
        return httpx.get(self.url + path, **kw)


@pytest.fixture(scope="module")
def live():
    srv = Server()
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


def test_a_scripts_bare_post_is_served_by_a_real_server(live):
    """`curl -X POST URL`, `requests.post(url)`, `httpx.post(url)`: no body, no Content-Type."""
    url = live.url + "/api/pools/default"
    assert httpx.post(url + "/allocations", json={"bytes": 40_000}).status_code == 201
    r = httpx.post(url + "/defragment")
    assert r.status_code == 200, r.text
    assert {"moved_blocks", "moved_bytes", "before", "after"} <= set(r.json())
    # what a browser says of a request the user or the page itself sent
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
                    {"Origin": live.url}, {"Origin": live.url, "Sec-Fetch-Site": "same-origin"}):
        assert httpx.post(url + "/defragment", headers=headers).status_code == 200, headers
    # a bodiless POST to a route that needs a body is that route's 422, naming the body
    err = assert_error(httpx.post(live.url + "/api/pools"), 422, "invalid_request")
    assert "body" in err["message"]
    assert httpx.post(url + "/reset").status_code == 200
    assert httpx.get(url + "/stats").json()["allocation_count"] == 0


def test_a_real_server_still_refuses_non_json_bodies_and_foreign_origins(live):
    url = live.url + "/api/pools/default"
    assert httpx.post(url + "/allocations", json={"bytes": 4096}).status_code == 201
    before = state_of(HttpState(live.url))
    for body, headers in ((b'{"bytes": 1}', {}), (b'{"bytes": 1}', {"content-type": "text/plain"}),
                          (b"", {"content-type": "text/plain"}), (b"bytes=1", FORM)):
        assert_error(httpx.post(url + "/allocations", content=body, headers=headers), 415,
                     "unsupported_media_type")
    for path in ("/defragment", "/reset", "/allocations"):
        assert_error(httpx.post(url + path, headers=EVIL), 403, "origin_not_allowed")
        assert_error(httpx.post(url + path, headers={**EVIL, "content-type": "text/plain"}), 403,
                     "origin_not_allowed")
        assert_error(httpx.post(url + path, headers={"Sec-Fetch-Site": "cross-site"}), 415,
                     "unsupported_media_type")
    assert state_of(HttpState(live.url)) == before
