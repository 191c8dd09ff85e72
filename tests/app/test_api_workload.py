"""Live workloads through the API: 202 with progress, 409 while running, DELETE stops, stream progress.

The first tests run a stand-in engine that follows the `workloads/live.py` contract; the last one
runs the real engine.
"""

from __future__ import annotations

import sys
import time
import types

import pytest
from support.apputil import assert_error, assert_ok_check, state_of

from allocator.errors import InvalidRequest

WL = "/api/pools/default/workload"


class StandIn:
    """Allocates one block per step, `total` steps, 100 steps per second at speed 1. Like the
    real engine it logs its own lifecycle (running, finished, stopped) and `stop()` frees what
    it allocated."""

    def __init__(self, pool, spec):
        self.pool, self.spec = pool, spec
        self.done, self.total = 0, spec.get("limit", 20)
        self.carry = 0.0
        self.ids: list[int] = []
        self.state = "running"
        self._event()

    def _event(self) -> None:
        self.pool.events.record("workload", self.spec.get("name", "trace"), self.state,
                                self.done, self.total)

    def advance(self, dt_s: float) -> bool:
        self.carry += dt_s * 100 * self.spec.get("speed", 1.0)
        while self.carry >= 1 and self.done < self.total:
            self.ids.append(self.pool.allocate(1))
            self.done += 1
            self.carry -= 1
        if self.done < self.total:
            return True
        if self.state == "running":
            self.state = "finished"
            self._event()
        return False

    def stop(self) -> None:
        if self.state == "running":
            for aid in self.ids:
                self.pool.free(aid)
            self.state = "stopped"
            self._event()

    def progress(self) -> dict:
        return {"name": self.spec.get("name", "trace"), "kind": self.spec["kind"], "state": self.state,
                "done": self.done, "total": self.total}


@pytest.fixture
def stand_in(monkeypatch):
    def build(pool, spec):
        if spec.get("name") == "burst" and spec.get("seed") == 13:
            raise InvalidRequest("seed 13 is unlucky")
        return StandIn(pool, spec)

    module = types.ModuleType("workloads.live")
    module.build_live_workload = build
    monkeypatch.setitem(sys.modules, "workloads.live", module)


