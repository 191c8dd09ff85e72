"""Shared helpers of the allocator tests: a fake clock, payloads and whole-state snapshots."""

from __future__ import annotations

import random
import zlib

from allocator import Pool

# Counters that legitimately change on a refused request (an OOM is counted and logged).
VOLATILE_STATS = ("counters", "ooms", "last_event_seq", "cache")


class FakeClock:
    """A monotonic clock the test moves by hand (TTL tests never sleep)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def payload(nbytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def crc(data: bytes) -> int:
    return zlib.crc32(data)


def stable_stats(pool: Pool) -> dict:
    """`pool.stats()` without the fields a refused request may legitimately bump."""
    return {k: v for k, v in pool.stats().items() if k not in VOLATILE_STATS}


def pool_snapshot(pool: Pool) -> dict:
    """Everything observable about a pool's layout and contents, for before/after comparisons."""
    cache = pool.cache
    snap = {
        "stats": stable_stats(pool),
        "owner": bytes(pool.blockmap.owner),
        "state": bytes(pool.blockmap.state),
        "allocations": {aid: pool.allocation(aid).to_dict() for aid in pool.ids()},
        "data": {aid: crc(pool.read(aid)) for aid in pool.ids()},
    }
    if cache is not None:
        snap["entries"] = [e.key for e in cache.entries()]
        snap["entry_ids"] = {e.key: (e.id, e.nbytes, e.priority, e.pinned) for e in cache.entries()}
        stats = cache.stats()
        snap["cache"] = {k: stats[k] for k in ("used_bytes", "pinned_bytes", "entries", "policy")}
    return snap


def free_runs_of(owner: list[int]) -> list[int]:
    """Lengths of maximal runs of free (-1) cells, in address order."""
    runs, n = [], 0
    for o in owner:
        if o == -1:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    if n:
        runs.append(n)
    return runs


def histogram(lengths: list[int]) -> dict[str, int]:
    """Power-of-two size classes written out by hand: 1, 2-3, 4-7, 8-15, ..."""
    out: dict[str, int] = {}
    for n in lengths:
        lo = 1 << (n.bit_length() - 1)
        hi = 2 * lo - 1
        label = str(lo) if lo == hi else f"{lo}-{hi}"
        out[label] = out.get(label, 0) + 1
    return out
