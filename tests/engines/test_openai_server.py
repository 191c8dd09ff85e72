"""kvscope on a real vLLM OpenAI server (one server for the module: it boots in about two
minutes on two cores): a mirror pool created through kvscope's REST API with only the engine's
endpoints and `/metrics`, the engine's own counters as kvscope shows them, and requests sent
through `/v1/completions`."""

from __future__ import annotations

import random
import time

import httpx
import pytest
from support.apputil import make_client

from app.engines.server import EngineFailed, EngineProcess, EngineSpec, free_ports, rss_bytes
from kvevents.engine_metrics import parse, summarize

pytestmark = pytest.mark.engines

NUM_BLOCKS = 128


@pytest.fixture(scope="module")
def engine(engine_env, tmp_path_factory, figures):
    # The ports are chosen before the engine binds them: a start refused, or a boot that fails,
    # on a port another process took meanwhile ("already in use") tries fresh ports.
    for attempt in range(3):
        http, ev, rp = free_ports(3)
        spec = EngineSpec("server-test", http, ev, rp, num_blocks=NUM_BLOCKS, max_model_len=1024,
                          hash_seed="7")
        try:
            proc = EngineProcess(spec, tmp_path_factory.mktemp("engine")).start()
            boot = proc.wait_ready(timeout=420)
            break
        except EngineFailed as exc:
            if attempt == 2 or "already in use" not in str(exc).lower():
                raise
    try:
        figures.append(f"OpenAI server: /health after {boot:.0f} s; RSS of its process group "
                       f"{rss_bytes(proc.pid) / 2**30:.2f} GiB")
        yield proc
    finally:
        proc.stop()


def wait_for(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def complete(engine, tokens: list[int], max_tokens: int = 4) -> dict:
    r = httpx.post(engine.spec.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": tokens, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def engine_counters(engine) -> dict:
    s = summarize(parse(httpx.get(engine.spec.metrics_url, timeout=10).text))
    return {k: s[k] for k in ("prefix_queries", "prefix_hits", "num_gpu_blocks", "block_size")}


def test_mirror_pool_takes_num_blocks_and_counters_from_the_engine(engine):
    spec = engine.spec
    rng = random.Random(3)
    system = [rng.randrange(4, 4096) for _ in range(96)]
    with make_client() as client:
        r = client.post("/api/pools", json={"name": "engine", "strategy": "mirror", "mirror": {
            "endpoint": spec.events_endpoint, "replay_endpoint": spec.replay_endpoint,
            "metrics_url": spec.metrics_url}})
        assert r.status_code == 201, r.text
        # num_blocks came from the engine's vllm:cache_config_info.
        assert r.json()["config"]["num_blocks"] == NUM_BLOCKS
        for _ in range(12):
            complete(engine, system + [rng.randrange(4, 4096) for _ in range(rng.randint(5, 60))])

        def stats():
            return client.get("/api/pools/engine/stats").json()

        wait_for(lambda: stats()["mirror"]["cached_blocks"] > 0, "the mirror to fill")
        # Traffic is over, so the engine's counters stand still: kvscope's poll must reach them.
        direct = engine_counters(engine)
        assert direct["prefix_queries"] > 0 and direct["prefix_hits"] >= 11 * 96, direct

        def shown():
            latest = (stats()["mirror"]["source"].get("engine") or {}).get("latest") or {}
            return {k: latest.get(k) for k in direct}

        wait_for(lambda: shown() == direct, f"kvscope to show {direct}", timeout=20)
        s = stats()
        assert s["mirror"]["source"]["error_count"] == 0 and s["mirror"]["source"]["lost_batches"] == 0
        assert s["mirror"]["block_size"] == 32
        assert client.get("/api/pools/engine/check").json()["ok"]
        assert client.delete("/api/pools/engine").status_code == 204
