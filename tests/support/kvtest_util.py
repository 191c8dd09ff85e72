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


def prefix_churn(pool, rec, steps: int, each=None) -> None:
    """Shared prompts opened and closed at random on a prefix-caching pool (hits, misses and
    evictions), `rec` (a Recorder) flushed every 30 steps; `each()` after every step."""
    from allocator import OutOfMemory

    rng, seqs = random.Random(3), []
    for i in range(steps):
        try:
            if rng.random() < 0.55 or not seqs:
                tokens = [7, 7, 7, 7, 1, 2, 3, 4][: rng.choice([0, 4, 8])] + [rng.randint(0, 40) for _ in range(5)]
                seqs.append(pool.open_sequence(tokens=tokens).id)
            else:
                pool.close_sequence(seqs.pop(rng.randrange(len(seqs))))
        except OutOfMemory:
            pass
        if i % 30 == 29:
            rec.flush()
        if each is not None:
            each()


def block_past_the_map(path) -> None:
    """Rewrite the recording at `path` so that one allocation early in it names a block past the
    map: the file still reads (meta, keyframes, segments whole), its events do not replay."""
    import sqlite3

    from allocator.history import Segment

    db = sqlite3.connect(path)
    first, last, blob = db.execute("SELECT first, last, blob FROM segments ORDER BY first LIMIT 1").fetchone()
    rows = Segment(first, last, blob).rows()
    i = next(i for i, r in enumerate(rows) if r[2] == "allocate")
    rows[i] = rows[i][:7] + (10**6,) + rows[i][8:]
    db.execute("UPDATE segments SET blob = ? WHERE first = ?", (Segment.pack(rows).blob, first))
    db.commit()
    db.close()
