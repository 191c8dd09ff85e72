"""POST /api/routing with mode `router`: the bundled trace as real HTTP requests through the real
sglang-router (from its PyPI package) in front of simulated engines of the server, followed by a
fleet; GET /api/routing lists it; stopping or deleting it leaves no router, engine or fleet."""

from __future__ import annotations

import os
import time

import pytest
from support.apputil import assert_error

from workloads.mooncake import load_mooncake
from workloads.routing.bounds import bound_key, compute_bounds

ROUTER = {"mode": "router", "router": "sglang", "replicas": 2, "capacity_tokens": 300_000}


def children() -> set[int]:
    """This process's child processes (a router run's router is one)."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry))
    return out


def wait_for(client, run_id: str, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while True:
        view = client.get(f"/api/routing/{run_id}").json()["routing"]
        if view["state"] != "running" or time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def fleets(client) -> list[str]:
    return sorted(f["name"] for f in client.get("/api/fleets").json()["fleets"])


# Enough KV per engine for every token of the first 150 requests (2,194,203): no request can be
# preempted, so the engines' counters (which count a re-admission again) equal the log exactly.
NO_PREEMPTION = 2_500_000


def test_a_router_run_replays_through_the_real_router_into_a_fleet_and_adds_up(client):
    before = children()
    r = client.post("/api/routing", json={**ROUTER, "capacity_tokens": NO_PREEMPTION, "limit": 150,
                                          "speed": 20.0})
    assert r.status_code == 202, r.text
    run = r.json()["routing"]
    assert (run["mode"], run["router"], run["state"]) == ("router", "sglang", "running")
    fleet = f"route-{run['id']}"
    assert run["fleet"] == fleet and fleet in fleets(client)
    assert len(children() - before) == 1  # the router, as a child process of the server
    listed = client.get("/api/routing").json()["runs"]
    assert [x["id"] for x in listed] == [run["id"]]
    view = wait_for(client, run["id"])
    assert view["state"] == "finished", view
    row = view["results"][0]
    assert row["policy"] == "router:sglang" and row["routed"] == 150 and row["failed"] == 0, row
    # the hit ratio recomputed from the decisions equals the engines' own counters
    assert row["preemptions"] == 0
    assert row["hit_ratio"] == pytest.approx(row["engine_hit_ratio"], abs=1e-9), row
    bounds = compute_bounds(load_mooncake(limit=150), bound_key("serving", 2, NO_PREEMPTION))
    assert view["bounds"] == bounds and {k: row[k] for k in bounds} == bounds
    assert row["hit_ratio"] <= bounds["pooled_bound_hit_ratio"] + 1e-9
    page = client.get(f"/api/routing/{run['id']}/decisions", params={"limit": 1000}).json()
    assert page["total"] == 150 and sorted(d["request"] for d in page["decisions"]) == list(range(150))
    assert sum(d["captured_tokens"] for d in page["decisions"]) == row["hit_tokens"]
    # the fleet followed the engines' KV events while the run went
    engines = client.get(f"/api/fleets/{fleet}").json()["engines"]
    assert len(engines) == 2 and sum(e["cached_blocks"] for e in engines) > 0, engines
    assert client.delete(f"/api/routing/{run['id']}").status_code == 204
    assert fleet not in fleets(client)
    assert children() - before == set()


def test_stopping_a_router_run_stops_the_router_and_removes_its_fleet(client):
    before = children()
    run = client.post("/api/routing", json={**ROUTER, "limit": 2000, "speed": 1.0}).json()["routing"]
    assert client.post("/api/routing", json={"mode": "sequence", "limit": 10}).status_code == 409
    r = client.post("/api/routing", json={"action": "stop", "id": run["id"]})
    assert r.status_code == 200 and r.json()["routing"]["state"] == "stopped", r.text
    assert f"route-{run['id']}" not in fleets(client)
    assert children() - before == set()
    # the run stays listed, stopped, with the decisions it made
    listed = client.get("/api/routing").json()["runs"]
    assert [(x["id"], x["state"]) for x in listed] == [(run["id"], "stopped")]


@pytest.mark.parametrize("body,words", [
    ({"mode": "router"}, "needs 'router'"),
    ({"router": "sglang"}, "only for mode 'router'"),
    ({"mode": "router", "router": "nginx"}, "router"),
    ({"mode": "router", "router": "sglang", "replicas": 17}, "at most 16"),
    ({"mode": "router", "router": "sglang", "replicas": 16, "capacity_tokens": 1 << 25},
     "at most"),
    ({"mode": "router", "router": "sglang", "policy": "round_robin"}, "policy"),
    ({"mode": "router", "router": "sglang", "speed": 0}, "speed"),
])
def test_bad_router_bodies_are_422_and_start_nothing(client, body, words):
    before = children()
    err = assert_error(client.post("/api/routing", json=body), 422, "invalid_request")
    assert words in str(err), err
    assert client.get("/api/routing").json()["runs"] == []
    assert children() - before == set() and fleets(client) == []


def test_a_router_run_whose_fleet_name_is_taken_is_refused_and_starts_nothing(client):
    before = children()
    # the next run is r1: its fleet would be route-r1
    r = client.post("/api/fleets", json={"name": "route-r1", "engines": [
        {"name": "e", "endpoint": "tcp://127.0.0.1:1"}]})
    assert r.status_code in (200, 201), r.text
    assert_error(client.post("/api/routing", json={**ROUTER, "limit": 10}), 409, "conflict")
    assert client.get("/api/routing").json()["runs"] == []
    assert children() - before == set()
    assert fleets(client) == ["route-r1"]
