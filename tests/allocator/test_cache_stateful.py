"""Stateful property tests of KVCache against a small reference model, for every policy.

The model keeps, per key, its footprint, priority, pin, expiry (on an injected fake clock),
last access and hits, and a plain list (lru, fifo) or (frequency, stamp) pairs (lfu) for the
order inside a priority. From them it predicts exactly which keys each put evicts, in which
order and for which reason, what every eviction event says, and the full `entries()` order.
For s3fifo (whose order is the policy's own simulation) it checks the set-level contract:
evictions follow `entries()`, pinned keys are never evicted, lower priorities go first.
After every step: `cache.check() == []`, `pool.check() == []`, and every entry's bytes.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.kvtest_util import FakeClock, crc, payload, pool_snapshot

from allocator import InvalidRequest, KVCache, NotFound, OutOfMemory, create_pool

BLOCK = 16
POOL_BLOCKS = 64
CAPACITY = 40 * BLOCK
KEYS = [f"k{i}" for i in range(10)]
SETTINGS = settings(
    max_examples=int(os.environ.get("KVSCOPE_TEST_EXAMPLES", "100")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def fp(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


class Ref:
    """One modelled entry."""

    def __init__(self, nbytes: int, priority: int, pinned: bool, expires: float | None,
                 now: float) -> None:
        self.nbytes = nbytes
        self.held = fp(nbytes)
        self.priority = priority
        self.pinned = pinned
        self.expires = expires
        self.created = now
        self.last_access = now
        self.hits = 0
        self.data = b""


class CacheMachine(RuleBasedStateMachine):
    policy = "lru"

    @initialize()
    def setup(self) -> None:
        self.clock = FakeClock()
        self.pool = create_pool("paged", num_blocks=POOL_BLOCKS, block_bytes=BLOCK, device="cpu")
        self.cache = KVCache(self.pool, CAPACITY, self.policy, clock=self.clock)
        self.model: dict[str, Ref] = {}  # insertion order mirrors the cache's entry dict
        self.order: list[str] = []  # lru / fifo: victim first, all priorities mixed
        self.freq: dict[str, tuple[int, int]] = {}  # lfu: key -> (frequency, stamp)
        self.stamp = 0
        self.seed = 0

    # -- the model's policy structure --------------------------------------------------------
    def p_insert(self, key: str, freq: int = 1) -> None:
        if self.policy in ("lru", "fifo"):
            self.order.append(key)
        elif self.policy == "lfu":
            self.stamp += 1
            self.freq[key] = (freq, self.stamp)

    def p_touch(self, key: str) -> None:
        if self.policy == "lru":
            self.order.remove(key)
            self.order.append(key)
        elif self.policy == "lfu":
            self.stamp += 1
            self.freq[key] = (self.freq[key][0] + 1, self.stamp)

    def p_remove(self, key: str) -> None:
        if self.policy in ("lru", "fifo"):
            self.order.remove(key)
        elif self.policy == "lfu":
            del self.freq[key]

    def expired(self, e: Ref) -> bool:
        return e.expires is not None and e.expires <= self.clock.now and not e.pinned

    def victim_order(self, exclude: str | None = None) -> list[str]:
        """Unpinned keys, next victim first: expired by (expiry, key), then priority, policy."""
        m = self.model
        exp = sorted((k for k, e in m.items() if self.expired(e) and k != exclude),
                     key=lambda k: (m[k].expires, k))
        rest = [k for k, e in m.items() if not e.pinned and not self.expired(e) and k != exclude]
        if self.policy in ("lru", "fifo"):
            pos = {k: i for i, k in enumerate(self.order)}
            rest.sort(key=lambda k: (m[k].priority, pos[k]))
        elif self.policy == "lfu":
            rest.sort(key=lambda k: (m[k].priority, self.freq[k]))
        else:
            return exp + sorted(rest, key=lambda k: m[k].priority)  # priority only
        return exp + rest

    def exact(self) -> bool:
        return self.policy != "s3fifo"

    # -- helpers -------------------------------------------------------------------------------
    def used(self) -> int:
        return sum(e.held for e in self.model.values())

    def evictable(self, exclude: str | None) -> int:
        return sum(e.held for k, e in self.model.items() if not e.pinned and k != exclude)

    def fill(self, key: str) -> None:
        self.seed += 1
        e = self.model[key]
        e.data = payload(e.nbytes, self.seed)
        self.cache.write(key, e.data)

    def evict_in_model(self, need: int, exclude: str | None) -> list[tuple[str, str]]:
        """Evict (key, reason) in victim order until `need` more bytes fit."""
        out = []
        order = self.victim_order(exclude)
        while self.used() + need > CAPACITY:
            key = order.pop(0)
            out.append((key, "ttl" if self.expired(self.model[key]) else "capacity"))
            self.drop(key)
        return out

    def drop(self, key: str) -> Ref:
        e = self.model.pop(key)
        if not e.pinned:
            self.p_remove(key)
        return e

    def check_evictions(self, seq: int, evicted: list[tuple[str, str]], refs: dict[str, Ref]) -> None:
        events = self.pool.events.after(seq, kinds={"evict"})
        assert [(ev["key"], ev["reason"]) for ev in events] == evicted
        now = self.clock.now
        for ev in events:
            e = refs[ev["key"]]
            assert ev["bytes"] == e.nbytes
            assert ev["blocks"] == e.held // BLOCK
            assert ev["policy"] == self.policy
            assert ev["age_s"] == now - e.created
            assert ev["idle_s"] == now - e.last_access

    def refused(self, call, error) -> None:
        before = pool_snapshot(self.pool)
        with pytest.raises(error):
            call()
        assert pool_snapshot(self.pool) == before, "a refused request changed the cache"

    # -- rules ---------------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), nbytes=st.integers(1, 14 * BLOCK),
          priority=st.integers(0, 2), ttl=st.none() | st.integers(1, 8),
          pinned=st.sampled_from([False, False, False, True]))
    def put(self, key: str, nbytes: int, priority: int, ttl: int | None, pinned: bool) -> None:
        now = self.clock.now
        e = self.model.get(key)
        need = fp(nbytes) - (e.held if e else 0)
        if self.used() + need - self.evictable(key) > CAPACITY:
            self.refused(lambda: self.cache.put(key, nbytes, priority, ttl, pinned), OutOfMemory)
            return
        predicted_order = [x.key for x in self.cache.entries()]
        refs = dict(self.model)
        seq = self.pool.events.last_seq
        old_data = e.data if e else b""
        result = self.cache.put(key, nbytes, priority, ttl, pinned)
        assert result.created is (e is None)
        if self.exact():
            evicted = self.evict_in_model(max(need, 0), key if e else None)
            assert result.evicted == [k for k, _ in evicted]
            self.check_evictions(seq, evicted, refs)
        else:
            evicted = [(k, "") for k in result.evicted]
            if e is None:
                assert result.evicted == predicted_order[: len(result.evicted)]
            for k in result.evicted:
                assert not refs[k].pinned, f"pinned {k} was evicted"
                if k in self.model:
                    self.drop(k)
            survivors = [x for k, x in self.model.items() if not x.pinned and k != key
                         and not self.expired(x)]
            for k in result.evicted:
                if not self.expired(refs[k]):
                    assert all(refs[k].priority <= x.priority for x in survivors)
        if e is None:
            e = self.model[key] = Ref(nbytes, priority, pinned, None if ttl is None else now + ttl, now)
            if not pinned:
                self.p_insert(key)
            self.fill(key)
            return
        # Refresh: resize first, then priority, pin and touch, as documented.
        e.nbytes, e.held = nbytes, fp(nbytes)
        if e.priority != priority and not e.pinned:
            self.p_remove(key)
            self.p_insert(key)
        e.priority = priority
        if pinned != e.pinned:
            e.pinned = pinned
            if pinned:
                self.p_remove(key)
            else:
                self.p_insert(key)
        elif not pinned:
            self.p_touch(key)
        e.last_access = now
        if ttl is not None:
            e.expires = now + ttl
        keep = old_data[: nbytes]
        assert self.cache.read(key)[: len(keep)] == keep, "resize lost the entry's bytes"
        self.fill(key)

    @rule(key=st.sampled_from(KEYS))
    def get(self, key: str) -> None:
        e = self.model.get(key)
        seq = self.pool.events.last_seq
        hits, misses = self.cache.hits, self.cache.misses
        got = self.cache.get(key)
        if e is not None and self.expired(e):
            refs = {key: e}
            self.drop(key)
            if self.exact():
                self.check_evictions(seq, [(key, "ttl")], refs)
            e = None
        if e is None:
            assert got is None
            assert (self.cache.hits, self.cache.misses) == (hits, misses + 1)
            return
        assert got is not None and got.key == key and got.nbytes == e.nbytes
        assert (self.cache.hits, self.cache.misses) == (hits + 1, misses)
        e.hits += 1
        e.last_access = self.clock.now
        if not e.pinned:
            self.p_touch(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        if key not in self.model:
            self.refused(lambda: self.cache.remove(key), NotFound)
            return
        self.cache.remove(key)
        self.drop(key)

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), pinned=st.booleans())
    def pin(self, i: int, pinned: bool) -> None:
        key = sorted(self.model)[i % len(self.model)]
        e = self.model[key]
        self.cache.pin(key, pinned)
        if e.pinned != pinned:
            e.pinned = pinned
            if pinned:
                self.p_remove(key)
            else:
                self.p_insert(key)

    @rule(seconds=st.sampled_from([0.5, 1, 3]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def expire(self) -> None:
        seq = self.pool.events.last_seq
        want = [k for k in self.victim_order() if self.expired(self.model[k])]
        refs = dict(self.model)
        assert self.cache.expire() == want
        for k in want:
            self.drop(k)
        if self.exact():
            self.check_evictions(seq, [(k, "ttl") for k in want], refs)

    @rule(policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]))
    def switch_policy(self, policy: str) -> None:
        self.cache.policy = policy
        self.policy = policy
        self.order, self.freq = [], {}
        # Documented: re-filed in the order the new policy would have seen them: insertion for
        # fifo and s3fifo, last access otherwise (ties keep entry order).
        by = "created" if policy in ("fifo", "s3fifo") else "last_access"
        for k in sorted(self.model, key=lambda k: getattr(self.model[k], by)):
            if not self.model[k].pinned:
                self.p_insert(k, self.model[k].hits + 1)

    @rule(key=st.sampled_from(KEYS), bad=st.sampled_from([0, -1, 1.5, True, None, "8",
                                                           CAPACITY + 1]))
    def bad_put(self, key: str, bad: object) -> None:
        self.refused(lambda: self.cache.put(key, bad), InvalidRequest)

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        cache = self.cache
        assert cache.check() == []
        assert self.pool.check() == []
        assert set(self.model) == {e.key for e in cache.entries()}
        assert cache.used_bytes == self.used() <= CAPACITY
        assert cache.pinned_bytes == sum(e.held for e in self.model.values() if e.pinned)
        if self.exact():
            pinned = [k for k, e in self.model.items() if e.pinned]
            assert [e.key for e in cache.entries()] == self.victim_order() + pinned
        for key, e in self.model.items():
            entry = cache.peek(key)
            assert (entry.nbytes, entry.priority, entry.pinned) == (e.nbytes, e.priority, e.pinned)
            assert entry.expires_at == e.expires
            assert crc(cache.read(key)) == crc(e.data), f"entry {key} lost its bytes"


def machine(policy: str):
    cls = type(f"Cache{policy.title()}Machine", (CacheMachine,), {"policy": policy})
    cls.TestCase.settings = SETTINGS
    return cls.TestCase


TestCacheLRU = machine("lru")
TestCacheFIFO = machine("fifo")
TestCacheLFU = machine("lfu")
TestCacheS3FIFO = machine("s3fifo")
