"""Token counts and sizes up to the schema's maxima, against a real `kvscope serve`: refused with
the core's 4xx / 507 body, judged before anything of their size is built, state unchanged,
`check` clean, and the keep-alive connection still usable. (The module's server fails at
teardown if any request logged a traceback: no 500 hides behind a 4xx here.)"""

from __future__ import annotations

import httpx
import pytest
from support.apputil import JSON, assert_error, assert_ok_check, state_of

from app.schemas import MAX_BYTES, MAX_TOKENS

TPB = 16
PREFIX = {"num_blocks": 64, "block_bytes": 1024, "tokens_per_block": TPB, "device": "cpu",
          "prefix_caching": {"policy": "lru"}, "cache": {"policy": "lru"}}
# a model, so that sizes may be given in tokens (llama-3-8b: 128 KiB per token)
MODEL = {"capacity_bytes": 1 << 24, "model": "llama-3-8b", "tokens_per_block": TPB, "device": "cpu",
         "cache": {"policy": "lru"}}
HUGE = [1 << 32, 1 << 34, MAX_TOKENS]


def client_addr(response: httpx.Response) -> tuple:
    return response.extensions["network_stream"].get_extra_info("client_addr")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for name, spec in (("px", PREFIX), ("pm", {**MODEL, "strategy": "paged"}),
                           ("cm", {**MODEL, "strategy": "contiguous"}),
                           ("tm", {"strategy": "tiered", "num_blocks": 64, "block_bytes": 4096,
                                   "device": "cpu", "cache": {"policy": "lru"}})):
            r = c.post("/api/pools", json={"name": name, **spec})
            assert r.status_code == 201, r.text
        yield c


def prefix_state(c: httpx.Client) -> dict:
    ids = c.get("/api/pools/px/sequences").json()["ids"]
    prefix = c.get("/api/pools/px/stats").json()["prefix"]
    return {"pool": state_of(c, "px"), "sequences": [c.get(f"/api/pools/px/sequences/{i}").json() for i in ids],
            "prefix": {k: prefix[k] for k in ("queries", "hits", "blocks", "cached_hashes", "sequences")}}


@pytest.fixture
def px(http):
    assert http.post("/api/pools/px/reset", headers=JSON).status_code == 200
    held = http.post("/api/pools/px/sequences", json={"tokens": list(range(2 * TPB))})  # 2 blocks
    assert held.status_code == 201
    return http


@pytest.mark.parametrize("num_tokens", HUGE)
def test_an_open_past_the_pool_is_507_with_the_cores_body_and_the_connection_stays(px, num_tokens):
    before = prefix_state(px)
    first = px.post("/api/pools/px/sequences", json={"num_tokens": num_tokens})
    err = assert_error(first, 507, "out_of_memory")
    assert err["details"] == {
        "needed_blocks": num_tokens // TPB, "available_blocks": 62, "held_blocks": 2, "cached_blocks": 0,
        "requested_bytes": num_tokens // TPB * 1024, "free_bytes": 62 * 1024,
        "largest_free_bytes": 62 * 1024, "cause": "capacity"}
    after = px.get("/healthz")
    assert after.status_code == 200 and client_addr(after) == client_addr(first)
    assert prefix_state(px) == before
    assert_ok_check(px, "px")


@pytest.mark.parametrize("opened", [{"block_hashes": [11, 12], "num_tokens": 40}, {"num_tokens": 40}])
@pytest.mark.parametrize("num_tokens", HUGE)
def test_an_append_past_the_pool_is_507_and_check_stays_clean(px, opened, num_tokens):
    seq = px.post("/api/pools/px/sequences", json=opened).json()
    before = prefix_state(px)
    err = assert_error(px.post(f"/api/pools/px/sequences/{seq['id']}/append", json={"num_tokens": num_tokens}),
                       507, "out_of_memory")
    assert err["details"]["needed_blocks"] == -(-(40 + num_tokens) // TPB) - 3
    assert prefix_state(px) == before
    assert px.get(f"/api/pools/px/sequences/{seq['id']}").json() == seq
    assert_ok_check(px, "px")


def test_an_open_past_the_pool_inside_a_batch_fails_alone_and_says_what_ran(px):
    before = prefix_state(px)
    ops = [{"op": "open", "tokens": list(range(32))}, {"op": "open", "num_tokens": MAX_TOKENS}]
    r = px.post("/api/pools/px/ops", json={"ops": ops})
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first["ok"] and first["cached_tokens"] == 32  # the held sequence's prefix
    assert second["ok"] is False and second["error"]["code"] == "out_of_memory"
    assert second["error"]["details"]["needed_blocks"] == MAX_TOKENS // TPB
    # the batch did what its results say, and no more: the first sequence, the second refused
    assert px.get(f"/api/pools/px/sequences/{first['id']}").json()["blocks"] == first["blocks"]
    assert px.get("/api/pools/px/sequences").json()["ids"] == [*(s["id"] for s in before["sequences"]), first["id"]]
    assert_ok_check(px, "px")
    # a batch refused whole (a count past the schema's maximum) runs nothing
    before = prefix_state(px)
    ops = [{"op": "open", "tokens": list(range(32))}, {"op": "open", "num_tokens": MAX_TOKENS + 1}]
    assert_error(px.post("/api/pools/px/ops", json={"ops": ops}), 422, "invalid_request")
    assert prefix_state(px) == before


def size_requests(pool: str, unit: str, n: int, aid: int) -> list[tuple[str, str, dict]]:
    base = f"/api/pools/{pool}"
    requests = [("POST", f"{base}/allocations", {unit: n}),
                ("POST", f"{base}/allocations/{aid}/extend", {unit: n}),
                ("PUT", f"{base}/entries/new", {unit: n}),
                ("PUT", f"{base}/entries/old", {unit: n})]
    return requests


@pytest.mark.parametrize("pool, unit", [("px", "bytes"), ("pm", "bytes"), ("pm", "tokens"),
                                        ("cm", "bytes"), ("cm", "tokens"), ("tm", "bytes")])
def test_every_sized_request_past_the_pool_is_413_or_507_and_changes_nothing(http, pool, unit):
    """Allocate, extend, put (new and existing entry), and the same as batch ops, on every
    strategy, with sizes in bytes and in tokens up to the schema's maxima."""
    assert http.post(f"/api/pools/{pool}/reset", headers=JSON).status_code == 200
    aid = http.post(f"/api/pools/{pool}/allocations", json={"bytes": 1}).json()["id"]
    assert http.put(f"/api/pools/{pool}/entries/old", json={"bytes": 1}).status_code == 201
    sizes = [*HUGE, MAX_BYTES] if unit == "bytes" else HUGE
    before = state_of(http, pool)
    for n in sizes:
        for method, path, body in size_requests(pool, unit, n, aid):
            r = http.request(method, path, json=body)
            assert r.status_code in (413, 507), (method, path, body, r.status_code, r.text)
            assert r.json()["error"]["code"] in ("too_large", "out_of_memory")
        ops = [{"op": "allocate", unit: n}, {"op": "extend", "id": aid, unit: n},
               {"op": "put", "key": "new", unit: n}, {"op": "put", "key": "old", unit: n}]
        results = http.post(f"/api/pools/{pool}/ops", json={"ops": ops}).json()["results"]
        assert [x["ok"] for x in results] == [False] * 4, results
        assert state_of(http, pool) == before, (n, unit)
    assert_ok_check(http, pool)
