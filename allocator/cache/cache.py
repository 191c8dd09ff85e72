"""KVCache: keyed KV entries on a pool, with a byte capacity and eviction."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from .._core import CacheCore, Entry, KeyIndex, PutResult
from ..errors import (
    Conflict,
    CorruptState,
    ExceedsCapacity,
    InvalidRequest,
    NotFound,
    OutOfMemory,
    positive_int,
)
from ..pools.blockmap import CACHED, PINNED
from ..pools.pool import Pool
from ..vocab import EVICTION_REASONS
from .policies import POLICIES

MAX_KEY_LENGTH = 256


class KVCache(CacheCore):
    """Entries by string key on `pool`, using at most `capacity_bytes` of its memory.

    Victim order: expired (TTL) entries first, then lowest priority first, then the policy
    within a priority. Pinned entries are never evicted and sit in no policy structure.
    One policy object per priority level, created on demand (`_by_priority`). The
    per-operation path (put, victim choice, eviction) is the compiled base `CacheCore`
    (allocator/_cache.pxi); this class holds the rest and the state's Python-facing parts.

    Invariants (see `check`): `used_bytes` == sum of entries' allocated bytes <= capacity; each
    entry's allocation exists in the pool with that size; the policy structures hold exactly
    the unpinned keys, each under its own priority; allocation id -> key is known for exactly
    the entries (`key_of`: a paged pool's records carry the key as their tag, other pools
    use the `_key_of` dict).

    NOTE: a put that cannot fit even after evicting every unpinned entry is refused before any
    eviction when the shortfall is visible up front (pinned bytes, or free + evictable memory
    in the pool); on a contiguous pool fragmentation can still defeat it after evictions,
    which are then recorded as events like any other.

    NOTE: the boundary. Keys (str of 1..256 chars) and sizes (positive ints up to the
    capacity), priorities and TTLs are checked by `put` before the compiled path runs; an
    `Entry` handed out is a view whose policy slot (`pslot`) Python cannot write.
    """

    def __init__(
        self,
        pool: Pool,
        capacity_bytes: int | None = None,
        policy: str = "lru",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes is None:
            capacity_bytes = pool.capacity_bytes
        positive_int(capacity_bytes, "capacity_bytes")
        if capacity_bytes > pool.capacity_bytes:
            raise InvalidRequest(
                f"capacity_bytes {capacity_bytes} exceeds the pool's {pool.capacity_bytes} bytes"
            )
        self._check_policy(policy)
        self.pool = pool
        self.capacity_bytes = capacity_bytes
        self.clock = clock
        self._policy = policy
        self._entries = KeyIndex()
        self._key_of: dict[int, str] = {}
        self._by_priority: dict[int, object] = {}
        self._ttl_heap: list[tuple[float, str, int]] = []
        self.used_bytes = 0
        self.pinned_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = dict.fromkeys(EVICTION_REASONS, 0)
        self.refusals = 0  # puts refused because the budget is held by pinned entries
        pool.attach("cache", self)  # the pool tells us of resets; we hold the pool, not it us
        self._bind(POLICIES, OutOfMemory)

    # -- policy ---------------------------------------------------------------------------
    @staticmethod
    def _check_policy(policy: str) -> None:
        if policy not in POLICIES:
            raise InvalidRequest(f"unknown policy {policy!r}; choose one of {sorted(POLICIES)}")

    @property
    def policy(self) -> str:
        return self._policy

    @policy.setter
    def policy(self, name: str) -> None:
        """Switch policy at runtime. Entries are re-filed in the order the new policy would have
        seen them: insertion order for fifo and s3fifo, last access for lru, and for lfu their
        hit counts (ties by last access)."""
        self._check_policy(name)
        self._policy = name
        self._by_priority = {}
        by_insertion = name in ("fifo", "s3fifo")
        for e in sorted(self._entries.values(),
                        key=(lambda e: e.created_at) if by_insertion else (lambda e: e.last_access)):
            if e.pinned:
                continue
            self._file(e, e.hits + 1 if name == "lfu" else 0)
        self.pool.events.record("policy", name)

    # -- public API -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def footprint(self, nbytes: int) -> int:
        """Bytes of pool memory an entry of `nbytes` would hold."""
        return self.pool.footprint(nbytes)

    def _shed_excess(self, key: str, evicted: list[str]) -> None:
        while self.used_bytes > self.capacity_bytes:
            victim = self._next_victim(key)
            if victim is None:
                break
            self._evict(victim, "capacity")
            evicted.append(victim)

    def get(self, key: str) -> Entry | None:
        """The entry (a hit, which touches it), or None (a miss; expired entries miss)."""
        entry = self._entries.get(key)
        if (entry is not None and not entry.pinned and entry.expires_at is not None
                and entry.expires_at <= self.clock()):
            self._evict(key, "ttl")
            entry = None
        if entry is None:
            self.misses += 1
            self.pool.events.record("miss", key)
            return None
        self.hits += 1
        entry.hits += 1
        entry.last_access = self.clock()
        if not entry.pinned:
            self._touch(entry)
        self.pool.events.record("hit", key)
        return entry

    def peek(self, key: str) -> Entry:
        """The entry without touching it. Raises NotFound."""
        try:
            return self._entries[key]
        except (KeyError, TypeError):
            raise NotFound("entry", key) from None

    def remove(self, key: str) -> None:
        """Drop `key` and free its memory. Raises NotFound."""
        entry = self.peek(key)
        self._drop(entry, evicted=False)
        self.pool.events.record("remove", key, entry.nbytes)

    def evict(self, key: str) -> None:
        """Evict `key` now (reason "manual"). Raises NotFound, Conflict (pinned: unpin first)."""
        if self.peek(key).pinned:
            raise Conflict(f"entry {key!r} is pinned; pinned entries are never evicted")
        self._evict(key, "manual")

    def pin(self, key: str, pinned: bool = True) -> Entry:
        entry = self.peek(key)
        if entry.pinned != pinned:
            if pinned:
                self._unfile(entry)
                self.pinned_bytes += entry.allocated_bytes
            else:
                self._file(entry)
                self.pinned_bytes -= entry.allocated_bytes
            entry.pinned = pinned
            self.pool.set_state(entry.id, PINNED if pinned else CACHED)
        return entry

    def expire(self) -> list[str]:
        """Evict every unpinned entry whose TTL has passed (reason "ttl").

        A pinned entry keeps its heap record, so it expires as soon as it is unpinned.
        """
        out: list[str] = []
        kept: list[tuple[float, str, int]] = []
        now = self.clock()
        heap = self._ttl_heap
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)
            expires_at, key, aid = item
            e = self._entries.get(key)
            if e is None or e.id != aid or e.expires_at != expires_at:
                continue  # stale record of a removed, resized or refreshed entry
            if e.pinned:
                kept.append(item)
                continue
            self._evict(key, "ttl")
            out.append(key)
        for item in kept:
            heapq.heappush(heap, item)
        return out

    def entries(self, limit: int | None = None) -> list[Entry]:
        """Entries in eviction order, next victim first; pinned entries last."""
        now = self.clock()
        expired = sorted(
            (e for e in self._entries.values()
             if e.expires_at is not None and e.expires_at <= now and not e.pinned),
            key=lambda e: (e.expires_at, e.key),  # the TTL heap's order: ties by key
        )
        seen = {e.key for e in expired}
        out = list(expired)
        for prio in sorted(self._by_priority):
            out.extend(self._entries[k] for k in self._by_priority[prio].order() if k not in seen)
            if limit is not None and len(out) >= limit:
                break
        if limit is None or len(out) < limit:
            out.extend(e for e in self._entries.values() if e.pinned)
        return out if limit is None else out[:limit]


    def write(self, key: str, payload: bytes) -> None:
        """Store `payload` in the entry's device blocks. Raises NotFound, InvalidRequest."""
        entry = self.peek(key)
        if len(payload) > entry.nbytes:
            raise InvalidRequest(f"{len(payload)} bytes do not fit in entry {key!r} of {entry.nbytes} bytes")
        self.pool.write(entry.id, payload)
        entry.data_bytes = len(payload)

    def read(self, key: str) -> bytes:
        """Exactly the bytes last written (empty if none): never the stale memory of the
        blocks' previous owners. Raises NotFound."""
        entry = self.peek(key)
        return self.pool.read(entry.id, entry.data_bytes) if entry.data_bytes else b""

    def clear(self) -> int:
        keys = list(self._entries)
        for k in keys:
            self._drop(self._entries[k], evicted=False)
        return len(keys)

    def stats(self) -> dict:
        lookups = self.hits + self.misses
        return {
            "policy": self._policy,
            "capacity_bytes": self.capacity_bytes,
            "used_bytes": self.used_bytes,
            "pinned_bytes": self.pinned_bytes,
            "entries": len(self._entries),
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / lookups if lookups else 0.0,
            "evictions": dict(self.evictions),
            "refusals": self.refusals,
        }

    def check(self) -> list[str]:
        """Every cache invariant; returns the problems found (empty = ok)."""
        problems: list[str] = list(self._entries.check())
        total = pinned = 0
        id_map = self._keys_by_id()
        for key, e in self._entries.items():
            if e.key != key:
                problems.append(f"entry stored under {key!r} names itself {e.key!r}")
            if e.id not in self.pool:
                problems.append(f"entry {key!r}: allocation {e.id} is not in the pool")
                continue
            try:
                held = len(self.pool._block_ids(e.id)) * self.pool.block_bytes
            except CorruptState as broken:  # the pool's check() names it too
                problems.append(f"entry {key!r}: {broken}")
                continue
            if held != e.allocated_bytes:
                problems.append(f"entry {key!r} records {e.allocated_bytes} bytes, its allocation holds {held}")
            if id_map.get(e.id) != key:
                problems.append(f"id map sends allocation {e.id} to {id_map.get(e.id)!r}, not {key!r}")
            want = PINNED if e.pinned else CACHED
            if self.pool.state_of(e.id) != want:
                problems.append(f"entry {key!r}: blocks are in state {self.pool.state_of(e.id)}, expected {want}")
            total += e.allocated_bytes
            pinned += e.allocated_bytes if e.pinned else 0
        if total != self.used_bytes:
            problems.append(f"used_bytes is {self.used_bytes}, entries add up to {total}")
        if pinned != self.pinned_bytes:
            problems.append(f"pinned_bytes is {self.pinned_bytes}, pinned entries add up to {pinned}")
        if self.used_bytes > self.capacity_bytes:
            problems.append(f"used_bytes {self.used_bytes} exceeds capacity {self.capacity_bytes}")
        if len(id_map) != len(self._entries):
            problems.append(f"id map has {len(id_map)} ids for {len(self._entries)} entries")
        held: set[str] = set()
        for prio, s in self._by_priority.items():
            broken = s.check()
            if broken:  # its keys and count cannot be trusted: the rest would only echo it
                problems += [f"priority {prio}: {p}" for p in broken]
                continue
            keys = s.keys()
            if len(keys) != len(s):
                problems.append(f"policy structure at priority {prio} holds duplicates")
            for k in keys:
                e = self._entries.get(k)
                if e is None:
                    problems.append(f"policy holds {k!r}, which is not cached")
                elif e.pinned:
                    problems.append(f"pinned entry {k!r} is in the policy structure")
                elif e.priority != prio:
                    problems.append(f"entry {k!r} of priority {e.priority} is filed under {prio}")
                elif s.key_at(e.pslot) != k:
                    problems.append(f"entry {k!r} says slot {e.pslot}, which holds {s.key_at(e.pslot)!r}")
            if held & keys:
                problems.append(f"keys filed under two priorities: {sorted(held & keys)[:3]}")
            held |= keys
        unpinned = {k for k, e in self._entries.items() if not e.pinned}
        if unpinned - held:
            problems.append(f"entries missing from the policy: {sorted(unpinned - held)[:3]}")
        return problems

    # -- internals --------------------------------------------------------------------------
    def _validate(self, key: object, nbytes: object, priority: object, ttl_s: object,
                  pinned: object = None) -> None:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            raise InvalidRequest(f"key must be a non-empty string of at most {MAX_KEY_LENGTH} characters")
        positive_int(nbytes, "size in bytes")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise InvalidRequest(f"priority must be an integer, got {priority!r}")
        if pinned is not None and not isinstance(pinned, bool):
            raise InvalidRequest(f"pinned must be true or false, got {pinned!r}")
        if ttl_s is not None and (
            isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s > 0
            or ttl_s == float("inf")
        ):
            raise InvalidRequest(f"ttl_s must be a positive finite number of seconds, got {ttl_s!r}")

    def _too_large(self, nbytes: int, need: int) -> ExceedsCapacity:
        """An entry whose footprint is over the whole budget: it can never fit (413)."""
        return ExceedsCapacity(need, self.capacity_bytes, "cache")

    def _refuse_pool(self, need: int) -> OutOfMemory | ExceedsCapacity:
        """The pool itself cannot hold `need` even with every evictable entry gone."""
        pool = self.pool
        free = (pool.num_blocks - pool.used_blocks) * pool.block_bytes
        return pool._oom(need, free, pool.largest_free_bytes(), "capacity")

    def _refuse_budget(self, need: int) -> OutOfMemory | ExceedsCapacity:
        """The cache's own budget cannot hold `need` (pinned entries fill it): counted by the
        cache as a refusal, not as a pool OOM, since the pool may have memory to spare.
        ExceedsCapacity (not counted) when `need` is over the whole budget: it never fits."""
        if need > self.capacity_bytes:
            return ExceedsCapacity(need, self.capacity_bytes, "cache")
        self.refusals += 1
        room = self.capacity_bytes - self.used_bytes + self._evictable_bytes(None)
        return OutOfMemory(need, room, room, "capacity")

    def _allocate(self, nbytes: int, state: int, exclude: str | None, evicted: list[str],
                  helps=None) -> int:
        """Allocate, evicting (reason oom) while the pool says out of memory, but only entries
        whose memory could serve this request (`helps`: on a tiered pool, those in a usable
        tier)."""
        while True:
            try:
                return self.pool.allocate(nbytes, state)
            except OutOfMemory:
                key = self._next_victim(exclude, helps)
                if key is None:
                    raise
                self._evict(key, "oom")
                evicted.append(key)

    def _refresh(self, entry: Entry, nbytes: int, priority: int | None, ttl_s: float | None,
                 pinned: bool | None, now: float) -> PutResult:
        key = entry.key
        evicted: list[str] = []
        if nbytes != entry.nbytes:
            self._resize(entry, nbytes, evicted)
        if priority is not None and priority != entry.priority:
            if not entry.pinned:
                self._unfile(entry)
            entry.priority = priority
            if not entry.pinned:
                self._file(entry)
        if pinned is not None and pinned != entry.pinned:
            self.pin(key, pinned)
        elif not entry.pinned:
            self._touch(entry)
        entry.last_access = now
        if ttl_s is not None:
            entry.ttl_s, entry.expires_at = ttl_s, now + ttl_s
            heapq.heappush(self._ttl_heap, (entry.expires_at, key, entry.id))
        self.pool.events.record("put", key, entry.id, entry.nbytes, entry.allocated_bytes // self.pool.block_bytes)
        return PutResult(entry, False, evicted)

    def _resize(self, entry: Entry, nbytes: int, evicted: list[str]) -> None:
        """Grow in place with the pool's `extend` (evicting only entries whose memory the growth
        can use); shrink with `truncate`, which never needs memory. Data prefix kept."""
        if nbytes > entry.nbytes:
            helps = self.pool.victim_filter(nbytes - entry.nbytes, grow=entry.id)
            grow = self.pool.growth_bytes(entry.id, nbytes - entry.nbytes)
            if grow:
                self._make_room(grow, entry.key, evicted, helps)
            while True:
                try:
                    self.pool.extend(entry.id, nbytes - entry.nbytes)
                    break
                except OutOfMemory:
                    victim = self._next_victim(entry.key, helps)
                    if victim is None:
                        raise
                    self._evict(victim, "oom")
                    evicted.append(victim)
        else:
            self.pool.truncate(entry.id, nbytes)
        held = self.pool.held_bytes(entry.id)
        self.used_bytes += held - entry.allocated_bytes
        if entry.pinned:
            self.pinned_bytes += held - entry.allocated_bytes
        entry.allocated_bytes = held
        entry.nbytes = nbytes
        entry.data_bytes = min(entry.data_bytes, nbytes)
        self._shed_excess(entry.key, evicted)

    def on_pool_reset(self) -> None:
        self._forget_all()

    def _forget_all(self) -> None:
        """The pool was reset under us: every entry's memory is already gone."""
        self._entries = KeyIndex()
        self._key_of.clear()
        self._by_priority.clear()
        self._ttl_heap.clear()
        self.used_bytes = self.pinned_bytes = 0
