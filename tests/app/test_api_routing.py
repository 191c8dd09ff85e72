"""POST /api/routing (start, stop) and GET /api/routing/{id}: routing lab runs over the bundled
trace, behind the usual guards."""

from __future__ import annotations

import socket
import time

import pytest
from support.apputil import assert_error

from workloads.mooncake import load_mooncake
from workloads.routing import make_policy, run_sequence
from workloads.routing.bounds import bound_key, compute_bounds


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
    # both bounds of (sequence, N=2, 200,000 tokens), on the run and on every row
    bounds = compute_bounds(load_mooncake(limit=300), bound_key("sequence", 2, 200_000))
    assert view["bounds"] == bounds
    for row in rows:
        assert {k: row[k] for k in bounds} == bounds
        assert row["hit_ratio"] <= bounds["pooled_bound_hit_ratio"]
        assert row["of_pooled_bound"] == row["hit_ratio"] / bounds["pooled_bound_hit_ratio"]
    assert bounds["pooled_bound_hit_ratio"] <= bounds["infinite_bound_hit_ratio"]
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


def replay(policy: str, limit: int, replicas: int, capacity_tokens: int) -> list[dict]:
    """A live side's per-replica figures, replayed in process on fresh pools of the same size."""
    from allocator import create_pool
    from workloads.routing.live import PoolCluster, pool_hashes
    from workloads.routing.sequence import requests

    trace = load_mooncake(limit=limit)
    cluster = PoolCluster([create_pool("paged", num_blocks=capacity_tokens // 512, block_bytes=64,
                                       tokens_per_block=512, device="cpu",
                                       prefix_caching={"policy": "lru"})
                           for _ in range(replicas)])
    policy_ = make_policy(policy, replicas)
    for req in requests(trace):
        cluster.offer(req, pool_hashes(trace, req.index))
        cluster.serve(req, policy_.route(req, cluster))
    return cluster.figures()


def best_hit_tokens(limit: int) -> int:
    """The most any routing can hit without eviction: each request's leading blocks found among
    every earlier request's blocks (a replica holds at most those)."""
    from workloads.routing.live import pool_hashes

    trace = load_mooncake(limit=limit)
    seen: set[int] = set()
    hit = 0
    for i in range(len(trace)):
        hashes = pool_hashes(trace, i)
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        hit += k * 512
        seen.update(hashes)
    return hit


def test_a_compare_run_feeds_the_same_requests_to_two_sides_each_with_its_fleet(client):
    # 4096 blocks a replica hold every block of the first 120 requests: nothing is evicted
    capacity = 4096 * 512
    body = {**LIVE, "capacity_tokens": capacity, "compare": ["round_robin", "longest_prefix"],
            "limit": 120, "speed": 1e5}
    r = client.post("/api/routing", json=body)
    assert r.status_code == 202, r.text
    run = r.json()["routing"]
    rid = run["id"]
    assert run["compare"] is True and run["policies"] == ["round_robin", "longest_prefix"]
    assert [s["label"] for s in run["sides"]] == ["a", "b"]
    fleets = [f"route-{rid}-a", f"route-{rid}-b"]
    assert [s["fleet"] for s in run["sides"]] == fleets
    pools = [f"route-{rid}-{side}-r{i}" for side in "ab" for i in range(3)]
    assert run["pools"] == pools
    assert names(client) == (sorted(["default", *pools]), fleets)
    view = wait_for(client, rid)
    assert view["state"] == "finished" and view["done"] == view["total"] == 120, view
    a, b = view["sides"]
    # both sides saw every request once, each routed by its own policy
    assert a["requests"] == b["requests"] == 120
    assert [f["requests"] for f in a["replica_figures"]] == [40, 40, 40]
    assert sum(f["requests"] for f in b["replica_figures"]) == 120
    assert {d["policy"] for d in a["decisions"]} == {"round_robin"}
    assert {d["policy"] for d in b["decisions"]} == {"longest_prefix"}
    assert [d["request"] for d in a["decisions"]] == [d["request"] for d in b["decisions"]]
    # each side's figures are those of its policy replayed on the same trace and pools
    keys = ("requests", "hit_tokens", "cached_blocks", "refused")
    for side in (a, b):
        want = replay(side["policy"], 120, 3, capacity)
        assert [{k: f[k] for k in keys} for f in side["replica_figures"]] == \
            [{k: f[k] for k in keys} for f in want]
    # nothing evicted: no side can hit more than every earlier block allows, and routing to the
    # longest cached prefix reaches that bound here, so it hits at least as much as taking turns
    best = best_hit_tokens(120)
    assert all(f["cached_blocks"] < f["num_blocks"] and f["refused"] == 0
               for side in (a, b) for f in side["replica_figures"])
    hits = [sum(f["hit_tokens"] for f in side["replica_figures"]) for side in (a, b)]
    assert 0 < hits[0] <= hits[1] == best, (hits, best)
    assert b["hit_ratio"] >= a["hit_ratio"] > 0
    # each side's fleet holds what its own pools hold
    for side in (a, b):
        want = [f["cached_blocks"] for f in side["replica_figures"]]

        def mirrored(side=side, want=want):
            state = client.get(f"/api/fleets/{side['fleet']}").json()
            return state if [e["cached_blocks"] for e in state["engines"]] == want else None

        assert poll(mirrored), (side["fleet"], want)
    assert a["replica_figures"] != b["replica_figures"]  # the two sides hold different blocks
    # a compare run's policies stay as they are
    err = assert_error(client.post(f"/api/routing/{rid}/policy", json={"policy": "session"}),
                       409, "conflict")
    r = client.post("/api/routing", json={"action": "stop", "id": rid})
    assert r.status_code == 200, r.text
    assert r.json()["routing"]["pools"] == [] and names(client) == (["default"], [])
    assert [s["fleet"] for s in r.json()["routing"]["sides"]] == [None, None]
    for fleet in fleets:
        assert_error(client.get(f"/api/fleets/{fleet}"), 404, "not_found")
    assert err["message"]


