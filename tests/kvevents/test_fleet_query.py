"""The routers' query answers over a fleet (kvevents/query.py, app/routes/fleet_query.py): a
fleet's Dynamo-shaped /dump read back by Dynamo's own RadixTree answers every prompt as the
fleet does; llm-d's pod scores as its LongestPrefixScorer computes them; LoRA hashes as
Dynamo's; and the bad input the routes refuse (4xx, never 5xx)."""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kve_dynamo import BS, TreeCache
from support.apputil import assert_error, make_client
from support.kve_source import chain_hash
from test_real_publishers import wait_for

from kvevents import query as q
from kvevents.codec import Removed, Stored
from kvevents.dynamo import tokens_hashes
from kvevents.fleet import Fleet
from kvevents.publisher import Publisher
from kvevents.tiers import tier_of, weights_of

HASH_SEED = 1_000_003


def fleet_of(seeds: list[int], steps: int, model: str | None = None) -> tuple[Fleet, list[TreeCache]]:
    """A fleet whose engines "1", "2", ... were fed the steps of reference caches (no sockets:
    the events straight into the index, as a recording's playback does)."""
    fleet = Fleet("q")
    sources = []
    for i, seed in enumerate(seeds):
        src = TreeCache(block_size=BS, seed=seed, hash_seed=HASH_SEED)
        if sources:
            src.prompts = sources[0].prompts
        sources.append(src)
        fleet.index.add(str(i + 1), block_size=BS)
    for _ in range(steps):
        for i, src in enumerate(sources):
            events = src.step()
            fleet.index.apply(fleet.index.engine(str(i + 1)).eid, events)
            prefix = src.prefix = getattr(src, "prefix", {})  # block hash -> the tokens up to its end
            for ev in events:
                if ev.kind == "stored":
                    parent = prefix.get(ev.parent, []) if ev.parent is not None else []
                    for j, h in enumerate(ev.block_hashes):
                        parent = prefix[h] = parent + list(ev.token_ids[j * BS:(j + 1) * BS])
    return fleet, sources


def prompts_of(sources) -> list[list[int]]:
    """Every chain some engine holds (each branch of the prompts' trees), and one run past it."""
    out = {tuple(src.prefix[h]) for src in sources for h in src.cached}
    return [list(p) for p in sorted(out)] + [list(p) + [7] * BS for p in sorted(out)[:20]]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=3), st.integers(1, 25))
def test_the_dump_read_back_by_dynamos_radix_tree_answers_as_the_fleet(seeds, steps):
    from dynamo._core import RadixTree

    fleet, sources = fleet_of(seeds, steps)
    try:
        dump = q.dump_json(q.dump_snapshot(fleet))
        assert list(dump) == ["default:default"] and dump["default:default"]["block_size"] == BS
        tree = RadixTree()
        for r in dump["default:default"]["events"]:
            tree.apply_event(r["worker_id"], json.dumps(r["event"]).encode())
        held = {}
        for line in tree.dump_tree_as_events():
            e = json.loads(line)
            held[e["worker_id"]] = held.get(e["worker_id"], 0) + len(e["event"]["data"]["stored"]["blocks"])
        assert held == {i + 1: len(s.cached) for i, s in enumerate(sources) if s.cached}
        names = list(fleet.index.engines)
        for prompt in prompts_of(sources):
            keys = fleet.index.keys_of(prompt, BS)
            theirs = {str(w): {str(r): n * BS} for (w, r), n in tree.find_matches(keys).scores.items()}
            ours = q.dynamo_answer(fleet.match_tokens(prompt), names, fleet.identities(), fleet.block_sizes())
            assert ours["scores"] == theirs, prompt
    finally:
        fleet.close()


def longest_prefix_scorer(keys: list[int], key_to_pods: dict[int, list[tuple[str, str]]],
                          weights: dict[str, float]) -> dict[str, float]:
    """llm-d's LongestPrefixScorer.Score (pkg/kvcache/kvblock_scorer.go), line for line."""
    def max_weights(entries):
        out: dict[str, float] = {}
        for pod, tier in entries:
            w = weights.get(tier, 1.0)
            if pod not in out or w > out[pod]:
                out[pod] = w
        return out
    if not keys:
        return {}
    cur = max_weights(key_to_pods.get(keys[0], []))
    scores, active = dict(cur), set(cur)
    for k in keys[1:]:
        if not active:
            break
        cur = max_weights(key_to_pods.get(k, []))
        for pod in list(active):
            if pod in cur:
                scores[pod] += cur[pod]
            else:
                active.discard(pod)
    return scores


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=3), st.integers(1, 25),
       st.sampled_from([None, {"gpu": 1.0, "cpu": 0.8}, {"gpu": 0.5}]), st.integers(0, 3))
