"""REST and /ops run the same operations (app/operations.py): the same input is refused the same
way, with the same error code, and changes the core the same way."""

from __future__ import annotations

import pytest
from support.apputil import JSON, make_client, state_of

POOL = "/api/pools/default"


def rest(client, op: dict, pool: str = POOL):
    """The REST call for a batch op."""
    POOL = pool  # noqa: N806 - the same f-strings serve every pool
    kind = op["op"]
    size = {k: op[k] for k in ("bytes", "tokens") if k in op}
    seq = {k: op[k] for k in ("tokens", "block_hashes", "num_tokens", "salt", "next_use") if k in op}
    if kind == "allocate":
        return client.post(f"{POOL}/allocations", json=size)
    if kind == "extend":
        return client.post(f"{POOL}/allocations/{op['id']}/extend", json=size)
    if kind == "free":
        return client.delete(f"{POOL}/allocations/{op['id']}")
    if kind == "put":
        return client.put(f"{POOL}/entries/{op['key']}", json=size)
    if kind == "delete":
        return client.delete(f"{POOL}/entries/{op['key']}")
    if kind == "evict":
        return client.post(f"{POOL}/entries/{op['key']}/evict", headers=JSON)
    if kind == "get":
        return client.get(f"{POOL}/entries/{op['key']}")
    if kind == "defragment":
        return client.post(f"{POOL}/defragment")
    if kind == "open":
        return client.post(f"{POOL}/sequences", json=seq)
    if kind == "append":
        return client.post(f"{POOL}/sequences/{op['id']}/append", json=seq)
    if kind == "close":
        return client.delete(f"{POOL}/sequences/{op['id']}")
    raise AssertionError(kind)


def batch(client, op: dict, pool: str = POOL) -> dict:
    (result,) = client.post(f"{pool}/ops", json={"ops": [op]}).json()["results"]
    return result


@pytest.mark.parametrize("op,code", [
    ({"op": "allocate", "tokens": 4}, "invalid_request"),        # the pool has no model geometry
    ({"op": "allocate", "bytes": 1 << 40}, "too_large"),         # more than the whole pool
    ({"op": "allocate", "bytes": 256 * 4096}, "out_of_memory"),  # the whole pool, two blocks in use
    ({"op": "extend", "id": 999, "bytes": 64}, "not_found"),
    ({"op": "extend", "id": "ENTRY", "bytes": 64}, "conflict"),   # a cache entry's allocation
    ({"op": "free", "id": "ENTRY"}, "conflict"),
    ({"op": "free", "id": 999}, "not_found"),
    ({"op": "delete", "key": "absent"}, "not_found"),
    ({"op": "evict", "key": "pinned"}, "conflict"),
])
def test_rest_and_batch_refuse_the_same_input_with_the_same_code(client, op, code):
    entry = client.put(f"{POOL}/entries/e", json={"bytes": 64}).json()["entry"]["id"]
    client.put(f"{POOL}/entries/pinned", json={"bytes": 64, "pinned": True})
    op = {k: (entry if v == "ENTRY" else v) for k, v in op.items()}
    before = state_of(client)
    r = rest(client, op)
    assert r.json()["error"]["code"] == code, r.text
    assert state_of(client) == before
    result = batch(client, op)
    assert result["ok"] is False and result["error"]["code"] == code
    assert result["error"]["message"] == r.json()["error"]["message"]
    assert state_of(client) == before


def test_rest_and_batch_extend_report_the_same_allocation(client):
    a = client.post(f"{POOL}/allocations", json={"bytes": 4096}).json()["id"]
    b = batch(client, {"op": "allocate", "bytes": 4096})["id"]
    via_rest = client.post(f"{POOL}/allocations/{a}/extend", json={"bytes": 5000}).json()
    via_batch = batch(client, {"op": "extend", "id": b, "bytes": 5000})
    assert via_rest["moved"] is via_batch["moved"] is False  # paged: never moves
    assert via_rest["allocated_bytes"] == via_batch["allocated_bytes"] == 3 * 4096


