"""A prefix-caching pool created over REST with `publish`: its sequences' stored / removed /
cleared events reach a router-side mirror exactly."""

from __future__ import annotations

import random

from test_real_publishers import wait_for

from allocator.prefix.mirror import MirrorPool
from kvevents.follow import follow


def events_set(client, name) -> set[int]:
    s: set[int] = set()
    after = 0
    while True:
        page = client.get(f"/api/pools/{name}/events", params={"after": after, "limit": 10_000}).json()
        for e in page["events"]:
            if e["type"] == "stored":
                s.update(h for h in e["block_hashes"])
            elif e["type"] == "removed":
                s.difference_update(e["block_hashes"])
            elif e["type"] == "cleared":
                s.clear()
        if not page["events"]:
            return s
        after = page["events"][-1]["seq"]


def test_rest_prefix_pool_publishes_to_a_router_mirror():
    from support.apputil import free_port, make_client

    rng = random.Random(2)
    stems = [[rng.randrange(1000) for _ in range(4 * k)] for k in (2, 3, 5)]
    mirror = MirrorPool(64, name="router", device="cpu")
    with make_client() as client:
        for _ in range(3):  # the ports are chosen before the pool binds them: a 409 tries fresh ones
            port, replay = free_port(), free_port()
            r = client.post("/api/pools", json={
                "name": "pc", "strategy": "paged", "num_blocks": 32, "block_bytes": 64,
                "tokens_per_block": 4, "prefix_caching": {"policy": "lru"},
                "publish": {"endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{replay}",
                            "topic": "kv"}})
            if not (r.status_code == 409 and "already in use" in r.text):
                break
        assert r.status_code == 201, r.text
        sub = follow(mirror, f"tcp://127.0.0.1:{port}", topic="kv",
                     replay_endpoint=f"tcp://127.0.0.1:{replay}", replay_timeout=30)
        try:
            for _ in range(60):
                tokens = rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]
                r = client.post("/api/pools/pc/sequences", json={"tokens": tokens})
                assert r.status_code == 201, r.text
                assert client.delete(f"/api/pools/pc/sequences/{r.json()['id']}").status_code == 204
            want = events_set(client, "pc")
            assert want
            wait_for(lambda: mirror.cached_hashes() == want, timeout=60, what="the router's mirror")
            assert client.post("/api/pools/pc/prefix-cache/reset", json={}).status_code == 200
            wait_for(lambda: mirror.cached_hashes() == set(), what="the reset to reach the mirror")
            st = sub.status()
            assert st["lost_batches"] == 0 and st["error_count"] == 0, st
        finally:
            sub.stop()
