"""An unexpected exception (a bug) on a real uvicorn: answered 500 `internal` in the error shape,
counted like any answer, and the keep-alive connection stays usable for the next request."""

from __future__ import annotations

import httpx
import pytest
from support.apputil import JSON, SMALL, LiveApp, assert_error

from app.http.security import SecurityMiddleware
from app.main import create_app
from app.settings import Settings


def logged_bug(caplog, method: str, path: str) -> None:
    """The middleware logged the exception with its traceback; consumed here, so that the
    autouse `no_internal_errors` (conftest) does not count this deliberate one."""
    records = [r for r in caplog.records if r.getMessage() == f"unhandled error on {method} {path}"]
    assert records and all(r.exc_info for r in records), caplog.records
    caplog.clear()


def client_addr(response: httpx.Response) -> tuple:
    """The client end of the connection that carried `response`."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


@pytest.fixture
def live():
    with LiveApp(create_app(Settings(**SMALL))) as server:
        yield server


@pytest.mark.parametrize("exc", [RuntimeError("boom"), MemoryError(), IndexError("tuple index out of range")])
def test_an_exception_inside_a_route_is_a_500_and_the_connection_stays_open(live, exc, caplog):
    pool = live.app.state.services.registry.get("default").pool

    def broken(*args, **kwargs):
        raise exc

    pool.allocate = broken
    with httpx.Client(base_url=live.url, timeout=10) as c:
        first = c.post("/api/pools/default/allocations", json={"bytes": 4096})
        assert_error(first, 500, "internal")
        assert first.headers["content-type"] == "application/json"
        assert first.headers.get("x-content-type-options") == "nosniff"  # every layer saw it
        after = c.get("/healthz")
        assert after.status_code == 200
        assert client_addr(after) == client_addr(first), "the server closed the connection"
        metrics = c.get("/metrics").text
    assert 'route="/api/pools/{pool}/allocations",status="500"' in metrics
    logged_bug(caplog, "POST", "/api/pools/default/allocations")


def test_head_on_a_failing_route_is_a_500_without_a_body(live, caplog):
    pool = live.app.state.services.registry.get("default").pool

    def broken():
        raise RuntimeError("boom")

    pool.stats = broken
    with httpx.Client(base_url=live.url, timeout=10) as c:
        head = c.head("/api/pools/default/stats")
        assert head.status_code == 500 and head.content == b""
        assert int(head.headers["content-length"]) > 0  # what GET would send
        get = c.get("/api/pools/default/stats")
        assert_error(get, 500, "internal")
        assert client_addr(get) == client_addr(head)
    logged_bug(caplog, "GET", "/api/pools/default/stats")  # HEAD runs as GET (app/http/head.py)


def test_an_exception_inside_a_middleware_is_a_500_and_the_connection_stays_open(live, monkeypatch, caplog):
    def broken(self, host):
        raise RuntimeError("boom")

    with httpx.Client(base_url=live.url, timeout=10) as c:
        before = c.get("/healthz")
        monkeypatch.setattr(SecurityMiddleware, "host_ok", broken)
        failed = c.post("/api/pools/default/allocations", json={"bytes": 4096})
        assert_error(failed, 500, "internal")
        monkeypatch.undo()
        after = c.post("/api/pools/default/allocations", content=b'{"bytes": 4096}', headers=JSON)
        assert after.status_code == 201
        assert client_addr(before) == client_addr(failed) == client_addr(after)
    logged_bug(caplog, "POST", "/api/pools/default/allocations")