def test_every_batch_op_the_schema_accepts_has_one_operation():
    from typing import get_args

    from app.operations import BATCH_OPS
    from app.schemas import Op

    union = get_args(Op)[0]
    names = {get_args(m.model_fields["op"].annotation)[0] for m in get_args(union)}
    assert names == set(BATCH_OPS)


# -- one shape per operation (docs/API.md) ----------------------------------------------------------
PREFIX = "/api/pools/px"
PREFIX_SPEC = {"name": "px", "num_blocks": 16, "block_bytes": 64, "tokens_per_block": 4, "device": "cpu",
               "prefix_caching": {"policy": "lru"}}
# Figures of time, which two runs cannot share: compared by type.
CLOCKED = {"age_s", "idle_s", "expires_in_s", "seconds", "copy_seconds"}
# Per op kind: the pool, what runs first (the same way on both servers), the op under test.
SHAPE_CASES = {
    "allocate": (POOL, [], {"op": "allocate", "bytes": 10_000}),
    "extend": (POOL, [{"op": "allocate", "bytes": 100}], {"op": "extend", "id": 1, "bytes": 9000}),
    "free": (POOL, [{"op": "allocate", "bytes": 100}], {"op": "free", "id": 1}),
    "put": (POOL, [{"op": "put", "key": "a", "bytes": 100}], {"op": "put", "key": "b", "bytes": 5000}),
    "get": (POOL, [{"op": "put", "key": "a", "bytes": 5000}], {"op": "get", "key": "a"}),
    "delete": (POOL, [{"op": "put", "key": "a", "bytes": 100}], {"op": "delete", "key": "a"}),
    "evict": (POOL, [{"op": "put", "key": "a", "bytes": 100}], {"op": "evict", "key": "a"}),
    "defragment": (POOL, [{"op": "allocate", "bytes": 100}, {"op": "allocate", "bytes": 9000},
                          {"op": "free", "id": 1}], {"op": "defragment"}),
    "open": (PREFIX, [{"op": "open", "tokens": list(range(10))}, {"op": "close", "id": 1}],
             {"op": "open", "tokens": list(range(9)) + [99, 98]}),
    "append": (PREFIX, [{"op": "open", "tokens": list(range(6))}],
               {"op": "append", "id": 1, "tokens": [6, 7, 8, 9, 10]}),
    "close": (PREFIX, [{"op": "open", "tokens": list(range(6))}], {"op": "close", "id": 1}),
}


def comparable(value):
    """`value` with the clocked figures replaced by their type."""
    if isinstance(value, dict):
        return {k: type(v).__name__ if k in CLOCKED and v is not None else comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def test_shape_cases_cover_every_batch_op():
    from app.operations import BATCH_OPS

    assert set(SHAPE_CASES) == set(BATCH_OPS)


@pytest.mark.parametrize("kind", sorted(SHAPE_CASES))
def test_rest_and_batch_answer_an_operation_with_one_shape(kind):
    """Two servers in the same state run the same op, one over REST, one in a batch: the batch
    result is `{"ok": true}` plus the REST body (a 204 has none), field for field, and both
    servers end in the same state."""
    pool, setup, op = SHAPE_CASES[kind]
    with make_client() as a, make_client() as b:
        for c in (a, b):
            assert c.post("/api/pools", json=PREFIX_SPEC).status_code == 201
            for step in setup:
                assert batch(c, step, pool)["ok"], step
        r = rest(a, op, pool)
        assert r.status_code in (200, 201, 204), r.text
        result = batch(b, op, pool)
        assert result.pop("ok") is True, result
        body = {} if r.status_code == 204 else r.json()
        assert comparable(result) == comparable(body)
        assert set(result) >= ({"id"} if kind in ("allocate", "extend", "open", "append") else set())
        assert state_of(a, pool.rsplit("/", 1)[1]) == state_of(b, pool.rsplit("/", 1)[1])


def test_a_batch_get_miss_is_the_rest_404():
    with make_client() as c:
        r = c.get(f"{POOL}/entries/absent")
        result = batch(c, {"op": "get", "key": "absent"})
        assert r.status_code == 404 and result == {"ok": False, "error": r.json()["error"]}
        assert c.get(f"{POOL}/stats").json()["cache"]["misses"] == 2
