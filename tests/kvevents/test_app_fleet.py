"""Fleets through the REST API and /metrics (in-process app and a real uvicorn server, real
sockets, vLLM's and SGLang's own publishers), and the bad input they refuse."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from kve_metrics_http import metrics_server
from support.apputil import ROOT, HealthProbe, Server, assert_error, make_client
from support.kve_source import RefPrefixCache, chain_hash, signed
from test_app_mirror import METRICS
from test_fleet_publishers import bind_on_free_pairs, held_prefix
from test_real_publishers import DEADLINE, Engine, wait_for

from kvevents.block_map import TOP_SETS, map_blocks_per_engine
from kvevents.codec import Removed, Stored
from kvevents.fleet_view import MAX_LIMIT
from kvevents.index import MAX_FLEET_ENGINES
from kvevents.publisher import Publisher


def engine_body(eng: Engine, name: str, **kw) -> dict:
    return {"name": name, "endpoint": eng.pub._endpoint, "replay_endpoint": eng.pub._replay_endpoint,
            "topic": "kv", "block_size": 4, **kw}


def publish_until_applied(get_rows, engines: dict[str, Engine], steps: int) -> None:
    for _ in range(steps):
        for eng in engines.values():
            eng.send(eng.source.step())
    end = time.monotonic() + DEADLINE
    while True:
        rows = get_rows()
        if all(rows[n]["batches"] >= e.seq + 1 for n, e in engines.items()):
            return
        assert time.monotonic() < end, rows
        time.sleep(0.05)
        for n, e in engines.items():
            if rows[n]["stream"]["last_seq"] is None:
                e.send([])  # a joiner that missed the first batches: the gap is replayed


@pytest.fixture
def pair(ipc, vllm_kv, sglang_kv):
    a = Engine(vllm_kv, "vllm", ipc("a"), ipc("ar"))
    b = Engine(sglang_kv, "sglang", ipc("b"), ipc("br"))
    a.source = RefPrefixCache(seed=1, hash_seed=101)
    b.source = RefPrefixCache(seed=2, hash_seed=202)
    b.source.prompts = a.source.prompts
    yield {"a": a, "b": b}
    a.close()
    b.close()


def rows_of(client, fleet="f") -> dict:
    """Every engine's row, a page of MAX_LIMIT at a time."""
    rows, offset = {}, 0
    while True:
        got = client.get(f"/api/fleets/{fleet}", params={"engines_offset": offset, "engines_limit": MAX_LIMIT,
                                                         "samples": 0}).json()
        rows.update((r["name"], r) for r in got["engines"])
        offset += MAX_LIMIT
        if offset >= got["engines_page"]["matched"]:
            return rows


