"""`strategy: mirror` and `publish` through the REST API (in-process app, real sockets)."""

from __future__ import annotations

import time

import pytest
from kve_metrics_http import metrics_server
from support.apputil import assert_error, make_client
from support.kve_source import RefPrefixCache, to_engine
from test_real_publishers import wait_for

from allocator.prefix.mirror import MirrorPool
from kvevents.follow import follow
from kvevents.publisher import Publisher

METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="None",num_gpu_blocks="96"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 400.0
"""


@pytest.fixture
def metrics_url():
    with metrics_server(lambda: (200, METRICS)) as url:
        yield url


def stats(client, name="engine"):
    return client.get(f"/api/pools/{name}/stats").json()


def test_mirror_pool_follows_vllm(ipc, vllm_kv, metrics_url):
    pub = vllm_kv.ZmqEventPublisher(0, endpoint=ipc("pub"), replay_endpoint=ipc("replay"), topic="t")
    src = RefPrefixCache(seed=7)
    with make_client() as client:
        r = client.post("/api/pools", json={"name": "engine", "strategy": "mirror", "mirror": {
            "endpoint": ipc("pub"), "replay_endpoint": ipc("replay"), "topic": "t",
            "metrics_url": metrics_url}})
        assert r.status_code == 201, r.text
        assert r.json()["config"]["num_blocks"] == 96  # from vllm:cache_config_info
        assert r.json()["config"]["logical_slots"] is True
        try:
            for _ in range(30):
                pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=to_engine(vllm_kv, src.step())))
                time.sleep(0.01)
            # Slow joiner: the next batch shows the gap and replay fills it.
            wait_for(lambda: (stats(client)["mirror"]["source"]["last_seq"] or 0) >= 29 or
                     pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=[])) or False,
                     what="the mirror to catch up")
            # the last batch seen is applied on the server's loop just after: wait for it there
            wait_for(lambda: stats(client)["mirror"]["cached_blocks"] == len(src.cached),
                     what="the last batch to be applied")
            s = stats(client)
            m = s["mirror"]
            assert m["cached_blocks"] == len(src.cached) == s["used_blocks"]
            assert m["source"]["lost_batches"] == 0 and m["source"]["error_count"] == 0
            assert m["block_size"] == 4
            wait_for(lambda: (stats(client)["mirror"]["source"].get("engine") or {}).get("latest"),
                     what="the engine's metrics")
            eng = stats(client)["mirror"]["source"]["engine"]["latest"]
            assert eng["kv_usage"] == 0.25 and eng["num_gpu_blocks"] == 96
            assert client.get("/api/pools/engine/check").json()["ok"]
            kinds = {e["type"] for e in client.get("/api/pools/engine/events").json()["events"]}
            assert {"stored", "removed"} <= kinds
            f = client.get("/api/pools/engine/forest").json()
            assert f["cached_blocks"] == len(src.cached) and f["top_prefixes"]
            # Read-only: the allocator's verbs are refused and change nothing.
            for r in (client.post("/api/pools/engine/allocations", json={"bytes": 10}),
                      client.post("/api/pools/engine/defragment", headers={"Content-Type": "application/json"})):
                assert_error(r, 422, "invalid_request")
            assert stats(client)["used_blocks"] == len(src.cached)
            assert client.delete("/api/pools/engine").status_code == 204
        finally:
            pub.shutdown()


@pytest.mark.parametrize("body,where", [
    ({"strategy": "mirror", "num_blocks": 8}, "mirror"),
    ({"strategy": "mirror", "mirror": {"endpoint": "tcp://127.0.0.1:1"}}, "num_blocks"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "http://x"}}, "endpoint"),
    ({"strategy": "mirror", "num_blocks": 8, "cache": {}, "mirror": {"endpoint": "tcp://h:1"}}, "cache"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "tcp://h:99999"}}, "65535"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "tcp://h:1",
                                                        "replay_endpoint": "tcp://h:0"}}, "65535"),
    ({"strategy": "paged", "num_blocks": 8, "block_bytes": 8, "mirror": {"endpoint": "tcp://h:1"}}, "mirror"),
    ({"strategy": "paged", "num_blocks": 8, "block_bytes": 8, "publish": {"endpoint": "tcp://*:1"}}, "publish"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "tcp://h:1"},
      "publish": {"endpoint": "ipc:///tmp/x.sock"}}, "publish"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "tcp://h:1", "extra": 1}}, "extra"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "inproc://engine"}},
     "inproc:// reaches only sockets inside this server's process"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "tcp://h:1", "replay_endpoint": "inproc://r"}},
     "give the engine's tcp:// or ipc:// endpoint"),
    ({"strategy": "mirror", "num_blocks": 8, "mirror": {"endpoint": "ipc://"}}, "endpoint"),
])
def test_bad_mirror_specs_are_422_and_change_nothing(body, where):
    with make_client() as client:
        before = client.get("/api/pools").json()
        err = assert_error(client.post("/api/pools", json={"name": "m", **body}), 422, "invalid_request")
        assert where in str(err)
        assert client.get("/api/pools").json() == before


def test_unreadable_metrics_url_names_it(ipc):
    with make_client() as client:
        err = assert_error(client.post("/api/pools", json={
            "name": "m", "strategy": "mirror",
            "mirror": {"endpoint": ipc("x"), "metrics_url": "http://127.0.0.1:9/metrics"}}),
            422, "invalid_request")
        assert "127.0.0.1:9" in err["message"] and "num_blocks" in err["message"]
        assert "m" not in [p["name"] for p in client.get("/api/pools").json()["pools"]]


def test_mirror_republishes_and_a_second_mirror_agrees(ipc):
    """engine -> kvscope mirror (publish) -> another mirror: the chain keeps the set."""
    from support.apputil import free_port

    src_pub = Publisher(ipc("src"), replay_endpoint=ipc("src-replay"), topic="a")
    src = RefPrefixCache(seed=11)
    downstream = MirrorPool(128, name="d", device="cpu")
    with make_client() as client:
        for _ in range(3):  # the ports are chosen before the pool binds them: a 409 tries fresh ones
            port, replay_port = free_port(), free_port()
            r = client.post("/api/pools", json={
                "name": "engine", "strategy": "mirror", "num_blocks": 128,
                "mirror": {"endpoint": ipc("src"), "replay_endpoint": ipc("src-replay"), "topic": "a"},
                "publish": {"endpoint": f"tcp://*:{port}",
                            "replay_endpoint": f"tcp://*:{replay_port}", "topic": "b"}})
            if not (r.status_code == 409 and "already in use" in r.text):
                break
        assert r.status_code == 201, r.text
        # The same endpoint again is a conflict, and the failed pool is not left behind.
        err = assert_error(client.post("/api/pools", json={
            "name": "again", "strategy": "mirror", "num_blocks": 8,
            "mirror": {"endpoint": ipc("src")}, "publish": {"endpoint": f"tcp://*:{port}"}}),
            409, "conflict")
        assert "in use" in err["message"]
        assert "again" not in [p["name"] for p in client.get("/api/pools").json()["pools"]]
        sub = follow(downstream, f"tcp://127.0.0.1:{port}", topic="b",
                     replay_endpoint=f"tcp://127.0.0.1:{replay_port}", replay_timeout=30)
        try:
            for _ in range(25):
                src_pub.publish(src.step())
                time.sleep(0.01)
            wait_for(lambda: downstream.cached_hashes() == src.cached or
                     src_pub.publish([]) < 0, timeout=60, what="the downstream mirror to agree")
            assert stats(client)["mirror"]["cached_blocks"] == len(src.cached)
        finally:
            sub.stop()
            src_pub.close()