def test_deleting_a_running_compare_run_leaves_nothing(client):
    r = client.post("/api/routing", json={**LIVE, "compare": ["sglang_cache_aware", "round_robin"],
                                          "limit": 3000, "speed": 20.0})
    assert r.status_code == 202, r.text
    rid = r.json()["routing"]["id"]
    assert poll(lambda: client.get(f"/api/routing/{rid}").json()["routing"]["sides"][1]["decisions"])
    view = client.get(f"/api/routing/{rid}").json()["routing"]
    assert view["state"] == "running"
    err = assert_error(client.post(f"/api/routing/{rid}/policy", json={"policy": "session"}),
                       409, "conflict")
    assert "compares two policies" in err["message"]
    assert client.delete(f"/api/routing/{rid}").status_code == 204
    assert names(client) == (["default"], [])
    assert_error(client.get(f"/api/routing/{rid}"), 404, "not_found")


@pytest.mark.parametrize("body,words", [
    ({"compare": ["round_robin", "longest_prefix", "session"]}, "compare"),
    ({"compare": ["round_robin"]}, "compare"),
    ({"compare": ["round_robin", "fastest"]}, "compare"),
    ({"compare": ["session", "session"]}, "two different policies"),
    ({"compare": ["round_robin", "session"], "policy": "session"}, "either 'policy' or 'compare'"),
    ({"compare": ["round_robin", "session"], "mode": "sequence"}, "'compare' is for mode 'live'"),
])
def test_bad_compare_bodies_are_422_and_start_nothing(client, body, words):
    err = assert_error(client.post("/api/routing", json={**LIVE, **body}), 422, "invalid_request")
    assert words in str(err), err
    assert names(client) == (["default"], [])
    assert_error(client.get("/api/routing/r1"), 404, "not_found")


def test_a_compare_run_the_server_cannot_hold_is_refused_and_leaves_nothing(client):
    # two sides of 4 replicas are 8 pools: with the default pool, one past the test server's 8
    r = client.post("/api/routing", json={**LIVE, "replicas": 4, "compare": ["round_robin", "session"]})
    assert r.status_code == 409, r.text
    assert names(client) == (["default"], [])


# A live run owns the pools and the fleet it created, and only those: a name it would use that is
# taken refuses the run and changes nothing; its release removes only the very objects it made.

USER_FLEET = {"engines": [{"name": "mine", "endpoint": "tcp://127.0.0.1:1"}]}


def next_run_id(client) -> str:
    """The id the next run gets (ids count up): a finished sequence run's id plus one."""
    r = client.post("/api/routing", json={"policies": ["round_robin"], "limit": 1, "replicas": 1})
    assert r.status_code == 202, r.text
    rid = r.json()["routing"]["id"]
    assert wait_for(client, rid)["state"] == "finished"
    return f"r{int(rid[1:]) + 1}"