def test_fleet_rest_match_metrics_and_engine_changes(pair, ipc, vllm_kv):
    with metrics_server(lambda: (200, METRICS)) as url, make_client() as client:
        r = client.post("/api/fleets", json={"name": "f", "engines": [
            engine_body(pair["a"], "a", metrics_url=url), engine_body(pair["b"], "b")]})
        assert r.status_code == 201, r.text
        assert [e["name"] for e in r.json()["engines"]] == ["a", "b"]
        publish_until_applied(lambda: rows_of(client), pair, 12)
        body = client.get("/api/fleets/f").json()
        for n, eng in pair.items():
            row = {r["name"]: r for r in body["engines"]}[n]
            assert row["cached_blocks"] == len(eng.source.cached)
            assert row["keyed_by"] == "tokens" and row["block_size"] == 4 and row["errors"] == []
            assert row["stream"]["error_count"] == 0 and row["stream"]["lag_s"] is not None
        s = body["stats"]
        assert set(s) >= {"unique_blocks", "duplicated_blocks", "duplicate_copies",
                          "cross_engine_recomputes", "recompute_tokens"}
        assert s["duplicated_blocks"] > 0 and s["duplicate_copies"] >= s["duplicated_blocks"]
        wait_for(lambda: (rows_of(client)["a"]["metrics"] or {}).get("prefix_cache_queries"),
                 what="engine a's own metrics")
        m = rows_of(client)["a"]["metrics"]
        assert (m["prefix_cache_queries"], m["prefix_cache_hits"], m["kv_usage"]) == (1000.0, 400.0, 0.25)
        # matches by tokens and by one engine's own hashes
        for p in pair["a"].source.prompts:
            got = client.post("/api/fleets/f/match", json={"tokens": p}).json()["engines"]
            assert got == {n: held_prefix(e.source, p) for n, e in pair.items()}
        src = pair["b"].source
        chain, parent = [], src.hash_seed
        for i in range(0, len(src.prompts[0]), 4):
            parent = chain_hash(parent, src.prompts[0][i:i + 4])
            chain.append(signed(parent))  # SGLang's hashes are signed: either form names the block
        got = client.post("/api/fleets/f/match", json={"block_hashes": chain, "engine": "b"}).json()
        assert got["engines"]["b"] == held_prefix(src, src.prompts[0])
        # a recent stored chain, named by its last block's key
        recent = client.get("/api/fleets/f").json()["recent_chains"]
        assert recent and recent[0]["engine"] in pair and recent[0]["blocks"] >= 1
        got = client.post("/api/fleets/f/match", json={"key": recent[0]["key"]}).json()["engines"]
        assert 1 <= got[recent[0]["engine"]] <= recent[0]["blocks"]
        # Prometheus
        text = client.get("/metrics").text
        unique = client.get("/api/fleets/f").json()["stats"]["unique_blocks"]
        assert f'kvscope_fleet_unique_blocks{{fleet="f"}} {float(unique)}' in text
        for series in ("kvscope_fleet_duplicated_blocks", "kvscope_fleet_cross_engine_recomputes_total",
                       "kvscope_fleet_recompute_tokens_total", "kvscope_fleet_engine_lag_seconds"):
            assert series + '{' in text, series
        assert (f'kvscope_fleet_engine_cached_blocks{{engine="a",fleet="f",server="a"}} '
                f'{float(len(pair["a"].source.cached))}') in text
        # add and remove an engine on the live fleet
        c = Engine(vllm_kv, "vllm", ipc("c"), ipc("cr"))
        try:
            c.source = RefPrefixCache(seed=3, hash_seed=303)
            c.source.prompts = pair["a"].source.prompts
            r = client.post("/api/fleets/f/engines", json=engine_body(c, "c"))
            assert r.status_code == 201, r.text
            publish_until_applied(lambda: rows_of(client), {"c": c}, 4)
            assert rows_of(client)["c"]["cached_blocks"] == len(c.source.cached)
            assert client.delete("/api/fleets/f/engines/c").status_code == 204
            assert "c" not in rows_of(client)
            assert_error(client.delete("/api/fleets/f/engines/c"), 404, "not_found")
        finally:
            c.close()
        assert [f["name"] for f in client.get("/api/fleets").json()["fleets"]] == ["f"]
        assert client.delete("/api/fleets/f").status_code == 204
        assert client.get("/api/fleets").json()["fleets"] == []
        assert_error(client.get("/api/fleets/f"), 404, "not_found")


def test_bad_fleet_input_is_refused_and_changes_nothing(tmp_path):
    ep = f"ipc://{tmp_path}/x.sock"
    with make_client() as client:
        assert client.post("/api/fleets", json={"name": "f", "engines": [
            {"name": "a", "endpoint": ep}]}).status_code == 201
        before = client.get("/api/fleets").json()
        # a taken fleet name, an engine name given twice, an engine already in the fleet: 409
        assert_error(client.post("/api/fleets", json={"name": "f", "engines": [
            {"name": "a", "endpoint": ep}]}), 409, "conflict")
        e = assert_error(client.post("/api/fleets", json={"name": "g", "engines": [
            {"name": "a", "endpoint": ep}, {"name": "a", "endpoint": ep}]}), 409, "conflict")
        assert "twice" in e["message"]
        assert_error(client.post("/api/fleets/f/engines", json={"name": "a", "endpoint": ep}),
                     409, "conflict")
        # too many engines: refused naming the limit
        many = [{"name": f"e{i}", "endpoint": ep} for i in range(MAX_FLEET_ENGINES + 1)]
        e = assert_error(client.post("/api/fleets", json={"name": "g", "engines": many}), 422,
                         "invalid_request")
        assert "1024" in e["message"]
        # malformed bodies
        for body in ({"name": "g", "engines": {}},
                     {"name": "Bad Name", "engines": [{"name": "a", "endpoint": ep}]},
                     {"name": "g", "engines": [{"name": "a", "endpoint": "http://x"}]},
                     {"name": "g", "engines": [{"name": "a", "endpoint": "tcp://h:99999"}]},
                     {"name": "g", "engines": [{"name": "a", "endpoint": ep, "block_size": "4"}]},
                     {"name": "g", "engines": [{"name": "a", "endpoint": ep, "bogus": 1}]}):
            assert_error(client.post("/api/fleets", json=body), 422, "invalid_request")
        # matches
        for body in ({"tokens": [1, 2], "block_hashes": [1], "engine": "a"}, {"block_hashes": [1]},
                     {"key": "xyz"}, {"key": "00000000000000ab", "tokens": [1]},
                     {"tokens": ["1"]}, {"tokens": [-1]}, {}, {"tokens": [1], "bogus": 0}):
            assert_error(client.post("/api/fleets/f/match", json=body), 422, "invalid_request")
        e = assert_error(client.post("/api/fleets/f/match", json={"tokens": [1, 2, 3]}), 422,
                         "invalid_request")
        assert "block size" in e["message"]
        assert_error(client.post("/api/fleets/f/match", json={"block_hashes": [1], "engine": "zz"}),
                     404, "not_found")
        assert_error(client.post("/api/fleets/nope/match", json={"tokens": [1]}), 404, "not_found")
        assert_error(client.post("/api/fleets/f/match", json={"key": "00000000000000ab"}), 404, "not_found")
        assert_error(client.delete("/api/fleets/nope"), 404, "not_found")
        assert client.get("/api/fleets").json() == before


