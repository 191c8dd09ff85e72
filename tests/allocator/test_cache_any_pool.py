"""The cache on every pool strategy: random walks of every operation, invariants after each step.

The state machines in test_cache_stateful.py predict exact eviction orders on a paged pool;
here the pool varies (tiered fallbacks, contiguous fragmentation, raw allocations beside the
cache, defragmentation, resets) and the checks are the rules that must hold everywhere: both
`check()`s pass, used bytes stay within the capacity, pinned entries are never evicted, a put
never evicts its own key, and every byte written reads back.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import Conflict, InvalidRequest, KVCache, NotFound, OutOfMemory, create_pool

BB = 8
POOLS = [("paged", None), ("tiered", None), ("contiguous", "first"), ("contiguous", "best"),
         ("contiguous", "next"), ("contiguous", "worst")]
OPS = ["put"] * 5 + ["get"] * 3 + ["remove", "evict", "pin", "policy", "expire", "tick", "raw",
                                    "rawfree", "defrag", "write", "reset"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def walk(strategy: str, fit: str | None, policy: str, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    kw = {"fit": fit} if fit else {}
    pool = create_pool(strategy, num_blocks=64, block_bytes=BB, device="cpu", event_capacity=100, **kw)
    clock = Clock()
    cache = KVCache(pool, rng.choice([64 * BB, 32 * BB, 20 * BB]), policy=policy, clock=clock)
    keys = [f"k{i}" for i in range(12)]
    data: dict[str, bytes] = {}
    raw: list[int] = []
    for _ in range(steps):
        op = rng.choice(OPS)
        if op == "reset" and rng.random() > 0.1:
            op = "tick"
        k = rng.choice(keys)
        if op == "put":
            pinned_before = {e.key for e in cache.entries() if e.pinned}
            existed = k in cache
            n = rng.randint(1, BB * 12)
            try:
                r = cache.put(k, n, priority=rng.choice([0, 0, 1, 2]),
                              ttl_s=rng.choice([None, None, 0.5, 2.0]), pinned=rng.random() < 0.1)
            except (OutOfMemory, InvalidRequest):
                pass
            else:
                assert r.created == (not existed) and cache.peek(k).nbytes == n
                assert not set(r.evicted) & pinned_before, f"evicted pinned {r.evicted}"
                assert k not in r.evicted
                if k in data:
                    data[k] = data[k][:n]
        elif op == "get":
            e = cache.get(k)
            assert (e is None) == (k not in cache)
            if e is not None and e.expires_at is not None and not e.pinned:
                assert e.expires_at > clock.t, "an expired entry was a hit"
        elif op == "remove":
            try:
                cache.remove(k)
            except NotFound:
                assert k not in cache
        elif op == "evict":
            try:
                cache.evict(k)
            except NotFound:
                assert k not in cache
            except Conflict:
                assert cache.peek(k).pinned
        elif op == "pin" and k in cache:
            cache.pin(k, rng.random() < 0.5)
        elif op == "policy":
            cache.policy = rng.choice(["lru", "fifo", "lfu", "s3fifo"])
        elif op == "expire":
            cache.expire()
        elif op == "tick":
            clock.t += rng.choice([0.1, 0.6, 1.5])
        elif op == "raw":
            try:
                raw.append(pool.allocate(rng.randint(1, BB * 6)))
            except OutOfMemory:
                pass
        elif op == "rawfree" and raw:
            pool.free(raw.pop(rng.randrange(len(raw))))
        elif op == "defrag":
            pool.defragment()
        elif op == "write" and k in cache:
            d = rng.randbytes(rng.randint(0, cache.peek(k).nbytes))
            cache.write(k, d)
            data[k] = d
        elif op == "reset":
            pool.reset()
            raw.clear()
        for gone in [kk for kk in data if kk not in cache]:
            del data[gone]
        assert pool.check() == [] and cache.check() == []
        assert cache.used_bytes <= cache.capacity_bytes
        for kk, d in data.items():
            assert cache.read(kk) == d, f"entry {kk} lost its bytes"


@pytest.mark.parametrize(("strategy", "fit"), POOLS)
@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu", "s3fifo"])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_cache_rules_hold_on_every_pool(strategy, fit, policy, seed):
    walk(strategy, fit, policy, seed, 300)


@pytest.mark.parametrize("strategy", ["paged", "tiered", "contiguous"])
def test_key_of_follows_entries_and_forgets_them(strategy) -> None:
    """allocation id -> key: a paged pool tags its records, the others keep a dict; either way
    it names exactly the live entries, and forgets an entry evicted, removed or reset away."""
    pool = create_pool(strategy, num_blocks=64, block_bytes=64, device="cpu")
    cache = KVCache(pool, 64 * 16, "lru")
    raw = pool.allocate(64)
    a = cache.put("a", 100).entry.id
    b = cache.put("b", 100).entry.id
    assert (cache.key_of(a), cache.key_of(b), cache.key_of(raw)) == ("a", "b", None)
    assert cache.key_of(10**9) is None and cache.key_of("a") is None
    for i in range(16):
        cache.put(f"fill{i}", 64 * 3)
        if "a" not in cache:
            break
    assert cache.key_of(a) is None and cache.check() == []
    d = cache.put("d", 10).entry.id
    cache.remove("d")
    assert cache.key_of(d) is None and cache.check() == []
    c = cache.put("c", 10).entry.id
    pool.reset()
    assert cache.key_of(c) is None and len(cache) == 0
    assert cache.evictions["capacity"] >= 1 and set(cache.evictions) >= {"capacity", "ttl", "manual"}
