"""kvscope as a GPU-free engine: a trace on a prefix-caching pool, published; a router-side
subscriber (kvscope's mirror) and vLLM's own typed decoder agree with the pool."""

from __future__ import annotations

import random
import threading
import time

import msgspec
import pytest
import zmq
from kve_contract_pool import ContractPrefixPool
from kve_zmq import connect_joined
from test_real_publishers import wait_for

from allocator.prefix.mirror import MirrorPool
from kvevents.follow import follow
from kvevents.pool_publisher import PoolPublisher
from kvevents.trace_source import run_live_source


def trace(n: int, seed: int = 0):
    """Requests sharing a few long prefixes (block hashes chained by position)."""
    rng = random.Random(seed)
    stems = [[rng.getrandbits(64) for _ in range(rng.randint(2, 6))] for _ in range(4)]
    out = []
    for i in range(n):
        hashes = list(rng.choice(stems)) + [rng.getrandbits(64) for _ in range(rng.randint(0, 3))]
        out.append((i * 0.01, hashes, len(hashes) * 16))
    return out


def prefix_pools():
    from allocator import create_pool

    return [
        ("contract", lambda: ContractPrefixPool(40, 16)),
        ("allocator", lambda: create_pool(
            "paged", num_blocks=40, block_bytes=16, tokens_per_block=16, device="cpu",
            event_capacity=100_000, prefix_caching={"policy": "lru"})),
    ]


def reference_set(pool) -> set[int]:
    """The cached set the pool's own events say (stored adds, removed takes, cleared empties)."""
    s: set[int] = set()
    for e in pool.events.after(0, 1_000_000):
        if e["type"] == "stored":
            s.update(e["block_hashes"])
        elif e["type"] == "removed":
            s.difference_update(e["block_hashes"])
        elif e["type"] == "cleared":
            s.clear()
    return s


@pytest.mark.parametrize("name,make", prefix_pools())
def test_published_trace_is_mirrored_exactly(name, make, ipc, vllm_kv):
    pool = make()
    pub = PoolPublisher(pool, ipc("pub"), replay_endpoint=ipc("replay"), topic="kv")
    mirror = MirrorPool(64, name="router-view", device="cpu")
    sub = follow(mirror, ipc("pub"), topic="kv", replay_endpoint=ipc("replay"), replay_timeout=30)
    raw = zmq.Context.instance().socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"kv")
    try:
        connect_joined(raw, ipc("pub"))  # slow joiner: it must see every batch
        counts = run_live_source(pool, trace(150), pub, speed=None)
        assert counts["requests"] == 150 and counts["events"] > 0 and counts["cached_tokens"] > 0
        want = reference_set(pool)
        if hasattr(pool, "cached"):
            assert want == pool.cached
        wait_for(lambda: sub.last_seq == pub.publisher.next_seq - 1, what="the mirror")
        assert mirror.cached_hashes() == want
        assert sub.status()["lost_batches"] == 0 and sub.status()["error_count"] == 0
        # vLLM's own typed decoder reads every batch.
        dec = msgspec.msgpack.Decoder(type=vllm_kv.KVEventBatch)
        n = 0
        while raw.poll(2000):
            topic, seq, payload = raw.recv_multipart()
            n += len(dec.decode(payload).events)
        assert n == counts["events"]
    finally:
        raw.close(0)
        sub.stop()
        pub.close()


def test_speed_paces_the_trace_and_stop_ends_it(ipc):
    pool = ContractPrefixPool(40, 16)
    pub = PoolPublisher(pool, ipc("pub"))
    try:
        t = time.monotonic()
        counts = run_live_source(pool, trace(11), pub, speed=1.0)  # 10 gaps of 10 ms
        assert time.monotonic() - t >= 0.09 and counts["requests"] == 11
        stop = threading.Event()
        stop.set()
        assert run_live_source(pool, trace(5), pub, stop=stop)["requests"] == 0
    finally:
        pub.close()
