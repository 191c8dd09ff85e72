"""POST /api/routing (start, stop) and GET /api/routing/{id}: routing lab runs over the bundled
trace, behind the usual guards."""

from __future__ import annotations

import time

import pytest
from apputil import assert_error

from workloads.mooncake import load_mooncake
from workloads.routing import make_policy, run_sequence


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
    ({"mode": "live"}, "mode"),
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