def wait_for(client, state: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wl = client.get(WL).json()["workload"]
        if wl["state"] == state:
            return wl
        time.sleep(0.02)
    raise AssertionError(f"workload never reached {state}: {wl}")


def test_start_runs_to_completion_and_streams_progress(client, stand_in):
    with client.websocket_connect("/ws/pools/default") as ws:
        ws.receive_json()
        ws.receive_bytes()
        r = client.post(WL, json={"kind": "trace", "limit": 30, "speed": 2.0})
        assert r.status_code == 202 and r.json()["workload"]["total"] == 30
        wl = wait_for(client, "finished")
        assert wl["done"] == 30
        progress = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(p["state"] == "finished" for p in progress):
            msg = ws.receive()
            if "text" in msg and '"progress"' in msg["text"]:
                import json

                progress.append(json.loads(msg["text"])["workload"])
        assert progress[-1]["state"] == "finished"
    assert client.get("/api/pools/default/stats").json()["allocation_count"] == 30
    events = client.get("/api/pools/default/events", params={"limit": 10000}).json()["events"]
    states = [e["state"] for e in events if e["type"] == "workload"]
    assert states[-1] == "finished" and states.count("finished") == 1 and states.count("running") >= 1
    assert_ok_check(client)


def test_second_start_is_409_and_delete_stops(client, stand_in):
    assert client.post(WL, json={"kind": "trace", "limit": 100_000}).status_code == 202
    before_runs = client.get(WL).json()["workload"]
    assert_error(client.post(WL, json={"kind": "scenario", "name": "chat"}), 409, "conflict")
    assert client.delete(WL).status_code == 204
    assert client.get(WL).json()["workload"]["state"] == "stopped"
    assert before_runs["state"] == "running"
    # stopping frees what the workload allocated, and logs "stopped" once
    assert client.get("/api/pools/default/stats").json()["allocation_count"] == 0
    events = client.get("/api/pools/default/events", params={"limit": 10000}).json()["events"]
    states = [e["state"] for e in events if e["type"] == "workload"]
    assert states[0] == "running" and states.count("stopped") == 1 and states[-1] == "stopped"
    # stopping again, or after the workload ended on its own, is done already: 204, nothing logged
    assert client.delete(WL).status_code == 204
    assert client.get(WL).json()["workload"]["state"] == "stopped"
    events = client.get("/api/pools/default/events", params={"limit": 10000}).json()["events"]
    assert [e["state"] for e in events if e["type"] == "workload"] == states
    assert client.post(WL, json={"kind": "trace", "limit": 1}).status_code == 202


def test_stop_after_the_workload_ended_is_204_and_without_one_ever_404(client, stand_in):
    """A stop that races the workload's end (the page's Stop button) is not an error."""
    assert_error(client.delete(WL), 404, "not_found")
    assert client.post(WL, json={"kind": "trace", "limit": 5, "speed": 50.0}).status_code == 202
    wait_for(client, "finished")
    before = state_of(client)
    assert client.delete(WL).status_code == 204
    assert client.get(WL).json()["workload"]["state"] == "finished"
    assert state_of(client) == before  # a finished workload keeps what it allocated


def test_bad_specs(client, stand_in):
    before = state_of(client)
    assert_error(client.post(WL, json={"kind": "scenario", "name": "burst", "seed": 13}), 422, "invalid_request")
    for body in ({"kind": "scenario"}, {"kind": "scenario", "name": "nope"}, {"kind": "x"},
                 {"kind": "trace", "speed": 0}, {"kind": "trace", "limit": 0}):
        assert_error(client.post(WL, json=body), 422, "invalid_request")
    assert_error(client.get(WL), 404, "not_found")
    assert state_of(client) == before


class FailsOnThirdStep(StandIn):
    """One allocation per step; the third step raises."""

    def advance(self, dt_s: float) -> bool:
        if self.done == 2:
            raise RuntimeError("step 3 failed")
        self.ids.append(self.pool.allocate(1))
        self.done += 1
        return True


def test_a_failing_workload_is_reported_failed_and_frees_what_it_held(client, monkeypatch):
    built: list[StandIn] = []

    def build(pool, spec):
        built.append((FailsOnThirdStep if spec.get("name") == "burst" else StandIn)(pool, spec))
        return built[-1]

    module = types.ModuleType("workloads.live")
    module.build_live_workload = build
    monkeypatch.setitem(sys.modules, "workloads.live", module)
    with client.websocket_connect("/ws/pools/default") as ws:
        ws.receive_json()
        ws.receive_bytes()
        assert client.post(WL, json={"kind": "scenario", "name": "burst"}).status_code == 202
        wl = wait_for(client, "failed")
        assert wl["error"] == "step 3 failed" and wl["done"] == 2
        seen = []
        while not seen or seen[-1]["state"] == "running":
            msg = ws.receive()
            if "text" in msg and '"progress"' in msg["text"]:
                import json

                seen.append(json.loads(msg["text"])["workload"])
        assert seen[-1]["state"] == "failed" and seen[-1]["error"] == "step 3 failed"
    assert built[0].state == "stopped"  # its stop() ran
    assert client.get("/api/pools/default/stats").json()["allocation_count"] == 0
    events = client.get("/api/pools/default/events", params={"limit": 10000}).json()["events"]
    states = [e["state"] for e in events if e["type"] == "workload"]
    assert states[0] == "running" and states[-1] == "failed" and "finished" not in states
    assert_ok_check(client)
    # the failure belongs to that workload: the next one reports its own state
    assert client.post(WL, json={"kind": "trace", "limit": 5}).status_code == 202
    assert "error" not in wait_for(client, "finished")


def test_deleting_the_pool_stops_its_workload(client, stand_in):
    client.post("/api/pools", json={"name": "w", "num_blocks": 64, "block_bytes": 64})
    assert client.post("/api/pools/w/workload", json={"kind": "trace", "limit": 100_000}).status_code == 202
    assert client.delete("/api/pools/w").status_code == 204
    assert_error(client.get("/api/pools/w/workload"), 404, "not_found")


@pytest.mark.parametrize("spec", [
    {"kind": "scenario", "name": "fragmentation", "seed": 0, "speed": 50.0},
    {"kind": "scenario", "name": "chat", "seed": 1, "speed": 50.0},
    {"kind": "trace", "limit": 50, "speed": 50.0},
])
def test_real_engine_runs_against_the_pool(client, spec):
    r = client.post(WL, json=spec)
    assert r.status_code == 202, r.text
    assert {"name", "state", "done", "total"} <= set(r.json()["workload"])
    time.sleep(0.5)
    client.delete(WL)
    assert_ok_check(client)
    stats = client.get("/api/pools/default/stats").json()
    assert stats["allocation_count"] == stats.get("cache", {}).get("entries", 0)  # raw ones freed


def test_a_scenario_past_the_pools_size_fails_with_the_cores_reason_and_no_traceback(client, caplog):
    assert client.post("/api/pools", json={"name": "tiny", "num_blocks": 1, "block_bytes": 16}).status_code == 201
    before = state_of(client, "tiny")
    with caplog.at_level("WARNING", logger="kvscope"):
        r = client.post("/api/pools/tiny/workload", json={"kind": "scenario", "name": "burst", "speed": 1000})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 60
        while (wl := client.get("/api/pools/tiny/workload").json()["workload"])["state"] == "running":
            assert time.monotonic() < deadline, wl
            time.sleep(0.02)
    assert wl["state"] == "failed" and "more than the pool's whole capacity of 16 bytes" in wl["error"]
    failed = [rec for rec in caplog.records if "workload on pool tiny failed" in rec.getMessage()]
    assert failed and all(rec.exc_info is None for rec in failed)  # a refusal, not a bug
    assert state_of(client, "tiny") == before
    assert_ok_check(client, "tiny")
