"""Robustness: O(pool) calls off the event loop, stream client caps, the server-wide pool total,
restarts made visible (instance id, events cursor beyond the history)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from starlette.websockets import WebSocketDisconnect
from support.apputil import JSON, SMALL, assert_error, make_client, state_of

from app.main import create_app
from app.settings import Settings


def test_a_long_check_runs_off_the_loop_under_the_pools_lock():
    """While `check` of one pool runs, /healthz and other pools answer; the same pool waits."""

    async def go():
        app = create_app(Settings(**SMALL))
        async with app.router.lifespan_context(app):
            pool = app.state.services.registry.get("default").pool
            running, release = threading.Event(), threading.Event()
            real_check = pool.check

            def slow_check():
                running.set()
                release.wait(10)  # on the event loop this would freeze every other request
                return real_check()

            pool.check = slow_check
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                await c.post("/api/pools", json={"name": "other", "num_blocks": 8, "block_bytes": 64})
                check = asyncio.create_task(c.get("/api/pools/default/check"))
                while not running.is_set():
                    await asyncio.sleep(0.01)
                same_pool = asyncio.create_task(c.post("/api/pools/default/allocations", json={"bytes": 1}))
                assert (await c.get("/healthz")).status_code == 200
                assert (await c.post("/api/pools/other/allocations", json={"bytes": 1})).status_code == 201
                assert not check.done() and not same_pool.done(), "the pool is held by its check"
                release.set()
                assert (await check).json() == {"ok": True, "problems": []}
                assert (await same_pool).status_code == 201

    asyncio.run(go())


def test_blockmap_json_is_streamed_and_equals_the_runs(client):
    ids = [client.post("/api/pools/default/allocations", json={"bytes": 4096 * n}).json()["id"] for n in (1, 2, 3)]
    client.delete(f"/api/pools/default/allocations/{ids[1]}")
    r = client.get("/api/pools/default/blockmap?format=json")
    assert r.headers["content-type"] == "application/json" and "content-length" not in r.headers
    body = r.json()
    assert body["num_blocks"] == 256 and body["states"]
    assert body["runs"] == [[0, 1, ids[0], 1], [1, 2, -1, 0], [3, 3, ids[2], 1], [6, 250, -1, 0]]


def test_stream_client_caps_close_with_1013_and_a_reason():
    with make_client(max_stream_clients_per_pool=2, max_stream_clients=3) as c:
        c.post("/api/pools", json={"name": "b", "num_blocks": 8, "block_bytes": 64})
        with c.websocket_connect("/ws/pools/default") as a1, c.websocket_connect("/ws/pools/default") as a2:
            a1.receive_json(), a2.receive_json()
            with c.websocket_connect("/ws/pools/default") as a3, pytest.raises(WebSocketDisconnect) as info:
                a3.receive_text()
            assert info.value.code == 1013 and "KVSCOPE_MAX_STREAM_CLIENTS_PER_POOL" in info.value.reason
            with c.websocket_connect("/ws/pools/b") as b1:
                assert b1.receive_json()["type"] == "hello"
                with c.websocket_connect("/ws/pools/b") as b2, pytest.raises(WebSocketDisconnect) as info:
                    b2.receive_text()
                assert info.value.code == 1013 and "KVSCOPE_MAX_STREAM_CLIENTS" in info.value.reason
        # the slots come back when clients leave
        with c.websocket_connect("/ws/pools/default") as again:
            assert again.receive_json()["type"] == "hello"


def test_the_sum_of_pool_sizes_is_capped():
    total = 256 * 4096 + 64 * 1024  # the default pool plus 64 KiB
    with make_client(max_total_bytes=total) as c:
        before = state_of(c)
        err = assert_error(c.post("/api/pools", json={"name": "x", "num_blocks": 128, "block_bytes": 1024}),
                           409, "conflict")
        assert "KVSCOPE_MAX_TOTAL_BYTES" in err["message"]
        err = assert_error(c.post("/api/pools", json={"name": "x", "num_blocks": 2048, "block_bytes": 1024}),
                           413, "too_large")
        assert err["details"]["capacity_bytes"] == total
        assert state_of(c) == before
        assert c.post("/api/pools", json={"name": "x", "num_blocks": 64, "block_bytes": 1024}).status_code == 201
        # deleting `default` is allowed, and frees its share
        assert c.delete("/api/pools/default").status_code == 204
        assert c.post("/api/pools", json={"name": "y", "num_blocks": 256, "block_bytes": 4096}).status_code == 201
        assert sorted(p["name"] for p in c.get("/api/pools").json()["pools"]) == ["x", "y"]


def test_the_default_total_is_a_share_of_memory():
    from app.settings import TOTAL_POOL_SHARE, device_memory_bytes, total_pool_cap

    assert total_pool_cap(Settings(device="cpu")) == int(device_memory_bytes("cpu") * TOTAL_POOL_SHARE)
    assert total_pool_cap(Settings(device="cpu", max_total_bytes=123)) == 123


def test_hello_and_healthz_name_the_server_instance(client):
    health = client.get("/healthz").json()
    with client.websocket_connect("/ws/pools/default") as ws:
        hello = ws.receive_json()
    assert hello["instance_id"] == health["instance_id"] and hello["started_at"] == health["started_at"]
    with make_client() as other:
        assert other.get("/healthz").json()["instance_id"] != health["instance_id"]


def test_an_events_cursor_beyond_the_history_is_409_history_reset(client):
    client.post("/api/pools/default/allocations", json={"bytes": 1})
    page = client.get("/api/pools/default/events").json()
    last = page["last_seq"]
    assert page["instance_id"] == client.get("/healthz").json()["instance_id"]
    assert client.get(f"/api/pools/default/events?after={last}").json()["events"] == []
    err = assert_error(client.get(f"/api/pools/default/events?after={last + 1}"), 409, "history_reset")
    assert err["details"]["last_seq"] == last and err["details"]["after"] == last + 1
    assert "after=0" in err["message"]


def test_a_request_waiting_for_a_deleted_pool_gets_404():
    async def go():
        app = create_app(Settings(**SMALL))
        async with app.router.lifespan_context(app):
            handle = app.state.services.registry.get("default")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                async with handle.lock:  # as a long check would
                    waiting = asyncio.create_task(c.post("/api/pools/default/allocations", json={"bytes": 1}))
                    await asyncio.sleep(0.05)
                    app.state.services.registry.remove("default")
                r = await waiting
                assert_error(r, 404, "not_found")

    asyncio.run(go())


def test_reset_and_defragment_run_in_a_thread_and_answer(client):
    client.post("/api/pools/default/allocations", json={"bytes": 4096})
    assert client.post("/api/pools/default/defragment", headers=JSON).status_code == 200
    assert client.post("/api/pools/default/reset", headers=JSON).json() == {"freed": 1}
