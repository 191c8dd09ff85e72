"""Batch ops: run in order, one result per op, per-op errors, stop_on_error, caps."""

from __future__ import annotations

import pytest
from support.apputil import assert_error, assert_ok_check, state_of

OPS = "/api/pools/default/ops"


def test_every_op_kind_in_order(client):
    ops = [
        {"op": "allocate", "bytes": 10_000},
        {"op": "extend", "id": 1, "bytes": 4096},
        {"op": "put", "key": "a", "bytes": 100},
        {"op": "get", "key": "a"},
        {"op": "get", "key": "missing"},
        {"op": "delete", "key": "a"},
        {"op": "free", "id": 1},
        {"op": "defragment"},
    ]
    r = client.post(OPS, json={"ops": ops})
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["ok"] for x in res] == [True, True, True, True, False, True, True, True]
    assert res[0]["id"] == 1 and res[0]["allocated_bytes"] == 3 * 4096 and res[0]["blocks"] == [[0, 3]]
    assert res[1]["allocated_bytes"] == 4 * 4096 and res[1]["moved"] is False
    assert res[2]["created"] is True and res[2]["evicted"] == [] and res[2]["entry"]["key"] == "a"
    assert res[3]["key"] == "a" and res[3]["id"] == res[2]["entry"]["id"] and res[3]["hits"] == 1
    assert res[4]["error"]["code"] == "not_found"  # a miss, as GET .../entries/{key} answers 404
    assert "moved_blocks" in res[7]
    stats = client.get("/api/pools/default/stats").json()
    assert stats["used_blocks"] == 0 and stats["cache"]["hits"] == 1 and stats["cache"]["misses"] == 1
    assert_ok_check(client)


def test_per_op_errors_do_not_stop_the_batch(client):
    ops = [{"op": "free", "id": 42}, {"op": "allocate", "bytes": 1 << 40}, {"op": "allocate", "bytes": 1},
           {"op": "allocate", "tokens": 1}, {"op": "allocate"}]
    res = client.post(OPS, json={"ops": ops}).json()["results"]
    assert [x["ok"] for x in res] == [False, False, True, False, False]
    assert res[0]["error"]["code"] == "not_found"
    assert res[1]["error"]["code"] == "too_large" and res[1]["error"]["details"]["capacity_bytes"] == 256 * 4096
    assert res[3]["error"]["code"] == "invalid_request"
    assert_ok_check(client)


def test_stop_on_error_stops_at_the_first_failure(client):
    ops = [{"op": "allocate", "bytes": 1}, {"op": "free", "id": 99}, {"op": "allocate", "bytes": 1}]
    res = client.post(OPS, json={"ops": ops, "stop_on_error": True}).json()["results"]
    assert [x["ok"] for x in res] == [True, False]
    assert client.get("/api/pools/default/stats").json()["allocation_count"] == 1


def test_malformed_batch_is_422_and_runs_nothing(client):
    before = state_of(client)
    for body in ({"ops": [{"op": "allocate", "bytes": 1}, {"op": "explode"}]},
                 {"ops": [{"op": "allocate", "bytes": 1}, {"op": "free"}]},
                 {"ops": "nope"}, {}, {"ops": [], "x": 1}):
        assert_error(client.post(OPS, json=body), 422, "invalid_request")
    assert state_of(client) == before


@pytest.mark.parametrize("op", ["put", "get", "delete"])
@pytest.mark.parametrize("key", ["a\u2028b", "\ufffd", "a\U000e0001", "a\x85"])
def test_batch_keys_are_validated_like_path_keys(client, op, key):
    before = state_of(client)
    body = {"ops": [{"op": "allocate", "bytes": 1}, {"op": op, "key": key, **({"bytes": 1} if op == "put" else {})}]}
    err = assert_error(client.post(OPS, json=body), 422, "invalid_request")
    assert err["details"]["field"] == f"ops.1.{op}.key"
    assert state_of(client) == before


def test_evict_op_evicts_manually_and_fails_per_op_on_pinned_or_missing(client):
    ops = [{"op": "put", "key": "a", "bytes": 10}, {"op": "put", "key": "p", "bytes": 10, "pinned": True},
           {"op": "evict", "key": "a"}, {"op": "evict", "key": "p"}, {"op": "evict", "key": "a"}]
    res = client.post(OPS, json={"ops": ops}).json()["results"]
    assert res[2] == {"ok": True}
    assert [r["ok"] for r in res] == [True, True, True, False, False]
    assert (res[3]["error"]["code"], res[4]["error"]["code"]) == ("conflict", "not_found")
    assert [e["key"] for e in client.get("/api/pools/default/entries").json()["entries"]] == ["p"]
    evicts = [e for e in client.get("/api/pools/default/events").json()["events"] if e["type"] == "evict"]
    assert [(e["key"], e["reason"]) for e in evicts] == [("a", "manual")]
    assert_ok_check(client)


