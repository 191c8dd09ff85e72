"""REST and /ops run the same operations (app/operations.py): the same input is refused the same
way, with the same error code, and changes the core the same way."""

from __future__ import annotations

import pytest
from apputil import JSON, state_of

POOL = "/api/pools/default"


def rest(client, op: dict):
    """The REST call for a batch op."""
    kind = op["op"]
    size = {k: op[k] for k in ("bytes", "tokens") if k in op}
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
    raise AssertionError(kind)


def batch(client, op: dict) -> dict:
    (result,) = client.post(f"{POOL}/ops", json={"ops": [op]}).json()["results"]
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
