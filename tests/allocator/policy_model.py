"""Reference model of the eviction policies, in plain Python over OrderedDicts: the obvious
implementation the compiled ones (allocator/_policies.pxi) are checked against step by step.
This was kvscope's implementation before the compiled core; it is kept only for the tests.

Every policy answers the same five calls: `insert(key)`, `touch(key)` (a hit),
`remove(key, evicted)`, `victim()` (the next key to evict, without removing it) and
`order(limit)` (keys in eviction order, next victim first). Invariant: the set of keys held
equals what was inserted and not yet removed; `check()` on the cache compares them.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice


class LRU:
    """Least recently used: an OrderedDict in recency order, oldest first (O(1) touch/evict)."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def insert(self, key: str) -> None:
        self._order[key] = None

    def touch(self, key: str) -> None:
        self._order.move_to_end(key)

    def remove(self, key: str, evicted: bool = False) -> None:
        del self._order[key]

    def victim(self) -> str | None:
        return next(iter(self._order), None)

    def order(self, limit: int | None = None) -> list[str]:
        return list(islice(self._order, limit))

    def keys(self) -> set[str]:
        return set(self._order)

    def __len__(self) -> int:
        return len(self._order)


class FIFO(LRU):
    """First in, first out: insertion order; a hit changes nothing."""

    name = "fifo"

    def touch(self, key: str) -> None:
        pass


class LFU:
    """Least frequently used, oldest first among equals: O(1) frequency buckets.

    `_freq[key]` is the key's hit count + 1; `_buckets[f]` holds keys of frequency f in the order
    they reached it. `_min` is the lowest non-empty frequency (recomputed lazily on removal).
    """

    name = "lfu"

    def __init__(self) -> None:
        self._freq: dict[str, int] = {}
        self._buckets: dict[int, OrderedDict[str, None]] = {}
        self._min = 0

    def insert(self, key: str, freq: int = 1) -> None:
        self._freq[key] = freq
        self._buckets.setdefault(freq, OrderedDict())[key] = None
        if self._min == 0 or freq < self._min:
            self._min = freq

    def touch(self, key: str) -> None:
        f = self._freq[key]
        self._unlink(key, f)
        self._freq[key] = f + 1
        self._buckets.setdefault(f + 1, OrderedDict())[key] = None
        if self._min == 0 or f + 1 < self._min:
            self._min = f + 1

    def _unlink(self, key: str, f: int) -> None:
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
            if f == self._min:
                self._min = min(self._buckets, default=0)

    def remove(self, key: str, evicted: bool = False) -> None:
        self._unlink(key, self._freq.pop(key))

    def victim(self) -> str | None:
        if not self._freq:
            return None
        return next(iter(self._buckets[self._min]))

    def order(self, limit: int | None = None) -> list[str]:
        out: list[str] = []
        for f in sorted(self._buckets):
            out.extend(self._buckets[f])
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out

    def keys(self) -> set[str]:
        return set(self._freq)

    def __len__(self) -> int:
        return len(self._freq)


class S3FIFO:
    """S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO, a main FIFO and a ghost list.

    New keys enter `small` (or `main` when the ghost remembers them). Eviction takes from `small`
    while it holds at least SMALL_SHARE of the keys: a key hit there since insertion is promoted
    to `main`, otherwise it is the victim (and remembered in `ghost`). From `main`, a key with
    hits left is reinserted with one hit fewer (a CLOCK-like second chance); otherwise it is the
    victim. Hit counts saturate at 3. `victim()` performs those promotions so that its answer is
    the key `remove(key, evicted=True)` will take next.
    """

    name = "s3fifo"
    SMALL_SHARE = 0.1
    MAX_FREQ = 3

    def __init__(self) -> None:
        self._small: OrderedDict[str, None] = OrderedDict()
        self._main: OrderedDict[str, None] = OrderedDict()
        self._ghost: OrderedDict[str, None] = OrderedDict()
        self._freq: dict[str, int] = {}

    def insert(self, key: str) -> None:
        self._freq[key] = 0
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = None
        else:
            self._small[key] = None

    def touch(self, key: str) -> None:
        f = self._freq[key]
        if f < self.MAX_FREQ:
            self._freq[key] = f + 1

    def remove(self, key: str, evicted: bool = False) -> None:
        del self._freq[key]
        if key in self._small:
            del self._small[key]
            if evicted:
                self._ghost[key] = None
                while len(self._ghost) > max(len(self._main), 1):
                    self._ghost.popitem(last=False)
        else:
            del self._main[key]

    def victim(self) -> str | None:
        if not self._freq:
            return None
        freq, small, main = self._freq, self._small, self._main
        while True:
            if small and (len(small) >= self.SMALL_SHARE * len(freq) or not main):
                key = next(iter(small))
                if freq[key] > 0:  # re-accessed while on probation: promote
                    del small[key]
                    freq[key] = 0
                    main[key] = None
                    continue
                return key
            key = next(iter(main))
            if freq[key] > 0:  # second chance
                freq[key] -= 1
                main.move_to_end(key)
                continue
            return key

    def order(self, limit: int | None = None) -> list[str]:
        """Eviction order, by running the policy on a copy."""
        sim = S3FIFO()
        sim._small, sim._main = OrderedDict(self._small), OrderedDict(self._main)
        sim._freq, sim._ghost = dict(self._freq), OrderedDict()
        out: list[str] = []
        n = len(self._freq) if limit is None else min(limit, len(self._freq))
        while len(out) < n:
            key = sim.victim()
            sim.remove(key, evicted=False)
            out.append(key)
        return out

    def keys(self) -> set[str]:
        return set(self._freq)

    def __len__(self) -> int:
        return len(self._freq)


MODEL_POLICIES: dict[str, type] = {"lru": LRU, "fifo": FIFO, "lfu": LFU, "s3fifo": S3FIFO}