def test_a_fleet_fills_to_its_limit_through_dp_ranks_and_refuses_one_more(ipc):
    """An endpoint carrying 1,024 DP ranks beside another engine: the fleet takes engines up to
    its limit (1,024), refuses the last rank's batches and one more engine, and its JSON stays
    bounded (the block maps share one budget)."""
    pub = Publisher(ipc("dp"), bind=True, topic="kv", buffer_steps=MAX_FLEET_ENGINES + 100)
    try:
        with make_client() as client:
            r = client.post("/api/fleets", json={"name": "f", "engines": [
                {"name": "a", "endpoint": ipc("a")},
                {"name": "b", "endpoint": pub.endpoint, "topic": "kv", "block_size": 4}]})
            assert r.status_code == 201, r.text

            def connected():
                pub.publish([])
                return rows_of(client)["b"]["stream"]["last_seq"] is not None
            wait_for(connected, what="the endpoint to connect")
            for rank in range(MAX_FLEET_ENGINES):
                pub.publish([Stored([rank + 1], None, [rank] * 4, 4)], dp_rank=rank)
            wait_for(lambda: rows_of(client)["b"]["stream"]["refused_batches"] == 1,
                     what="the last rank to be refused")
            rows = rows_of(client)
            assert len(rows) == MAX_FLEET_ENGINES and f"b:dp{MAX_FLEET_ENGINES - 1}" not in rows
            assert rows["b:dp1022"]["cached_blocks"] == 1 and rows["b"]["cached_blocks"] == 1
            e = assert_error(client.post("/api/fleets/f/engines", json={"name": "y",
                                                                        "endpoint": ipc("y")}),
                             409, "conflict")
            assert "1024" in e["message"]
            got = client.post("/api/fleets/f/match", json={"tokens": [700] * 4}).json()["engines"]
            assert {n: v for n, v in got.items() if v} == {"b:dp700": 1}
            blocks = client.get("/api/fleets/f/blocks")
            assert blocks.status_code == 200
            maps = blocks.json()
            assert len(maps["engines"]) == MAX_FLEET_ENGINES
            assert all(len(m["colors"]) == m["blocks"] <= map_blocks_per_engine(MAX_FLEET_ENGINES)
                       for m in maps["engines"].values())
            assert all(len(p["sets"]) <= TOP_SETS for p in maps["prefixes"])
    finally:
        pub.close()


def test_serve_with_a_fleet_file_follows_a_vllm_engine(tmp_path, vllm_kv):
    port, replay, eng = bind_on_free_pairs(
        lambda p, r: (p, r, Engine(vllm_kv, "vllm", f"tcp://*:{p}", f"tcp://*:{r}")))
    eng.source = RefPrefixCache(seed=4, hash_seed=404)
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"name": "demo", "engines": [
        {"name": "v0", "endpoint": f"tcp://127.0.0.1:{port}",
         "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv", "block_size": 4}]}))
    srv = Server(args=("--fleet", str(path)))
    try:
        def rows():
            return {r["name"]: r for r in httpx.get(srv.url + "/api/fleets/demo").json()["engines"]}
        publish_until_applied(rows, {"v0": eng}, 10)
        assert rows()["v0"]["cached_blocks"] == len(eng.source.cached)
        text = httpx.get(srv.url + "/metrics").text
        assert f'kvscope_fleet_engine_cached_blocks{{engine="v0",fleet="demo",server="v0"}} ' \
               f'{float(len(eng.source.cached))}' in text
    finally:
        log = srv.stop()
        eng.close()
    assert "Traceback" not in log, log


def test_serve_refuses_a_bad_fleet_file_in_one_line(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"name": "demo", "engines": [{"name": "v0", "endpoint": "nope"}]}))
    r = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--fleet", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "engines.0.endpoint" in r.stderr and "Traceback" not in r.stderr


def cycle_batch(pairs: int) -> list:
    """Per pair, without token ids: store A; store B under A; remove A; store A under B. Blocks
    without token ids are keyed by the engine's own hashes, so this leaves A -> B -> A."""
    out = []
    for i in range(pairs):
        a, b = 10 + 2 * i, 11 + 2 * i
        out += [Stored([a], None, None, 4), Stored([b], a, None, 4), Removed([a]),
                Stored([a], b, None, 4)]
    return out


