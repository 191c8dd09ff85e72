"""The live Mooncake replay on a prefix-caching pool."""

import pytest

from allocator import InvalidRequest, create_pool
from workloads.live import MAX_OPS_PER_ADVANCE, MooncakeWorkload


def prefix_pool(blocks=16_384, tpb=16, policy="lru"):
    return create_pool("paged", num_blocks=blocks, block_bytes=tpb, tokens_per_block=tpb,
                       device="cpu", prefix_caching={"policy": policy})


def test_replays_to_the_end_sharing_prefixes_and_leaves_only_cached_blocks():
    pool = prefix_pool()  # 262,144 tokens: every prompt of the first 80 requests fits
    wl = MooncakeWorkload(pool, limit=80, speed=1000.0)
    assert wl.progress()["state"] == "running" and wl.progress()["kind"] == "mooncake"
    for _ in range(10_000):
        if not wl.advance(0.05):
            break
    p = wl.progress()
    assert p["state"] == "finished" and p["done"] == p["total"] == 80
    stats = pool.prefix_stats()
    assert stats["sequences"] == 0 and stats["hits"] > 0 and stats["stored"] > 0
    assert stats["blocks"]["cached"] > 0 and pool.check() == []
    summary = wl.summary()
    assert summary["completed"] == 80 and 0 < summary["hit_ratio"] < 1
    assert summary["prefill_tokens"] < summary["prompt_tokens"]
    states = [e["state"] for e in pool.events.after(0, kinds={"workload"})]
    assert states[0] == "running" and states[-1] == "finished"


def test_stop_closes_every_open_sequence_and_advance_is_bounded():
    pool = prefix_pool()
    wl = MooncakeWorkload(pool, limit=2000, speed=1000.0)
    wl.advance(30.0)  # 30,000 simulated seconds asked for: the call stops at its op budget
    opens = pool.prefix_stats()["opens"]
    assert 0 < opens and pool.prefix_stats()["appends"] + opens <= MAX_OPS_PER_ADVANCE + 2
    assert pool.prefix_stats()["sequences"] > 0
    wl.stop()
    assert wl.progress()["state"] == "stopped"
    assert pool.prefix_stats()["sequences"] == 0 and pool.check() == []


def test_needs_a_prefix_pool_with_blocks_dividing_512():
    plain = create_pool("paged", num_blocks=64, block_bytes=16, device="cpu")
    with pytest.raises(InvalidRequest, match="needs a pool with prefix caching"):
        MooncakeWorkload(plain, limit=10, speed=1.0)
    with pytest.raises(InvalidRequest, match="tokens_per_block dividing 512.*has 48"):
        MooncakeWorkload(prefix_pool(blocks=64, tpb=48), limit=10, speed=1.0)
