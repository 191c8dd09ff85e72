"""A fleet's Dynamo-compatible routes answer as Dynamo's own standalone indexer does.

Three workers publish through vLLM's own ZmqEventPublisher. Dynamo's indexer (`python -m
dynamo.indexer` from the ai-dynamo-runtime wheel) follows them, registered over its HTTP API;
one kvscope fleet is registered with the very same HTTP calls at its Dynamo base URL (it reads
the engines directly), and a second follows Dynamo's own `KvEventPublisher`s relaying the same
engines onto Dynamo's event plane (wire "dynamo"). The indexer reads engine-side ZeroMQ only (it
drops the event plane's four-frame envelopes), so the relays are how Dynamo's publisher comes in.
Every prompt, cut at every block, gets the same `/query` answer from all three; `/query_by_hash`,
`/workers` and who holds what in `/dump` agree too."""

from __future__ import annotations

import time

import pytest
from kve_dynamo import BS, KvEventPublisher, Runtime, TreeCache, compute_block_hash_for_seq, queries
from support.apputil import make_client
from support.kve_source import to_engine
from test_real_publishers import DEADLINE

from bench.dynamo_indexer import DynamoIndexer
from kvevents.codec import Stored

MODEL = "m"
WORKERS = ((11, 0), (22, 0), (33, 1))  # (instance id, DP rank)
DUMMY = (1 << 62) + 7  # a block stored and removed again to learn that each reader is connected


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


class Worker:
    """A vLLM engine's publisher (vLLM's own class) and the reference cache it reports."""

    def __init__(self, mod, ipc, wid: int, rank: int, seed: int) -> None:
        self.mod, self.wid, self.rank = mod, wid, rank
        self.endpoint, self.replay = ipc(f"w{wid}"), ipc(f"w{wid}r")
        # rank 0 to the publisher (vLLM offsets a tcp port per rank and refuses ipc for others);
        # each batch names the rank, as a multi-rank vLLM's do
        self.pub = mod.ZmqEventPublisher(0, endpoint=self.endpoint, replay_endpoint=self.replay,
                                         topic="kv")
        self.source = TreeCache(block_size=BS, seed=seed, hash_seed=1_000_003)
        self.seq = -1

    def send(self, events) -> None:
        self.pub.publish(self.mod.KVEventBatch(ts=time.time(), events=to_engine(self.mod, events),
                                               data_parallel_rank=self.rank))
        self.seq += 1

    def register_body(self) -> dict:
        return {"instance_id": self.wid, "endpoint": self.endpoint, "replay_endpoint": self.replay,
                "model_name": MODEL, "block_size": BS, "dp_rank": self.rank}


def wait(cond, what: str, deadline_s: float = DEADLINE):
    end = time.monotonic() + deadline_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < end, what
        time.sleep(0.05)


def dump_holdings(dump: dict) -> dict[tuple[int, int], set[tuple[int, int | None]]]:
    """{(worker, rank): {(block_hash, parent_hash)}} of a /dump answer (chains flattened)."""
    out: dict = {}
    for part in dump.values():
        for r in part["events"]:
            stored = r["event"]["data"]["stored"]
            parent = stored["parent_hash"]
            held = out.setdefault((r["worker_id"], r["event"]["dp_rank"]), set())
            for b in stored["blocks"]:
                held.add((b["block_hash"], parent))
                parent = b["block_hash"]
    return out


@pytest.fixture
def setup(tmp_path, ipc, vllm_kv):
    runtime = Runtime(str(tmp_path / "discovery"), "zmq")
    workers = [Worker(vllm_kv, ipc, wid, rank, seed=i + 1) for i, (wid, rank) in enumerate(WORKERS)]
    for w in workers[1:]:
        w.source.prompts = workers[0].source.prompts  # shared system prompts: shared blocks
    relays = [KvEventPublisher(runtime.drt.endpoint("ns.backend.generate"), worker_id=w.wid,
                               kv_block_size=BS, dp_rank=w.rank, zmq_endpoint=w.endpoint, zmq_topic="kv")
              for w in workers]
    indexer = DynamoIndexer(threads=2)
    client = make_client().__enter__()
    try:
        yield runtime, workers, indexer, client
    finally:
        client.__exit__(None, None, None)
        log = indexer.log()
        indexer.close()
        for r in relays:
            r.shutdown()
        for w in workers:
            w.pub.shutdown()
        runtime.close()
        assert "panicked" not in log, log[-3000:]