def test_batch_cap_is_413_and_runs_nothing(client):
    before = state_of(client)
    ops = [{"op": "allocate", "bytes": 1}] * 1001
    assert_error(client.post(OPS, json={"ops": ops}), 413, "too_large")
    assert state_of(client) == before


def test_cache_ops_on_a_pool_without_cache_fail_per_op(client):
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    res = client.post("/api/pools/raw/ops", json={"ops": [{"op": "put", "key": "a", "bytes": 1},
                                                         {"op": "allocate", "bytes": 64}]}).json()["results"]
    assert res[0]["error"]["code"] == "conflict" and res[1]["ok"]


def test_entry_allocations_are_protected_in_batches(client):
    res = client.post(OPS, json={"ops": [{"op": "put", "key": "a", "bytes": 1}]}).json()["results"]
    aid = res[0]["entry"]["id"]
    res = client.post(OPS, json={"ops": [{"op": "free", "id": aid}, {"op": "extend", "id": aid, "bytes": 1}]}).json()
    assert [x["error"]["code"] for x in res["results"]] == ["conflict", "conflict"]
    # one guard for batches and REST alike: the same refusal, naming the entry's key
    rest = client.delete(f"/api/pools/default/allocations/{aid}").json()["error"]
    assert res["results"][0]["error"]["message"] == rest["message"] and "'a'" in rest["message"]
    assert_ok_check(client)


def test_cache_ops_without_a_cache_say_how_to_get_one_like_rest(client):
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    res = client.post("/api/pools/raw/ops", json={"ops": [{"op": "get", "key": "a"}]}).json()["results"]
    rest = client.get("/api/pools/raw/entries/a").json()["error"]
    assert res[0]["error"]["message"] == rest["message"] and "'cache'" in rest["message"]


def test_openapi_example_of_a_batch_matches_what_allocate_returns(client):
    example = client.get("/openapi.json").json()["components"]["schemas"]["BatchOut"]["examples"][0]
    shown = example["results"][0]
    got = client.post(OPS, json={"ops": [{"op": "allocate", "bytes": 65536}]}).json()["results"][0]
    # (the OpenAPI document leaves out null values: `tier` is null on a paged pool)
    assert set(shown) == {k for k, v in got.items() if v is not None}


def test_empty_batch(client):
    assert client.post(OPS, json={"ops": []}).json() == {"results": []}


# -- a refused batch, or a failed op, changes nothing: every op kind ----------------------------
PX = "/api/pools/px"
PX_SPEC = {"name": "px", "num_blocks": 8, "block_bytes": 64, "tokens_per_block": 4, "device": "cpu",
           "prefix_caching": {"policy": "lru"}, "cache": {"policy": "lru"}}


CORE_CODES = {"not_found", "conflict", "too_large", "invalid_request", "out_of_memory"}  # not "internal"


def whole_state(client) -> dict:
    """Both pools: the books and block maps, entries, sequences and prefix-cache figures."""
    prefix = client.get(f"{PX}/stats").json()["prefix"]
    return {"default": state_of(client), "px": state_of(client, "px"),
            "entries": [{k: v for k, v in e.items() if k not in ("age_s", "idle_s")}  # clocks
                        for e in client.get("/api/pools/default/entries").json()["entries"]],
            "sequences": [client.get(f"{PX}/sequences/{i}").json()
                          for i in client.get(f"{PX}/sequences").json()["ids"]],
            "prefix": {k: prefix[k] for k in ("queries", "hits", "blocks", "cached_hashes", "sequences")}}


@pytest.fixture
def setup(client):
    """Something for every op kind to act on: an allocation, an entry, a pinned entry, a
    sequence of token ids and one opened by count; returns their ids and the valid ops."""
    assert client.post("/api/pools", json=PX_SPEC).status_code == 201
    aid = client.post("/api/pools/default/allocations", json={"bytes": 4096}).json()["id"]
    client.put("/api/pools/default/entries/a", json={"bytes": 100})
    client.put("/api/pools/default/entries/p", json={"bytes": 100, "pinned": True})
    seq = client.post(f"{PX}/sequences", json={"tokens": [1, 2, 3]}).json()["id"]
    counted = client.post(f"{PX}/sequences", json={"block_hashes": [11, 12], "num_tokens": 10}).json()["id"]
    return aid, seq, counted