@pytest.mark.parametrize("taken", ["fleet", "pool"])
def test_a_live_run_whose_name_is_taken_is_refused_and_deletes_nothing(client, taken):
    rid = next_run_id(client)
    if taken == "fleet":
        r = client.post("/api/fleets", json={"name": f"route-{rid}", **USER_FLEET})
        want = ["default"], [f"route-{rid}"]
    else:
        r = client.post("/api/pools", json={"name": f"route-{rid}-r1", "num_blocks": 8,
                                              "block_bytes": 4096})
        want = sorted(["default", f"route-{rid}-r1"]), []
    assert r.status_code == 201, r.text
    err = assert_error(client.post("/api/routing", json={**LIVE, "replicas": 2, "limit": 200,
                                                         "speed": 50.0}), 409, "conflict")
    name = f"fleet 'route-{rid}'" if taken == "fleet" else f"pool 'route-{rid}-r1'"
    assert f"{name} exists" in err["message"], err
    assert names(client) == want  # the user's object is there, and nothing of the run
    if taken == "fleet":
        engines = client.get(f"/api/fleets/route-{rid}").json()["engines"]
        assert [e["name"] for e in engines] == ["mine"]
    else:
        assert client.get(f"/api/pools/route-{rid}-r1").json()["config"]["num_blocks"] == 8
    assert_error(client.get(f"/api/routing/{rid}"), 404, "not_found")  # no run was listed
    # the next run takes the next id, whose names are free, and its release leaves the user's
    r = client.post("/api/routing", json={**LIVE, "replicas": 2, "limit": 5, "speed": 1e5})
    assert r.status_code == 202, r.text
    again = r.json()["routing"]["id"]
    assert again != rid and wait_for(client, again)["state"] == "finished"
    assert client.delete(f"/api/routing/{again}").status_code == 204
    assert names(client) == want


def test_stopping_a_run_whose_fleet_was_replaced_keeps_the_users_fleet(client):
    r = client.post("/api/routing", json={**LIVE, "policy": "round_robin", "limit": 3000,
                                          "speed": 20.0})
    assert r.status_code == 202, r.text
    rid, fleet = r.json()["routing"]["id"], r.json()["routing"]["fleet"]
    assert client.delete(f"/api/fleets/{fleet}").status_code == 204
    view = client.get(f"/api/routing/{rid}").json()["routing"]
    assert view["state"] == "running" and view["fleet"] is None, view  # it lists what it holds
    r = client.post("/api/fleets", json={"name": fleet, **USER_FLEET})
    assert r.status_code == 201, r.text
    assert client.get(f"/api/routing/{rid}").json()["routing"]["fleet"] is None  # not the run's
    r = client.post("/api/routing", json={"action": "stop", "id": rid})
    assert r.status_code == 200, r.text
    assert r.json()["routing"]["pools"] == [] and r.json()["routing"]["fleet"] is None
    assert names(client) == (["default"], [fleet])
    engines = client.get(f"/api/fleets/{fleet}").json()["engines"]
    assert [e["name"] for e in engines] == ["mine"]
    assert client.delete(f"/api/routing/{rid}").status_code == 204
    assert names(client) == (["default"], [fleet])


def test_a_running_live_runs_replica_pool_cannot_be_deleted(client):
    r = client.post("/api/routing", json={**LIVE, "policy": "round_robin", "limit": 3000,
                                          "speed": 20.0})
    assert r.status_code == 202, r.text
    rid, pools = r.json()["routing"]["id"], r.json()["routing"]["pools"]
    err = assert_error(client.delete(f"/api/pools/{pools[0]}"), 409, "conflict")
    assert err["message"] == (f"pool {pools[0]!r} is a replica of live routing run {rid!r}; "
                              "stop the run first"), err
    assert client.get(f"/api/pools/{pools[0]}").status_code == 200
    view = client.get(f"/api/routing/{rid}").json()["routing"]
    assert view["state"] == "running" and view["pools"] == pools
    # the run goes on routing into every replica, the one refused included
    seen = view["replica_figures"][0]["requests"]
    assert poll(lambda: client.get(f"/api/routing/{rid}").json()["routing"]
                ["replica_figures"][0]["requests"] > seen)
    assert client.post("/api/routing", json={"action": "stop", "id": rid}).status_code == 200
    assert names(client) == (["default"], [])


