"""POST /api/routing (start, stop) and GET /api/routing/{id}: routing lab runs over the bundled
trace, behind the usual guards."""

from __future__ import annotations

import socket
import time

import pytest
from apputil import assert_error

from workloads.mooncake import load_mooncake
from workloads.routing import make_policy, run_sequence


def poll(fn, timeout_s: float = 60):
    """fn() until it returns something true (then that), or its last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = fn()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def wait_for(client, run_id: str, states=("finished", "stopped", "failed"), timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        view = client.get(f"/api/routing/{run_id}").json()["routing"]
        if view["state"] in states or time.monotonic() > deadline:
            return view
        time.sleep(0.1)


def test_a_run_routes_every_policy_and_reports_the_cli_rows(client):
    body = {"policies": ["round_robin", "llmd_precise"], "replicas": 2,
            "capacity_tokens": 200_000, "limit": 300}
    r = client.post("/api/routing", json=body)
    assert r.status_code == 202, r.text
    run = r.json()["routing"]
    assert run["state"] == "running" and run["policies"] == body["policies"]
    view = wait_for(client, run["id"])
    assert view["state"] == "finished", view
    assert view["done"] == view["total"] == 600
    rows = view["results"]
    assert [row["policy"] for row in rows] == ["round_robin", "llmd_precise"]
    want = run_sequence(load_mooncake(limit=300), 2, 200_000, make_policy("round_robin", 2))
    assert rows[0]["hit_ratio"] == want["hit_ratio"] and rows[0]["imbalance"] == want["imbalance"]
    # the latest decisions of the last policy, each explained
    decisions = view["decisions"]
    assert 0 < len(decisions) <= 12 and decisions[-1]["request"] == 299
    for d in decisions:
        assert d["replica"] in (0, 1) and len(d["matches"]) == len(d["loads"]) == 2
        assert d["rule"].startswith("highest score")


def test_one_run_at_a_time_and_stop_ends_it(client):
    r = client.post("/api/routing", json={"policies": ["sglang_cache_aware", "dynamo_kv"] * 4,
                                          "limit": 12031, "mode": "serving"})
    assert r.status_code == 202, r.text
    run_id = r.json()["routing"]["id"]
    assert_error(client.post("/api/routing", json={"limit": 10}), 409, "conflict")
    r = client.post("/api/routing", json={"action": "stop", "id": run_id})
    assert r.status_code == 200, r.text
    view = wait_for(client, run_id)
    assert view["state"] == "stopped" and view["done"] < view["total"]
    r = client.post("/api/routing", json={"limit": 10, "policies": ["session"]})
    assert r.status_code == 202, r.text
    assert wait_for(client, r.json()["routing"]["id"])["state"] == "finished"


def test_unknown_runs_are_404(client):
    assert_error(client.get("/api/routing/r999"), 404, "not_found")
    assert_error(client.post("/api/routing", json={"action": "stop", "id": "r999"}), 404, "not_found")


@pytest.mark.parametrize("body,field", [
    ({"policies": ["fastest"]}, "policies"),
    ({"policies": []}, "policies"),
    ({"replicas": 0}, "replicas"),
    ({"capacity_tokens": 100}, "capacity_tokens"),
    ({"limit": "10"}, "limit"),
    ({"mode": "replay"}, "mode"),
    ({"policy": "round_robin"}, "policy"),
    ({"mode": "live", "policy": "fastest"}, "policy"),
    ({"mode": "live", "speed": 0}, "speed"),
    ({"mode": "live", "speed": "fast"}, "speed"),
    ({"mode": "live", "replicas": 17}, "replicas"),
    ({"action": "stop"}, None),
    ({"action": "stop", "id": "x/1"}, "id"),
    ({"speed": 2}, "speed"),
    ({"capacity_tokens": 1 << 31}, "capacity_tokens"),
    ({"mode": "serving", "replicas": 64, "capacity_tokens": 1 << 23}, "serving mode simulates at most"),
])
def test_bad_bodies_are_422_and_start_nothing(client, body, field):
    err = assert_error(client.post("/api/routing", json=body), 422, "invalid_request")
    if field is not None:
        assert field in str(err), err
    assert_error(client.get("/api/routing/r1"), 404, "not_found")


def test_bad_run_ids_in_the_path_are_refused(client):
    r = client.get("/api/routing/..%2Fpools")
    assert r.status_code in (404, 422), r.text


def names(client) -> tuple[list[str], list[str]]:
    pools = sorted(p["name"] for p in client.get("/api/pools").json()["pools"])
    fleets = sorted(f["name"] for f in client.get("/api/fleets").json()["fleets"])
    return pools, fleets


LIVE = {"mode": "live", "replicas": 3, "capacity_tokens": 400_000}


def test_a_live_run_feeds_real_pools_that_a_fleet_mirrors_and_stop_removes_them(client):
    r = client.post("/api/routing", json={**LIVE, "policy": "round_robin", "limit": 150,
                                          "speed": 1e5})
    assert r.status_code == 202, r.text
    run = r.json()["routing"]
    rid, fleet = run["id"], run["fleet"]
    assert run["mode"] == "live" and run["policy"] == "round_robin" and fleet == f"route-{rid}"
    assert run["pools"] == [f"route-{rid}-r{i}" for i in range(3)]
    assert names(client) == (["default", *run["pools"]], [fleet])
    view = wait_for(client, rid)
    assert view["state"] == "finished" and view["done"] == view["total"] == 150, view
    figures = view["replica_figures"]
    assert [f["requests"] for f in figures] == [50, 50, 50]
    assert sum(f["hit_tokens"] for f in figures) > 0 and view["hit_ratio"] > 0
    for d in view["decisions"]:
        assert d["policy"] == "round_robin" and d["rule"] == "next in turn"
        assert d["replica"] == d["request"] % 3 and len(d["matches"]) == 3
    # each pool is a real pool of the server, its cached blocks what the figures say
    for name, f in zip(view["pools"], figures):
        stats = client.get(f"/api/pools/{name}/stats").json()
        assert stats["prefix"]["cached_hashes"] == f["cached_blocks"] > 0, stats
    # the fleet follows the pools' publishers: one engine per replica, holding what its pool holds
    want = [f["cached_blocks"] for f in figures]

    def mirrored():
        state = client.get(f"/api/fleets/{fleet}").json()
        return state if [e["cached_blocks"] for e in state["engines"]] == want else None

    state = poll(mirrored)
    assert state, (want, client.get(f"/api/fleets/{fleet}").json()["engines"])
    assert [e["name"] for e in state["engines"]] == ["r0", "r1", "r2"]
    assert all(e["configured_block_size"] == 512 and e["block_size_error"] is None
               for e in state["engines"])
    assert 0 < state["stats"]["unique_blocks"] <= sum(want)
    ports = [int(e["endpoint"].rsplit(":", 1)[1]) for e in state["engines"]]
    assert all(e["endpoint"].startswith("tcp://127.0.0.1:") for e in state["engines"])
    r = client.post("/api/routing", json={"action": "stop", "id": rid})
    assert r.status_code == 200, r.text
    assert r.json()["routing"]["pools"] == [] and r.json()["routing"]["fleet"] is None
    assert names(client) == (["default"], [])
    assert_error(client.get(f"/api/fleets/{fleet}"), 404, "not_found")
    for port in ports:  # the publishers' sockets are closed: their ports can be bound again
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def test_the_policy_switches_live_and_delete_leaves_nothing(client):
    r = client.post("/api/routing", json={**LIVE, "policy": "round_robin", "limit": 3000,
                                          "speed": 20.0})
    assert r.status_code == 202, r.text
    rid = r.json()["routing"]["id"]
    assert poll(lambda: client.get(f"/api/routing/{rid}").json()["routing"]["decisions"])
    r = client.post(f"/api/routing/{rid}/policy", json={"policy": "longest_prefix"})
    assert r.status_code == 200, r.text
    view = r.json()["routing"]
    assert view["policy"] == "longest_prefix" and view["state"] == "running"
    at = view["switches"][-1]["at_request"]
    assert view["switches"] == [{"at_request": at, "policy": "longest_prefix"}] and at > 0

    def after():
        v = client.get(f"/api/routing/{rid}").json()["routing"]
        return v if any(d["request"] >= at for d in v["decisions"]) else None

    view = poll(after)
    assert view, "no request was routed after the switch"
    for d in view["decisions"]:
        if d["request"] >= at:
            assert d["policy"] == "longest_prefix" and d["rule"].startswith("longest cached prefix"), d
        else:
            assert d["policy"] == "round_robin" and d["rule"] == "next in turn", d
    # one run at a time, live or not
    assert_error(client.post("/api/routing", json={"limit": 10}), 409, "conflict")
    assert client.delete(f"/api/routing/{rid}").status_code == 204
    assert names(client) == (["default"], [])
    assert_error(client.get(f"/api/routing/{rid}"), 404, "not_found")


def test_switching_needs_a_running_live_run_and_a_known_policy(client):
    assert_error(client.post("/api/routing/r9/policy", json={"policy": "session"}), 404, "not_found")
    r = client.post("/api/routing", json={"limit": 10, "policies": ["session"]})
    rid = r.json()["routing"]["id"]
    assert wait_for(client, rid)["state"] == "finished"
    err = assert_error(client.post(f"/api/routing/{rid}/policy", json={"policy": "session"}),
                       409, "conflict")
    assert "not live" in err["message"]
    r = client.post("/api/routing", json={**LIVE, "limit": 20, "speed": 1e5})
    rid = r.json()["routing"]["id"]
    assert r.json()["routing"]["policy"] == "round_robin"  # the first of the default 'policies'
    err = assert_error(client.post(f"/api/routing/{rid}/policy", json={"policy": "fastest"}),
                       422, "invalid_request")
    assert "policy" in err["message"] and "longest_prefix" in err["message"], err
    assert_error(client.post(f"/api/routing/{rid}/policy", json={}), 422, "invalid_request")
    assert client.get(f"/api/routing/{rid}").json()["routing"]["switches"] == []
    assert wait_for(client, rid)["state"] == "finished"
    assert_error(client.post(f"/api/routing/{rid}/policy", json={"policy": "session"}), 409, "conflict")
    assert client.delete(f"/api/routing/{rid}").status_code == 204
    assert names(client) == (["default"], [])


@pytest.mark.parametrize("body,status", [
    ({"replicas": 8}, 409),  # the test server takes 8 pools and holds one: the 8th is refused
    ({"capacity_tokens": 1 << 30}, 413),  # past the server's pool size
])
def test_a_live_run_the_server_cannot_hold_is_refused_and_leaves_nothing(client, body, status):
    r = client.post("/api/routing", json={**LIVE, **body})
    assert 400 <= r.status_code < 500 and r.status_code == status, r.text
    assert names(client) == (["default"], [])
    r = client.post("/api/routing", json={**LIVE, "limit": 5, "speed": 1e5})
    assert r.status_code == 202, r.text
    rid = r.json()["routing"]["id"]
    assert wait_for(client, rid)["state"] == "finished"
    assert client.delete(f"/api/routing/{rid}").status_code == 204