def test_the_fleet_answers_as_dynamos_standalone_indexer(setup):
    runtime, workers, indexer, client = setup
    base = "/api/fleets/direct/dynamo"

    def kvscope(method: str, path: str, json=None):
        return client.request(method, base + path, json=json)

    # The same registration calls, one at Dynamo's indexer, one at the fleet's Dynamo base URL.
    wait(lambda: len(runtime.zmq_endpoints()) == len(workers), "the relays in Dynamo's discovery")
    relay_eps = sorted(runtime.zmq_endpoints().values())
    r = client.post("/api/fleets", json={"name": "relay", "engines": [
        {"name": f"r{i}", "endpoint": ep, "wire": "dynamo", "block_size": BS} for i, ep in enumerate(relay_eps)]})
    assert r.status_code == 201, r.text
    r = client.post("/api/fleets", json={"name": "direct", "engines": [
        {"name": "seed", "endpoint": workers[0].endpoint, "block_size": BS, "model": "other"}]})
    assert r.status_code == 201, r.text  # an engine of another model: never in MODEL's answers
    for call in (indexer.call, kvscope):
        for w in workers:
            r = call("POST", "/register", w.register_body())
            assert r.status_code == 201 and r.json() == {"status": "ok"}, r.text
        again = call("POST", "/register", workers[0].register_body())
        assert again.status_code == 409, again.text

    def relay_rows():
        return {row["name"]: row for row in client.get("/api/fleets/relay").json()["engines"]}

    def direct_rows():
        return {row["name"]: row for row in client.get("/api/fleets/direct").json()["engines"]}

    # Until every reader has seen a batch (ZeroMQ's slow joiner), a block stored and removed.
    def connected() -> bool:
        for w in workers:
            w.send(to_store_remove())
        statuses = [x["status"] for x in indexer.call("GET", "/workers").json()]
        return (statuses == ["active"] * len(workers)
                and all(r["stream"]["worker_id"] is not None for r in relay_rows().values())
                and all(r["stream"]["last_seq"] is not None for n, r in direct_rows().items() if n != "seed"))
    wait(connected, "every reader connected")

    for _ in range(30):
        for w in workers:
            w.send(w.source.step())

    def held_by(rows) -> dict:
        return {(r["stream"].get("worker_id") or int(r["server"]), r["dp_rank"]): r["cached_blocks"]
                for n, r in rows.items() if n != "seed"}

    want = {(w.wid, w.rank): len(w.source.cached) for w in workers}
    wait(lambda: {k: len(v) for k, v in dump_holdings(indexer.call("GET", "/dump").json()).items()} == want,
         "Dynamo's indexer holds what the workers hold")
    wait(lambda: held_by(direct_rows()) == want, "the direct fleet holds what the workers hold")
    wait(lambda: held_by(relay_rows()) == want, "the relayed fleet holds what the workers hold")
    time.sleep(0.3)  # nothing left in flight: the sets above are final

    compared = nonzero = 0
    for tokens in queries(workers):
        body = {"token_ids": tokens, "model_name": MODEL}
        theirs = indexer.call("POST", "/query", body).json()
        assert kvscope("POST", "/query", body).json() == theirs, tokens
        assert client.post("/api/fleets/relay/dynamo/query", json=body).json() == theirs, tokens
        hashes = [signed(h) for h in compute_block_hash_for_seq(tokens, BS)]
        by_hash = {"block_hashes": hashes, "model_name": MODEL}
        theirs_h = indexer.call("POST", "/query_by_hash", by_hash).json()
        assert client.post("/api/fleets/relay/dynamo/query_by_hash", json=by_hash).json() == theirs_h
        assert theirs_h == theirs
        compared += 1
        nonzero += bool(theirs["scores"])
    assert compared > 40 and nonzero > 30, (compared, nonzero)
    assert any(len(a["scores"]) == len(workers) for a in [indexer.call("POST", "/query", {
        "token_ids": workers[0].source.prompts[0], "model_name": MODEL}).json()])  # shared blocks

    # Who holds which block under which parent, as both dump it.
    theirs_dump = dump_holdings(indexer.call("GET", "/dump").json())
    ours = kvscope("GET", "/dump").json()
    assert set(ours) == {f"{MODEL}:default", "other:default"}
    assert ours[f"{MODEL}:default"]["block_size"] == BS
    assert dump_holdings({k: v for k, v in ours.items() if k.startswith(MODEL)}) == theirs_dump
    assert dump_holdings(client.get("/api/fleets/relay/dynamo/dump").json()) == theirs_dump

    # /workers: the same instances, ranks, endpoints and states.
    def norm(ws):
        return sorted((w["instance_id"], w["status"], w["model_name"], w["routing_group"], w["block_size"],
                       sorted(w["endpoints"].items()), sorted((k, v["status"]) for k, v in w["listeners"].items()))
                      for w in ws)
    theirs_w = indexer.call("GET", f"/workers?model_name={MODEL}").json()
    assert norm(kvscope("GET", f"/workers?model_name={MODEL}").json()) == norm(theirs_w)
    assert {w["instance_id"] for w in kvscope("GET", "/workers").json()} == {11, 22, 33, "seed"}

    # Unknown partitions are 404 on both; unregistering takes an instance away on both.
    for call in (indexer.call, kvscope):
        assert call("POST", "/query", {"token_ids": [1] * BS, "model_name": "nope"}).status_code in (404, 200)
        assert call("POST", "/query", {"token_ids": [1] * BS, "model_name": MODEL,
                                       "routing_group": "g"}).status_code == 404
        assert call("POST", "/unregister", {"instance_id": 22, "model_name": MODEL}).status_code == 200
        assert call("POST", "/unregister", {"instance_id": 22, "model_name": MODEL}).status_code == 404
    prompt = {"token_ids": workers[0].source.prompts[0], "model_name": MODEL}
    theirs = indexer.call("POST", "/query", prompt).json()
    assert "22" not in theirs["scores"] and kvscope("POST", "/query", prompt).json() == theirs


