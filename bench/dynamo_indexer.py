"""NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`, `run_kv_indexer` in the
ai-dynamo-runtime wheel) as a subprocess on a free loopback port, for the benches and the tests
that hold kvscope's Dynamo-compatible routes to it.

It follows each registered worker's engine-side ZeroMQ publisher (vLLM's or SGLang's wire:
`[topic, seq, KvEventBatch]`), not Dynamo's event plane: a Dynamo `KvEventPublisher`'s envelopes
(four frames) are dropped by it ("Unexpected ZMQ frame count: 4"). So beside it a kvscope fleet
reads the same engines directly, or through `KvEventPublisher`s relaying them (`zmq_endpoint`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from kvevents.codec import Removed, Stored, encode_batch
from kvevents.publisher import Publisher


class DynamoIndexer:
    """`python -m dynamo.indexer --port P --threads T`; `call(method, path, json)` answers as
    an httpx.Response. Its log is kept in a temporary file (`log()`)."""

    def __init__(self, threads: int = 1, timeout_s: float = 60.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="dynamo-indexer-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", str(threads)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        self.client = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dynamo.indexer exited: {self.log()[-2000:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"dynamo.indexer did not answer on {self.url}: {self.log()[-2000:]}")
            time.sleep(0.1)

    def call(self, method: str, path: str, json=None) -> httpx.Response:
        return self.client.request(method, path, json=json)

    def log(self) -> str:
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        os.unlink(self._log.name)


# -- the side-by-side bench (part of `python -m bench fleet`) -----------------------------------------
MODEL = "bench"
SIDE_ENGINES = 8
SIDE_BS = 16
MARK = 31_000  # marker blocks' tokens (MARK + phase): the last block every engine of a phase stores


def _h(*parts) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big") >> 1


def marker(phase: int):
    return Stored([_h("mark", phase)], None, [MARK + phase] * SIDE_BS, SIDE_BS, "GPU")


def side_workload(n_events: int, seed: int, phase: int, live_cap: int = 2000):
    """Per-engine batches (32 events each) over shared prompts: stores of a prompt's missing
    tail under a held parent, evictions of the oldest chain with its held descendants past
    `live_cap`; one hash per chain on every engine (as vLLM under Dynamo, one hash seed). Ends
    with `phase`'s marker block on every engine. Returns (batches per engine, prompts, events,
    blocks stored + removed)."""
    import random

    rng = random.Random(seed)
    systems = [[rng.randrange(30000) for _ in range(SIDE_BS * rng.randrange(2, 8))] for _ in range(16)]
    prompts = [list(rng.choice(systems)) + [rng.randrange(30000) for _ in range(SIDE_BS * rng.randrange(2, 20))]
               for _ in range(300)]
    held = [dict() for _ in range(SIDE_ENGINES)]
    per: list[list] = [[] for _ in range(SIDE_ENGINES)]
    events = blocks = 0
    while events < n_events:
        e = rng.randrange(SIDE_ENGINES)
        p = rng.choice(prompts)
        chains = [tuple(p[:(i + 1) * SIDE_BS]) for i in range(len(p) // SIDE_BS)]
        first = next((i for i, c in enumerate(chains) if c not in held[e]), None)
        if first is None:
            continue
        run = chains[first:first + 16]
        run = run[:next((i for i, c in enumerate(run) if c in held[e]), len(run))]
        for c in run:
            held[e][c] = None
        parent = run[0][:-SIDE_BS]
        per[e].append(Stored([_h(c) for c in run], _h(parent) if parent else None,
                             list(run[-1][len(parent):]), SIDE_BS, "GPU"))
        events, blocks = events + 1, blocks + len(run)
        if len(held[e]) > live_cap:
            victim = next(iter(held[e]))
            gone = [c for c in held[e] if c[:len(victim)] == victim]
            for c in gone:
                del held[e][c]
            per[e].append(Removed([_h(c) for c in gone[::-1]], "GPU"))
            events, blocks = events + 1, blocks + len(gone)
    for evs in per:
        evs.append(marker(phase))
    batches = [[evs[i:i + 32] for i in range(0, len(evs), 32)] for evs in per]
    return batches, prompts, events + SIDE_ENGINES, blocks + SIDE_ENGINES


def bench_side_by_side(server_url: str, n_events: int, n_queries: int, threads: int = 4) -> dict:
    """Dynamo's standalone indexer and a kvscope server's fleet (Dynamo's routes) following
    kvscope publishers (vLLM's wire, TCP loopback), every engine registered with the same
    `/register` call on both. Ingest: from the first batch published (pre-encoded) to the
    reader's `/query` showing the phase's marker on every engine, polled every 10 ms; each
    reader alone on publishers only it follows, then both on the same publishers at once.
    Query: `/query` over HTTP (keep-alive, one client each, alternating), both answers
    compared on every prompt; GET /health is each server's HTTP floor."""
    import random

    import numpy as np

    alone, prompts, alone_events, alone_blocks = side_workload(n_events, seed=1, phase=1)
    both, _prompts, both_events, both_blocks = side_workload(n_events, seed=2, phase=2)

    def publishers(plan):
        return [Publisher("tcp://127.0.0.1:0", bind=True, replay_endpoint="tcp://127.0.0.1:0",
                          buffer_steps=len(b) + 64) for b in plan]
    shared, only_dyn, only_ours = publishers(both), publishers(alone), publishers(alone)
    dyn = DynamoIndexer(threads=threads)
    ours = httpx.Client(base_url=f"{server_url}/api/fleets/side/dynamo", timeout=30)
    admin = httpx.Client(base_url=server_url, timeout=30)

    def body(wid: int, p) -> dict:
        return {"instance_id": wid, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                "model_name": MODEL, "block_size": SIDE_BS}

    def ask_dyn(b: dict) -> dict:
        return dyn.call("POST", "/query", b).json()

    def ask_ours(b: dict) -> dict:
        return ours.post("/query", json=b).json()

    def seen(ask, phase: int) -> int:
        return len(ask({"token_ids": [MARK + phase] * SIDE_BS, "model_name": MODEL}).get("scores", {}))

    def publish_all(pubs, plan) -> float:
        payloads = [[(encode_batch(evs, time.time(), 0), len(evs)) for evs in p] for p in plan]
        t0 = time.perf_counter()
        for i in range(max(len(x) for x in payloads)):
            for pub, pl in zip(pubs, payloads):
                if i < len(pl):
                    pub.publish_encoded(*pl[i])
        return t0

    def wait_done(t0: float, readers: dict, phase: int) -> dict:
        done: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(done) < len(readers) and time.monotonic() < deadline:
            for name, ask in readers.items():
                if name not in done and seen(ask, phase) == SIDE_ENGINES:
                    done[name] = time.perf_counter() - t0
            time.sleep(0.01)
        return done

    try:
        first = shared[0]
        r = admin.post("/api/fleets", json={"name": "side", "engines": [
            {"name": "1", "server": "1", "endpoint": first.endpoint, "replay_endpoint": first.replay_endpoint,
             "model": MODEL, "block_size": SIDE_BS}]})
        assert r.status_code == 201, r.text
        for i, p in enumerate(shared):
            assert dyn.call("POST", "/register", body(i + 1, p)).status_code == 201
            if i:
                assert ours.post("/register", json=body(i + 1, p)).status_code == 201
        for i, (p, q) in enumerate(zip(only_dyn, only_ours)):  # the same ids: the same state after
            assert dyn.call("POST", "/register", body(SIDE_ENGINES + i + 1, p)).status_code == 201
            assert ours.post("/register", json=body(SIDE_ENGINES + i + 1, q)).status_code == 201
        everyone = shared + only_dyn + only_ours
        deadline = time.monotonic() + 60
        while not (seen(ask_dyn, 0) == seen(ask_ours, 0) == 2 * SIDE_ENGINES):  # every reader connected
            assert time.monotonic() < deadline, "the readers did not connect"
            for p in everyone:
                p.publish([marker(0)])
            time.sleep(0.2)
        for p in everyone:
            p.publish([Removed([_h("mark", 0)], "GPU")])
        while seen(ask_dyn, 0) or seen(ask_ours, 0):
            assert time.monotonic() < deadline, "the marker was not removed"
            time.sleep(0.05)

        out: dict = {"engines": SIDE_ENGINES, "events": both_events, "blocks": both_blocks,
                     "dynamo_threads": threads, "dynamo": {}, "kvscope": {}}

        def rates(took, events, blocks) -> dict:
            return {"s": None if took is None else round(took, 3),
                    "events_per_s": None if took is None else round(events / took),
                    "blocks_per_s": None if took is None else round(blocks / took)}
        t0 = publish_all(only_dyn, alone)
        out["dynamo"]["alone"] = rates(wait_done(t0, {"dynamo": ask_dyn}, 1).get("dynamo"),
                                       alone_events, alone_blocks)
        t0 = publish_all(only_ours, alone)
        out["kvscope"]["alone"] = rates(wait_done(t0, {"kvscope": ask_ours}, 1).get("kvscope"),
                                        alone_events, alone_blocks)
        t0 = publish_all(shared, both)
        done = wait_done(t0, {"dynamo": ask_dyn, "kvscope": ask_ours}, 2)
        for name in ("dynamo", "kvscope"):
            out[name]["together"] = rates(done.get(name), both_events, both_blocks)

        rng = random.Random(3)
        lat: dict[str, list] = {"dynamo": [], "kvscope": []}
        differ = 0
        for _ in range(n_queries):
            b = {"token_ids": rng.choice(prompts)[:16 * SIDE_BS], "model_name": MODEL}
            t = time.perf_counter()
            x = ask_dyn(b)
            lat["dynamo"].append(time.perf_counter() - t)
            t = time.perf_counter()
            y = ask_ours(b)
            lat["kvscope"].append(time.perf_counter() - t)
            differ += x != y
        for name, client in (("dynamo", dyn.client), ("kvscope", ours)):
            ms = np.array(lat[name]) * 1000
            out[name]["query_p50_ms"] = round(float(np.percentile(ms, 50)), 3)
            out[name]["query_p99_ms"] = round(float(np.percentile(ms, 99)), 3)
            xs = []
            for _ in range(n_queries):
                t = time.perf_counter()
                client.get("/health")
                xs.append(time.perf_counter() - t)
            out[name]["health_p50_ms"] = round(float(np.percentile(np.array(xs) * 1000, 50)), 3)
        out["queries"] = n_queries
        out["answers_differ"] = int(differ)
        return out
    finally:
        ours.close()
        admin.close()
        try:
            httpx.delete(f"{server_url}/api/fleets/side", timeout=30)
        except httpx.HTTPError:
            pass  # the server is stopped next anyway
        dyn.close()
        for p in shared + only_dyn + only_ours:
            p.close()