def test_pod_scores_are_llm_ds_longest_prefix_scores(seeds, steps, weights, narrow):
    fleet, sources = fleet_of(seeds, steps)
    try:
        pods = {str(i + 1) for i in range(narrow) if i < len(seeds)}
        key_to_pods: dict[int, list] = {}
        for i, s in enumerate(sources):
            if pods and str(i + 1) not in pods:
                continue
            for h in s.cached:
                key_to_pods.setdefault(h, []).append((str(i + 1), "gpu"))
        for prompt in prompts_of(sources):
            keys, parent = [], HASH_SEED
            for i in range(0, len(prompt), BS):
                parent = chain_hash(parent, prompt[i:i + BS])
                keys.append(parent)
            want = longest_prefix_scorer(keys, key_to_pods, weights or q.LLMD_WEIGHTS)
            assert q.llmd_scores(fleet, prompt, None, pods, weights) == pytest.approx(want), prompt
    finally:
        fleet.close()


def offload(fleet: Fleet, sources: list[TreeCache], seed: int) -> dict[int, list[tuple[str, str]]]:
    """What offloading connectors do on every engine: copy some of its GPU blocks to the CPU or
    to storage (vLLM's media; announced with their payload, or by hash alone as vLLM's
    placeholder), evict some of those from the GPU, drop some offloaded ones again. Returns
    llm-d's key -> [(pod, tier)] of what every engine then holds (the tiers as kvscope names
    them: llm-d lower-cases vLLM's "STORAGE", kvscope calls it disk)."""
    rnd = random.Random(seed)
    key_to_pods: dict[int, list] = {}
    for i, src in enumerate(sources):
        pod = str(i + 1)
        eid = fleet.index.engine(pod).eid
        held = {"gpu": set(src.cached), "cpu": set(), "disk": set()}
        events = []
        for h in sorted(src.cached):
            medium = rnd.choice([None, None, "CPU", "CPU", "STORAGE"])
            if medium is None:
                continue
            if rnd.random() < 0.5:
                events.append(Stored([h], None, [], 0, medium))
            else:
                parent = src.parents.get(h)
                events.append(Stored([h], parent, list(src.prefix[h][-BS:]), BS, medium))
            held[tier_of(medium)].add(h)
            if rnd.random() < 0.5:
                events.append(Removed([h], "GPU"))
                held["gpu"].discard(h)
        for tier, medium in (("cpu", "CPU"), ("disk", "STORAGE")):
            gone = [h for h in sorted(held[tier]) if rnd.random() < 0.2]
            events.append(Removed(gone, medium))
            held[tier] -= set(gone)
        fleet.index.apply(eid, events)
        for tier, hashes in held.items():
            for h in hashes:
                key_to_pods.setdefault(h, []).append((pod, tier))
    return key_to_pods


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=3), st.integers(1, 25),
       st.sampled_from([None, {"gpu": 1.0, "cpu": 0.8}, {"gpu": 1.0, "cpu": 0.8, "disk": 0.5},
                        {"cpu": 2.0, "STORAGE": 0.0}, {"GPU": 0.5, "host_pinned": 0.25}]),
       st.integers(0, 1 << 30))
def test_pod_scores_over_tiers_are_llm_ds_longest_prefix_scores(seeds, steps, weights, seed):
    """Engines that offloaded: each pod's score is llm-d's LongestPrefixScorer (its line-for-line
    transcription above) over the tiers that pod holds each block in."""
    fleet, sources = fleet_of(seeds, steps)
    try:
        key_to_pods = offload(fleet, sources, seed)
        assert fleet.index.check() == []
        for i in range(len(sources)):
            tiers = fleet.index.engine_stats(str(i + 1))["tiers"]
            assert sum(tiers.values()) == sum(1 for v in key_to_pods.values() for p, _ in v if p == str(i + 1))
        w = weights_of(weights)
        for prompt in prompts_of(sources):
            keys, parent = [], HASH_SEED
            for i in range(0, len(prompt), BS):
                parent = chain_hash(parent, prompt[i:i + BS])
                keys.append(parent)
            want = longest_prefix_scorer(keys, key_to_pods, w)
            assert q.llmd_scores(fleet, prompt, None, None, weights) == pytest.approx(want), prompt
    finally:
        fleet.close()