def to_store_remove() -> list:
    from kvevents.codec import Removed, Stored

    return [Stored([DUMMY], None, [999_999] * BS, BS, "GPU"), Removed([DUMMY], "GPU")]


def offloading_step(w: Worker, rnd) -> list:
    """One step of a worker whose offloading connector copies about half of what the GPU stores
    to the CPU (vLLM's self-describing events: hashes, parent, tokens), keeping the CPU's copies
    prefix-closed and never evicting them: evicted from the GPU, a prefix goes on in the CPU."""
    events = w.source.step()
    cpu = w.cpu
    out = list(events)
    for ev in events:
        if ev.kind != "stored":
            continue
        prefix = w.prefix.get(ev.parent, []) if ev.parent is not None else []
        for i, h in enumerate(ev.block_hashes):  # the prompt up to each block's end
            prefix = w.prefix[h] = prefix + list(ev.token_ids[i * BS:(i + 1) * BS])
        if rnd.random() < 0.5:
            continue
        parent, hashes, tokens = ev.parent, [], []
        for i, h in enumerate(ev.block_hashes):
            if (parent is not None and parent not in cpu) or h in cpu:
                break
            hashes.append(h)
            tokens += ev.token_ids[i * BS:(i + 1) * BS]
            cpu.add(h)
            parent = h
        if hashes:
            out.append(Stored(hashes, ev.parent, tokens, BS, "CPU"))
    return out


def test_tiers_answer_as_dynamos_standalone_indexer(setup):
    """The same three vLLM publishers, offloading to the CPU: Dynamo's indexer (its lower-tier
    indexers), the fleet registered the same way and the fleet fed through Dynamo's relays
    (`storage_tier` host_pinned on the event plane) give the same `/query` answer for every
    prompt: device-only `scores`, the CPU's blocks in `instances`."""
    import random

    runtime, workers, indexer, client = setup
    rnd = random.Random(7)
    wait(lambda: len(runtime.zmq_endpoints()) == len(workers), "the relays in Dynamo's discovery")
    r = client.post("/api/fleets", json={"name": "relay", "engines": [
        {"name": f"r{i}", "endpoint": ep, "wire": "dynamo", "block_size": BS}
        for i, ep in enumerate(sorted(runtime.zmq_endpoints().values()))]})
    assert r.status_code == 201, r.text
    r = client.post("/api/fleets", json={"name": "direct", "engines": [
        {"name": "seed", "endpoint": workers[0].endpoint, "block_size": BS, "model": "other"}]})
    assert r.status_code == 201, r.text  # a fleet starts with an engine: one of another model
    for w in workers:
        w.cpu, w.prefix = set(), {}
        for call in (indexer.call, lambda m, p, b: client.request(m, "/api/fleets/direct/dynamo" + p, json=b)):
            assert call("POST", "/register", w.register_body()).status_code == 201

    def rows(fleet: str) -> list[dict]:
        return [r for r in client.get(f"/api/fleets/{fleet}").json()["engines"] if r["name"] != "seed"]

    def connected() -> bool:
        for w in workers:
            w.send(to_store_remove())
        return ([x["status"] for x in indexer.call("GET", "/workers").json()] == ["active"] * len(workers)
                and all(r["stream"]["worker_id"] is not None for r in rows("relay"))
                and all(r["stream"]["last_seq"] is not None for r in rows("direct")))
    wait(connected, "every reader connected")
    for _ in range(30):
        for w in workers:
            w.send(offloading_step(w, rnd))
    want = sorted((len(w.source.cached), len(w.cpu)) for w in workers)
    assert all(c for _, c in want), want
    for fleet in ("direct", "relay"):
        wait(lambda fleet=fleet: sorted((r["tiers"]["gpu"], r["tiers"].get("cpu", 0)) for r in rows(fleet)) == want,
             f"the {fleet} fleet holds what the workers hold, per tier")
    relayed = {r["name"]: r["stream"]["tier_blocks"] for r in rows("relay")}
    assert all(t.get("host_pinned") for t in relayed.values()), relayed  # Dynamo's relay named the tier
    time.sleep(0.5)  # Dynamo's indexer applies on its own threads: let the last batches land

    compared = lower = 0
    offloaded = sorted({tuple(w.prefix[h]) for w in workers for h in w.cpu})  # each CPU chain, evicted or not
    for tokens in queries(workers) + [list(p) for p in offloaded] + [list(p) + [3] * BS for p in offloaded]:
        body = {"token_ids": tokens, "model_name": MODEL}
        theirs = indexer.call("POST", "/query", body).json()
        assert client.post("/api/fleets/direct/dynamo/query", json=body).json() == theirs, tokens
        assert client.post("/api/fleets/relay/dynamo/query", json=body).json() == theirs, tokens
        compared += 1
        lower += any(i["cpu"] > i["gpu"] for i in theirs["instances"].values())
    assert compared > 40 and lower > 10, (compared, lower)
