"""Bélády's MIN: the offline optimum of cache replacement, as the upper bound of a policy study.

`min_hits` is the classic unit-size MIN: on a miss with a full cache, evict the key whose next
use lies furthest in the future (never-again first). For equal-size entries and demand caching
(every miss is inserted, as `KVCache` does) it is optimal: no policy gets more hits on the same
stream and capacity.

`sized_min_hits` is a size-aware variant for entries of different sizes: evict furthest next use
first until the entry fits. It is a heuristic, NOT a proven bound: with variable sizes the exact
optimum is NP-hard, and a policy can in principle beat this greedy rule.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def next_uses(keys: Sequence) -> list[int]:
    """next_uses[i]: index of the next access to keys[i] after i, or len(keys) if none."""
    n = len(keys)
    out = [n] * n
    last: dict = {}
    for i in range(n - 1, -1, -1):
        k = keys[i]
        out[i] = last.get(k, n)
        last[k] = i
    return out


def min_hits(keys: Sequence, capacity: int) -> int:
    """Hits of Bélády's MIN with room for `capacity` equal-size entries."""
    if capacity <= 0:
        return 0
    nxt = next_uses(keys)
    cached: dict = {}  # key -> its next use (the heap holds stale pairs too; this is the truth)
    heap: list[tuple[int, int]] = []  # (-next use, access index of the key's last use)
    hits = 0
    for i, k in enumerate(keys):
        if k in cached:
            hits += 1
        elif len(cached) >= capacity:
            while True:
                neg, j = heapq.heappop(heap)
                victim = keys[j]
                if cached.get(victim) == -neg:
                    del cached[victim]
                    break
        cached[k] = nxt[i]
        heapq.heappush(heap, (-nxt[i], i))
    return hits


def sized_min_hits(keys: Sequence, sizes: Sequence[int], capacity: int) -> int:
    """Hits of the size-aware MIN heuristic: `sizes[i]` is the entry's size after access i
    (an entry may grow); evict furthest next use first until it fits; bypass if it never can."""
    nxt = next_uses(keys)
    cached: dict = {}  # key -> (next use, size)
    heap: list[tuple[int, int]] = []
    used = hits = 0
    for i, k in enumerate(keys):
        size = sizes[i]
        old = cached.pop(k, None)
        if old is not None:
            hits += 1
            used -= old[1]
        if size > capacity:
            continue
        while used + size > capacity:
            neg, j = heapq.heappop(heap)
            victim = keys[j]
            entry = cached.get(victim)
            if entry is not None and entry[0] == -neg:
                del cached[victim]
                used -= entry[1]
        cached[k] = (nxt[i], size)
        used += size
        heapq.heappush(heap, (-nxt[i], i))
    return hits