def test_parent_cycles_from_a_publisher_neither_freeze_the_server_nor_go_uncounted(ipc):
    """20,000 two-block cycles in one 80,000-event batch over a real ZeroMQ PUB socket; then
    the page's /blocks poll (every 2 s). The loop never runs the fleet's work for more than
    100 ms at a time (the server's own figures, in the loop thread's CPU time, so a busy machine
    does not inflate them), and /healthz keeps answering."""
    pairs = 20_000
    pub = Publisher(ipc("cy"), bind=True, topic="kv")
    srv = Server()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            r = c.post("/api/fleets", json={"name": "cy", "engines": [
                {"name": "cy", "endpoint": pub.endpoint, "topic": "kv"}]})
            assert r.status_code == 201, r.text

            def row():
                return c.get("/api/fleets/cy").json()["engines"][0]

            end = time.monotonic() + DEADLINE
            while row()["stream"]["last_seq"] is None:  # ZeroMQ's slow joiner: until one lands
                assert time.monotonic() < end, row()
                pub.publish([])
                time.sleep(0.1)
            events = cycle_batch(pairs)
            # /healthz while the 80,000 events apply, timed from a process of its own: in this
            # one, encoding the batch or polling the fleet would hold the GIL the timing needs
            with HealthProbe(srv.url) as probe:
                seq = pub.publish(events)
                end = time.monotonic() + DEADLINE
                while row()["stored_events"] < 3 * pairs:  # the batch is applied
                    assert time.monotonic() < end, row()
                    time.sleep(0.1)
            print(f"worst healthz while applying: {probe.worst * 1000:.0f} ms ({probe.count} probes)")
            applied = c.get("/api/fleets/cy").json()["apply"]
            assert applied["failures"] == 0 and applied["longest_slice_ms"] < 100, applied
            assert probe.count > 0 and probe.worst < 2.0, (
                f"/healthz took {probe.worst * 1000:.0f} ms while the cycles were applied")
            assert row()["stream"]["last_seq"] == seq and row()["cached_blocks"] == 2 * pairs
            stop = threading.Event()
            polls: list[float] = []

            def poll_blocks() -> None:  # the Fleet page's /blocks poll
                with httpx.Client(base_url=srv.url, timeout=60) as page:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        assert page.get("/api/fleets/cy/blocks").status_code == 200
                        polls.append(time.perf_counter() - t0)
                        stop.wait(2.0)

            poller = threading.Thread(target=poll_blocks, daemon=True)
            poller.start()
            worst = 0.0
            end = time.monotonic() + 7
            while time.monotonic() < end or len(polls) < 3:
                assert time.monotonic() < end + DEADLINE, polls
                t0 = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                worst = max(worst, time.perf_counter() - t0)
                time.sleep(0.02)
            stop.set()
            poller.join(30)
            snap = c.get("/api/fleets/cy").json()["block_map"]
            assert snap["computations"] >= 1 and snap["longest_snapshot_ms"] < 100, snap
            assert worst < 2.0, f"/healthz took {worst * 1000:.0f} ms while /blocks was polled ({polls})"
            blocks = c.get("/api/fleets/cy/blocks").json()
            assert blocks["cycles"] == pairs and blocks["parent_cycles"] == {"cy": 2 * pairs}
            assert blocks["engines"]["cy"]["blocks"] == 2 * pairs
            state = c.get("/api/fleets/cy").json()
            eng = state["engines"][0]
            assert eng["parent_cycles"] == 2 * pairs
            assert any("parent-hash cycles" in e for e in eng["errors"]), eng["errors"]
            assert state["recent_chains"][0]["blocks"] == 2  # the 2-block cycle, walked once
            # the index unchanged: concurrent clients share one kept computation
            before = state["block_map"]["computations"]
            with ThreadPoolExecutor(8) as ex:
                codes = list(ex.map(lambda _: httpx.get(srv.url + "/api/fleets/cy/blocks", timeout=60).status_code,
                                    range(8)))
            assert codes == [200] * 8
            assert c.get("/api/fleets/cy").json()["block_map"]["computations"] == before
            pub.publish([Removed([10, 11])])  # one cycle gone: counted from what is indexed now
            end = time.monotonic() + DEADLINE
            while row()["cached_blocks"] != 2 * pairs - 2:
                assert time.monotonic() < end, row()
                time.sleep(0.05)
            with ThreadPoolExecutor(8) as ex:
                answers = list(ex.map(lambda _: httpx.get(srv.url + "/api/fleets/cy/blocks", timeout=60).json(),
                                      range(8)))
            assert {a["cycles"] for a in answers} == {pairs - 1}
            assert c.get("/api/fleets/cy").json()["block_map"]["computations"] == before + 1
    finally:
        log = srv.stop()
        pub.close()
    assert "Traceback" not in log, log