def test_lora_names_are_mixed_into_the_hash_as_dynamo_does():
    from dynamo._core import compute_block_hash_for_seq

    tokens = list(range(40, 40 + 4 * BS)) + [1]
    for lora in (None, "", "adapter-a", "ünïcode"):
        want = [h - (1 << 64) if h >= 1 << 63 else h for h in compute_block_hash_for_seq(tokens, BS, lora_name=lora)]
        assert tokens_hashes(tokens, BS, lora) == want, lora
    assert tokens_hashes(tokens, BS, "a") != tokens_hashes(tokens, BS)


# -- the routes: bad input, and what they answer on a small live fleet ----------------------------
@pytest.fixture
def live(ipc):
    """A server with fleet "f": engine "7" (a kvscope publisher in vLLM's wire, model "m")
    holding one 3-block chain."""
    pub = Publisher(ipc("p"), replay_endpoint=ipc("pr"))
    with make_client() as client:
        r = client.post("/api/fleets", json={"name": "f", "engines": [
            {"name": "7", "endpoint": pub.endpoint, "replay_endpoint": ipc("pr"), "block_size": BS, "model": "m"}]})
        assert r.status_code == 201, r.text
        tokens = list(range(100, 100 + 3 * BS))

        def held():
            pub.publish([])
            return client.get("/api/fleets/f").json()["engines"][0]["stream"]["last_seq"] is not None
        wait_for(held, what="the engine connected")
        pub.publish([Stored([1, 2, 3], None, tokens, BS, "GPU")])
        wait_for(lambda: client.get("/api/fleets/f").json()["engines"][0]["cached_blocks"] == 3, what="stored")
        yield client, tokens
    pub.close()


def test_a_fleet_made_empty_takes_its_workers_from_register_calls(ipc):
    """What a script written for Dynamo's indexer does: start it empty, `/register` the workers,
    `/query`; `/unregister` takes one away again and the fleet is empty once more."""
    pubs = [Publisher(ipc(f"w{i}"), bind=True, topic="kv") for i in range(2)]
    tokens = list(range(300, 300 + 2 * BS))
    with make_client() as client:
        r = client.post("/api/fleets", json={"name": "dyn"})
        assert r.status_code == 201, r.text
        assert client.get("/api/fleets/dyn").json()["engines"] == []
        base = "/api/fleets/dyn/dynamo"
        assert client.get(base + "/workers").json() == []
        for i, pub in enumerate(pubs):
            body = {"instance_id": 10 + i, "endpoint": pub.endpoint, "model_name": "m", "block_size": BS}
            r = client.post(base + "/register", json=body)
            assert r.status_code == 201 and r.json() == {"status": "ok"}, r.text

        def rows():
            return {e["name"]: e for e in client.get("/api/fleets/dyn").json()["engines"]}

        def connected():
            for pub in pubs:
                pub.publish([])
            return all(e["stream"]["last_seq"] is not None for e in rows().values())
        wait_for(connected, what="both workers connected")
        pubs[0].publish([Stored([1, 2], None, tokens, BS, "GPU")])
        pubs[1].publish([Stored([5], None, tokens[:BS], BS, "GPU")])
        wait_for(lambda: [rows()[n]["cached_blocks"] for n in ("10", "11")] == [2, 1], what="stored")
        r = client.post(base + "/query", json={"token_ids": tokens, "model_name": "m"})
        assert r.json()["scores"] == {"10": {"0": 2 * BS}, "11": {"0": BS}}, r.text
        assert [w["instance_id"] for w in client.get(base + "/workers").json()] == [10, 11]
        for i in range(2):
            r = client.post(base + "/unregister", json={"instance_id": 10 + i, "model_name": "m"})
            assert r.status_code == 200, r.text
        assert client.get("/api/fleets/dyn").json()["engines"] == []
        assert client.get(base + "/workers").json() == []
    for pub in pubs:
        pub.close()