def test_a_finished_runs_pool_deleted_by_the_user_leaves_its_listing(client):
    r = client.post("/api/routing", json={**LIVE, "limit": 20, "speed": 1e5})
    assert r.status_code == 202, r.text
    rid, pools = r.json()["routing"]["id"], r.json()["routing"]["pools"]
    assert wait_for(client, rid)["state"] == "finished"
    assert client.delete(f"/api/pools/{pools[0]}").status_code == 204  # no longer routed into
    view = client.get(f"/api/routing/{rid}").json()["routing"]
    assert view["pools"] == pools[1:], view
    # a pool of the user's by that name is the user's: the run's release leaves it
    r = client.post("/api/pools", json={"name": pools[0], "num_blocks": 8, "block_bytes": 4096})
    assert r.status_code == 201, r.text
    assert client.get(f"/api/routing/{rid}").json()["routing"]["pools"] == pools[1:]
    assert client.delete(f"/api/routing/{rid}").status_code == 204
    assert names(client) == (sorted(["default", pools[0]]), [])


def test_every_decision_of_a_run_pages_and_filters_and_adds_up_to_its_figures(client):
    body = {"policies": ["round_robin", "sglang_cache_aware"], "replicas": 3,
            "capacity_tokens": 300_000, "limit": 250}
    rid = client.post("/api/routing", json=body).json()["routing"]["id"]
    view = wait_for(client, rid)
    assert view["state"] == "finished", view
    url = f"/api/routing/{rid}/decisions"
    first = client.get(url, params={"limit": 1000}).json()
    assert first["policy"] == "round_robin" and first["total"] == 250
    assert [d["request"] for d in first["decisions"]] == list(range(250))
    assert all(d["rule"] == "round_robin" and d["replica"] == d["request"] % 3
               for d in first["decisions"])
    logs = {s["policy"]: s for s in first["logs"]}
    assert set(logs) == set(body["policies"])
    for row in view["results"]:  # each log's captured tokens are its policy's hit tokens
        assert logs[row["policy"]]["captured_tokens"] == row["hit_tokens"]
        assert logs[row["policy"]]["by_replica"] == row["replica_requests"]
    sgl = logs["sglang_cache_aware"]
    assert sum(sgl["by_rule"].values()) == 250 and set(sgl["by_rule"]) <= {"match", "low_match", "imbalance"}
    rule = max(sgl["by_rule"], key=sgl["by_rule"].get)
    page = client.get(url, params={"policy": "sglang_cache_aware", "rule": rule, "offset": 5,
                                   "limit": 7}).json()
    assert page["total"] == sgl["by_rule"][rule] and len(page["decisions"]) == min(7, page["total"] - 5)
    assert all(d["rule"] == rule for d in page["decisions"])
    one = client.get(url, params={"policy": "sglang_cache_aware", "request": 42}).json()
    assert [d["request"] for d in one["decisions"]] == [42]
    assert len(one["decisions"][0]["candidates"]) == 3
    on1 = client.get(url, params={"replica": 1, "limit": 1000}).json()
    assert on1["total"] == logs["round_robin"]["by_replica"][1]


@pytest.mark.parametrize("params, status, words", [
    ({"policy": "dynamo_kv"}, 422, "not one of run"),
    ({"rule": "nope"}, 422, "rule"),
    ({"limit": 0}, 422, "limit"),
    ({"limit": 1001}, 422, "limit"),
    ({"offset": -1}, 422, "offset"),
    ({"replica": -1}, 422, "replica"),
])
def test_bad_decision_queries_are_refused(client, params, status, words):
    rid = client.post("/api/routing", json={"policies": ["round_robin"], "limit": 20,
                                            "replicas": 2}).json()["routing"]["id"]
    wait_for(client, rid)
    r = client.get(f"/api/routing/{rid}/decisions", params=params)
    assert r.status_code == status and words in r.text, r.text
    assert client.get("/api/routing/r999/decisions").status_code == 404


def test_a_live_runs_decisions_say_what_each_request_found_on_its_pool(client):
    r = client.post("/api/routing", json={**LIVE, "policy": "longest_prefix", "limit": 120,
                                          "speed": 1e5})
    rid = r.json()["routing"]["id"]
    view = wait_for(client, rid)
    assert view["state"] == "finished", view
    got = client.get(f"/api/routing/{rid}/decisions", params={"limit": 1000}).json()
    assert got["total"] == 120
    hits = sum(f["hit_tokens"] for f in view["replica_figures"])
    assert sum(d["captured_tokens"] for d in got["decisions"]) == hits > 0
    for d in got["decisions"]:  # the longest cached prefix, taken: what was there is captured
        assert d["candidates"][d["replica"]]["matched_blocks"] == d["best_matched_blocks"]
    client.delete(f"/api/routing/{rid}")
