"""Resizing entries and choosing victims: shrinking never evicts, growth evicts only what helps."""

from __future__ import annotations

import pytest

from allocator import InvalidRequest, KVCache, NotFound, OutOfMemory, create_pool
from allocator.vocab import STRATEGIES  # every strategy meets the same contract


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_truncate_returns_the_tail_and_keeps_the_prefix(strategy):
    pool = create_pool(strategy, num_blocks=256, block_bytes=16, device="cpu")
    aid = pool.allocate(1000)  # several blocks in every strategy (four large ones when tiered)
    pool.write(aid, bytes(range(256)) * 3 + bytes(232))
    held = pool.held_bytes(aid)
    pool.truncate(aid, 20)
    # Tiered blocks stay in their tier: one large block is left, not a small one.
    expected = 256 if strategy == "tiered" else pool.footprint(20)
    assert pool.held_bytes(aid) == expected < held
    assert pool.read(aid) == bytes(range(20))
    assert pool.stats()["requested_bytes"] == 20
    assert pool.events.after(pool.events.last_seq - 1)[0]["type"] == "truncate"
    assert pool.check() == []
    with pytest.raises(InvalidRequest):
        pool.truncate(aid, 21)  # truncate never grows
    with pytest.raises(InvalidRequest):
        pool.truncate(aid, 0)
    with pytest.raises(NotFound):
        pool.truncate(999, 1)
    assert pool.check() == []


def test_shrinking_an_entry_in_a_full_pool_evicts_nothing():
    pool = create_pool("paged", num_blocks=4, block_bytes=4096, device="cpu")
    cache = KVCache(pool)
    cache.put("a", 8192)
    cache.put("b", 4096)
    cache.put("c", 4096)
    cache.write("a", b"k" * 5000)
    result = cache.put("a", 4096)
    assert result.evicted == [] and sorted(cache._entries) == ["a", "b", "c"]
    assert cache.read("a") == b"k" * 4096
    assert cache.stats()["used_bytes"] == 3 * 4096
    assert cache.put("a", 100).evicted == []  # same footprint: nothing moves at all
    assert pool.check() == [] and cache.check() == []


def test_tiered_growth_never_evicts_entries_of_tiers_it_cannot_use():
    pool = create_pool("tiered", num_blocks=64, block_bytes=1024, device="cpu")  # 16 small, 4 medium, 2 large
    cache = KVCache(pool)
    cache.put("s0", 1000)
    for i in range(1, 16):
        cache.put(f"s{i}", 1000, pinned=True)  # the small tier is now full, and pinned
    cache.put("L0", 16_000)
    cache.put("L1", 16_000)
    with pytest.raises(OutOfMemory):
        cache.put("s0", 2000)  # extend stays in the small tier: the large entries cannot help
    assert {"L0", "L1", "s0"} <= set(cache._entries)
    assert cache.stats()["evictions"]["oom"] == 0
    assert pool.check() == [] and cache.check() == []


def test_tiered_new_entry_evicts_only_from_tiers_it_may_use():
    pool = create_pool("tiered", num_blocks=64, block_bytes=1024, device="cpu")
    cache = KVCache(pool)
    for i in range(16):
        cache.put(f"s{i}", 1000)      # small tier full (evictable, and oldest)
    for i in range(4):
        cache.put(f"m{i}", 4000)      # medium tier full
    cache.put("L0", 16_000)
    cache.put("L1", 16_000)           # large tier full
    result = cache.put("new", 3000)   # medium request: falls back to large, never to small
    assert result.evicted and all(k[0] in "mL" for k in result.evicted)
    assert all(f"s{i}" in cache for i in range(16))
    assert pool.check() == [] and cache.check() == []


@pytest.mark.parametrize(("policy", "order"), [("fifo", "xyz"), ("lru", "yzx"), ("s3fifo", "xyz")])
def test_switching_policy_files_entries_as_that_policy_would_have(policy, order):
    pool = create_pool("paged", num_blocks=16, block_bytes=16, device="cpu")
    cache = KVCache(pool, policy="lru")
    for k in "xyz":
        cache.put(k, 16)
    cache.get("x")
    cache.policy = policy
    assert "".join(e.key for e in cache.entries()) == order
    assert cache.check() == []