def test_the_routes_answer_in_tokens_and_refuse_bad_input(live):
    client, tokens = live
    base = "/api/fleets/f/dynamo"
    r = client.post(base + "/query", json={"token_ids": tokens + [5], "model_name": "m", "unknown_field": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {"scores": {"7": {"0": 3 * BS}}, "frequencies": [], "instances": {"7": {
        "longest_matched": 3 * BS, "gpu": 3 * BS, "dp": {"0": 3 * BS}, "cpu": 3 * BS, "disk": 3 * BS}}}
    assert client.post(base + "/query", json={"token_ids": tokens[:BS + 1], "model_name": "m"}).json()["scores"] == \
        {"7": {"0": BS}}
    assert client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": tokens}).json() == {"7": 3.0}
    assert client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": tokens, "model_name": "x"}).json() == {}
    assert client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": tokens, "pod_identifiers": ["9"]}).json() == {}
    assert client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": tokens[:BS - 1]}).json() == {}
    workers = client.get(base + "/workers").json()
    assert [(w["instance_id"], w["status"], w["model_name"]) for w in workers] == [(7, "active", "m")]
    assert client.get(base + "/workers?model_name=x").json() == []
    assert client.get(base + "/health").status_code == 200

    bad = [
        ("/query", {"token_ids": [1], "model_name": "nope"}, 404, "not_found"),
        ("/query", {"token_ids": [1], "model_name": "m", "routing_group": "other"}, 404, "not_found"),
        ("/query", {"token_ids": [-1], "model_name": "m"}, 422, "invalid_request"),
        ("/query", {"token_ids": [1 << 32], "model_name": "m"}, 422, "invalid_request"),
        ("/query", {"token_ids": ["1"], "model_name": "m"}, 422, "invalid_request"),
        ("/query", {"token_ids": [1]}, 422, "invalid_request"),
        ("/query", {"token_ids": [1], "model_name": "m", "cache_salt": "s"}, 422, "invalid_request"),
        ("/query", {"token_ids": [1], "model_name": "m", "lora_name": "a"}, 422, "invalid_request"),
        ("/query_by_hash", {"block_hashes": [1], "model_name": "m"}, 422, "invalid_request"),
        ("/query_by_hash", {"block_hashes": [1 << 64], "model_name": "m"}, 422, "invalid_request"),
        ("/query_by_hash", {"block_hashes": [1], "model_name": "m", "cache_salt": "s"}, 422, "invalid_request"),
        ("/register", {"instance_id": 7, "endpoint": "tcp://127.0.0.1:1", "model_name": "m", "block_size": 4},
         409, "conflict"),
        ("/register", {"instance_id": -1, "endpoint": "tcp://127.0.0.1:1", "model_name": "m", "block_size": 4},
         422, "invalid_request"),
        ("/register", {"instance_id": 8, "endpoint": "inproc://x", "model_name": "m", "block_size": 4},
         422, "invalid_request"),
        ("/register", {"instance_id": 8, "endpoint": "tcp://127.0.0.1:1", "model_name": "m", "block_size": 4,
                       "routing_group": "g"}, 422, "invalid_request"),
        ("/unregister", {"instance_id": 99, "model_name": "m"}, 404, "not_found"),
    ]
    for path, body, status, code in bad:
        assert_error(client.post(base + path, json=body), status, code)
    too_many = {"token_ids": [1] * (1 << 20 | 1), "model_name": "m"}
    r = client.post(base + "/query", json=too_many)
    assert r.status_code in (413, 422), r.status_code  # the body cap, or the token cap: before any work
    for path in ("/query", "/query_by_hash", "/register", "/unregister"):
        assert_error(client.post(base + path, content=b"{not json", headers={"Content-Type": "application/json"}),
                     422, "invalid_request")
        r = client.post("/api/fleets/nope/dynamo" + path, json={})
        assert r.status_code in (404, 422) and set(r.json()) == {"error"}, r.text
    assert_error(client.post("/api/fleets/nope/dynamo/query", json={"token_ids": [1], "model_name": "m"}),
                 404, "not_found")
    assert_error(client.get("/api/fleets/nope/dynamo/dump"), 404, "not_found")
    assert_error(client.post("/api/fleets/f/llm-d/pod-scores", json={"prompt": "hello"}), 422, "invalid_request")
    assert_error(client.post("/api/fleets/f/llm-d/pod-scores", json={}), 422, "invalid_request")
    assert_error(client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": [1], "weights": {"gpu": -1}}),
                 422, "invalid_request")
    assert_error(client.post("/api/fleets/f/llm-d/pod-scores", json={"tokens": [1], "extra": 1}),
                 422, "invalid_request")


def test_an_engine_that_offloaded_answers_per_tier_over_the_routes(live, ipc):
    """Engine "8" (kvscope's publisher, vLLM's wire) stores the chain engine "7" holds, copies it
    to the CPU and evicts two blocks from the GPU: its row, llm-d's pod scores (weighted, by
    default and as given), Dynamo's /query (device-only `scores`, the CPU in `instances`) and
    /metrics all say so; bad weights are 422 and say what to fix."""
    client, tokens = live
    pub = Publisher(ipc("p2"), replay_endpoint=ipc("p2r"))
    try:
        r = client.post("/api/fleets/f/engines", json={"name": "8", "endpoint": pub.endpoint,
                                                       "replay_endpoint": ipc("p2r"), "block_size": BS})
        assert r.status_code == 201, r.text

        def row(name: str) -> dict:
            return {r["name"]: r for r in client.get("/api/fleets/f").json()["engines"]}[name]

        def connected():
            pub.publish([])
            return row("8")["stream"]["last_seq"] is not None
        wait_for(connected, what="engine 8 connected")
        pub.publish([Stored([50, 51, 52], None, tokens, BS, "GPU"), Stored([50, 51, 52], None, tokens, BS, "CPU"),
                     Removed([51, 52], "GPU")])
        wait_for(lambda: row("8")["tiers"] == {"gpu": 1, "cpu": 3}, what="8 offloaded")
    finally:
        pub.close()
    assert row("7")["tiers"] == {"gpu": 3, "cpu": 0} and row("8")["cached_blocks"] == 1
    scores = "/api/fleets/f/llm-d/pod-scores"
    assert client.post(scores, json={"tokens": tokens}).json() == pytest.approx({"7": 3.0, "8": 2.6})
    assert client.post(scores, json={"tokens": tokens, "weights": {"cpu": 0.5}}).json() == \
        pytest.approx({"7": 3.0, "8": 2.0})
    assert client.post(scores, json={"tokens": tokens, "weights": {"GPU": 0.25, "host_pinned": 1}}).json() == \
        pytest.approx({"7": 0.75, "8": 3.0})
    r = client.post("/api/fleets/f/dynamo/query", json={"token_ids": tokens, "model_name": "m"}).json()
    assert r["scores"] == {"7": {"0": 3 * BS}, "8": {"0": BS}}  # the device tier, as Dynamo's flat scores
    assert r["instances"]["8"] == {"longest_matched": 3 * BS, "gpu": BS, "dp": {"0": BS}, "cpu": 3 * BS,
                                   "disk": 3 * BS}
    for weights, says in (({"tape": 1.0}, "'tape' is not a tier"), ({"cpu": 1.0, "CPU": 0.5}, "both name tier 'cpu'"),
                          ({"gpu": -1}, "weights"), ({"gpu": "1"}, "weights")):
        err = assert_error(client.post(scores, json={"tokens": tokens, "weights": weights}), 422, "invalid_request")
        assert says in json.dumps(err), err
    text = client.get("/metrics").text
    for line in ('kvscope_fleet_engine_blocks{engine="8",fleet="f",tier="cpu"} 3.0',
                 'kvscope_fleet_engine_blocks{engine="8",fleet="f",tier="gpu"} 1.0',
                 'kvscope_fleet_engine_blocks{engine="7",fleet="f",tier="cpu"} 0.0',
                 'kvscope_fleet_tier_unique_blocks{fleet="f",tier="cpu"} 3.0',
                 'kvscope_fleet_tier_unique_blocks{fleet="f",tier="gpu"} 3.0'):
        assert line in text, line


def test_a_dump_past_its_cap_is_refused_before_it_is_built(live, monkeypatch):
    client, _tokens = live
    assert client.get("/api/fleets/f/dynamo/dump").status_code == 200
    monkeypatch.setattr(q, "MAX_DUMP_BLOCKS", 2)
    t = time.perf_counter()
    err = assert_error(client.get("/api/fleets/f/dynamo/dump"), 413, "too_large")
    assert "3 blocks" in err["message"] and time.perf_counter() - t < 5


def test_the_query_routes_are_gated_by_the_token():
    body = {"token_ids": [1, 2, 3, 4], "model_name": "m"}
    with make_client(token="s3cret") as client:
        for method, path, json_body in (("POST", "/dynamo/query", body), ("POST", "/dynamo/query_by_hash", {}),
                                        ("GET", "/dynamo/workers", None), ("GET", "/dynamo/dump", None),
                                        ("POST", "/dynamo/register", {}), ("POST", "/llm-d/pod-scores", {})):
            r = client.request(method, "/api/fleets/f" + path, json=json_body)
            assert_error(r, 401, "unauthorized")
            r = client.request(method, "/api/fleets/f" + path, json=json_body,
                               headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 403, r.text
        r = client.post("/api/fleets/f/dynamo/query", json=body, headers={"Authorization": "Bearer s3cret"})
        assert_error(r, 404, "not_found")  # past the gate: no such fleet