def kinds(aid: int, seq: int, counted: int) -> dict:
    """Per op kind: (pool, a valid op, ops of that kind that fail)."""
    huge = 1 << 40  # the schema's maximum: valid input, more than any pool here holds
    return {
        "allocate": ("default", {"op": "allocate", "bytes": 1}, [{"op": "allocate", "bytes": huge}]),
        "extend": ("default", {"op": "extend", "id": aid, "bytes": 1},
                   [{"op": "extend", "id": aid, "bytes": huge}, {"op": "extend", "id": 999, "bytes": 1}]),
        "free": ("default", {"op": "free", "id": aid}, [{"op": "free", "id": 999}]),
        "put": ("default", {"op": "put", "key": "b", "bytes": 1},
                [{"op": "put", "key": "b", "bytes": huge}, {"op": "put", "key": "a", "bytes": huge}]),
        "get": ("default", {"op": "get", "key": "a"}, []),  # a miss is an answer, not a failure
        "delete": ("default", {"op": "delete", "key": "a"}, [{"op": "delete", "key": "zz"}]),
        "evict": ("default", {"op": "evict", "key": "a"},
                  [{"op": "evict", "key": "p"}, {"op": "evict", "key": "zz"}]),
        "defragment": ("default", {"op": "defragment"}, []),
        "open": ("px", {"op": "open", "tokens": list(range(8))},  # 4 of 8 blocks are held
                 [{"op": "open", "num_tokens": huge}, {"op": "open", "num_tokens": 33},
                  {"op": "open", "tokens": list(range(36))}, {"op": "open", "num_tokens": 20},
                  {"op": "open", "block_hashes": [1], "num_tokens": 9}]),
        "append": ("px", {"op": "append", "id": seq, "tokens": [4]},
                   [{"op": "append", "id": counted, "num_tokens": huge},
                    {"op": "append", "id": counted, "num_tokens": 23},
                    {"op": "append", "id": seq, "num_tokens": 1},
                    {"op": "append", "id": 999, "tokens": [1]}]),
        "close": ("px", {"op": "close", "id": seq}, [{"op": "close", "id": 999}]),
    }


def test_the_table_names_every_op_kind():
    from app.operations import BATCH_OPS

    assert set(kinds(1, 2, 3)) == set(BATCH_OPS)


@pytest.mark.parametrize("kind", sorted(kinds(1, 2, 3)))
def test_a_refused_batch_changes_nothing_whatever_ran_before_the_bad_op(client, setup, kind):
    pool, valid, _ = kinds(*setup)[kind]
    ops = f"/api/pools/{pool}/ops"
    before = whole_state(client)
    bad_ops = ({"op": "explode"}, {**valid, "surplus": 1}, {"op": "open", "num_tokens": (1 << 40) + 1},
               {"op": "allocate", "bytes": (1 << 60) + 1})
    for bad in bad_ops:  # refused whole by validation: nothing runs, not even the valid op
        assert_error(client.post(ops, json={"ops": [valid, valid, bad]}), 422, "invalid_request")
    assert_error(client.post(ops, json={"ops": [valid] * 1001}), 413, "too_large")  # the batch cap
    assert whole_state(client) == before
    res = client.post(ops, json={"ops": [valid]}).json()["results"]  # the valid op does run
    assert res[0]["ok"], res


@pytest.mark.parametrize("kind", sorted(k for k, (_, _, failing) in kinds(1, 2, 3).items() if failing))
def test_a_failed_op_of_every_kind_changes_nothing_and_later_ops_run(client, setup, kind):
    pool, valid, failing = kinds(*setup)[kind]
    ops = f"/api/pools/{pool}/ops"
    for bad in failing:
        before = whole_state(client)
        res = client.post(ops, json={"ops": [bad], "stop_on_error": True}).json()["results"]
        assert res[0]["ok"] is False and res[0]["error"]["code"] in CORE_CODES, res
        assert whole_state(client) == before, bad
        assert_ok_check(client, pool)
    res = client.post(ops, json={"ops": [*failing, valid]}).json()["results"]
    assert [r["ok"] for r in res] == [False] * len(failing) + [True]
    assert_ok_check(client, pool)

