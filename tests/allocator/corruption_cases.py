"""Corruption cases for the compiled structures, run by test_core_corruption.

    python tests/allocator/corruption_cases.py STRUCTURE FIRST COUNT

STRUCTURE is paged, prefix, cache, ring or links (the paged chain links alone). Cases run in
forked children, so a crash ends a child, not the run, and is reported as CRASH for the case it
hit (with --each, every case runs in a child of its own). Each case builds a busy structure
from its own seed, checks it is sound, overwrites one field
(an array element or a scalar) with an in-range or out-of-range value (-1, n, 2**31-1, -2**31,
or a random index) and calls check(). Printed, one line per case:

    OK i k      check() returned k problems (all strings), and the follow-up held
    FAIL i why
    CRASH i signal s

A write the structure never reads (a link of a block never handed out, a field of an unused
record slot) must leave check() clean; any other write must make it report a problem. A clean
check() is then held to its word: a follow-up workload (free and refill everything) must run
and leave check() clean.
"""

from __future__ import annotations

import os
import random
import sys
import traceback

import numpy as np

from allocator import CorruptState, KVCache, NotFound, OutOfMemory, PrefixOutOfMemory, create_pool
from allocator.pools.paged import PagedPool
from allocator.prefix.prefix import PrefixPool

I32_EDGES = (-1, 2**31 - 1, -(2**31))
BB = 64


def values_for(rng: random.Random, n: int) -> list[int]:
    """-1, n, 2**31-1, -2**31 and an in-range index, in a random order."""
    return [-1, n, 2**31 - 1, -(2**31), rng.randrange(n)]


def write(arr: np.ndarray, i: int, value: int) -> int:
    """arr[i] = value as the array's type stores it (wrapping like a C store); returns the old value."""
    old = int(arr[i])
    arr[i] = np.array(value, dtype=np.int64).astype(arr.dtype)
    return old


def stored(arr: np.ndarray, value: int) -> int:
    return int(np.array(value, dtype=np.int64).astype(arr.dtype))


# -- paged core: chain links, free chain, records, id table ----------------------------------
def busy_paged(rng: random.Random) -> PagedPool:
    pool = create_pool("paged", num_blocks=rng.choice((16, 48, 100)), block_bytes=BB, device="cpu",
                       event_capacity=64)
    ids = []
    for _ in range(rng.randrange(4, 40)):
        if ids and rng.random() < 0.35:
            pool.free(ids.pop(rng.randrange(len(ids))))
        else:
            try:
                ids.append(pool.allocate(rng.randint(1, 5 * BB)))
            except OutOfMemory:
                pass
    if ids and rng.random() < 0.5 and pool.num_blocks - pool.used_blocks > 2:
        pool.extend(ids[0], rng.randint(1, 2 * BB))
    return pool


def corrupt_paged(rng: random.Random, pool: PagedPool) -> bool | None:
    """One write. True: the core reads what it overwrote, so check() must object; False: it
    never reads it (check() must stay clean); None: either may be right."""
    core = pool._core
    raw = core._raw()
    live_slots = set(np.flatnonzero(raw["aid"] > 0).tolist())
    field = rng.choice(("next", "next", "next", "htab", "aid", "req", "head", "tail", "n",
                        "free_head", "fresh", "free_count", "live", "slot_free", "rcap"))
    if field in raw:
        arr = raw[field]
        i = rng.randrange(arr.size)
        value = rng.choice(values_for(rng, arr.size))
        old = write(arr, i, value)
        if old == stored(arr, value):
            return False
        if field == "next":
            return i < core.fresh  # a block never handed out has no link yet
        if field in ("req", "head", "n"):
            return i in live_slots  # an unused slot's fields are rewritten when it is reused
        return True  # aid (0 marks unused), tail (the unused-slot chain), the id table
    value = rng.choice(values_for(rng, pool.num_blocks) + [rng.randrange(-2, 70)])
    return core._poke(field, value) != value


def follow_up_paged(rng: random.Random, pool: PagedPool) -> None:
    for aid in pool.ids():
        pool.free(aid)
    ids = []
    while True:
        try:
            ids.append(pool.allocate(rng.randint(1, 3 * BB)))
        except OutOfMemory:
            break
    assert pool.check() == [], pool.check()
    pool.free_many(ids[::2])
    pool.allocate_many([BB] * (len(ids[::2]) // 2))
    assert pool.check() == [], pool.check()


# -- prefix core: reference counts, hash index, eviction lists / heap, free stack ------------
def busy_prefix(rng: random.Random) -> PrefixPool:
    policy = rng.choice(("lru", "fifo", "lfu", "s3fifo", "belady"))
    n = rng.choice((24, 64))
    pool = create_pool("paged", num_blocks=n, block_bytes=BB, device="cpu", tokens_per_block=4,
                       prefix_caching={"policy": policy}, event_capacity=64)
    open_ids = []
    prompts = [[rng.randrange(50) for _ in range(rng.randint(4, 24))] for _ in range(6)]
    for _ in range(rng.randrange(6, 30)):
        r = rng.random()
        if open_ids and r < 0.4:
            pool.close_sequence(open_ids.pop(rng.randrange(len(open_ids))))
            continue
        tokens = rng.choice(prompts) + [rng.randrange(50) for _ in range(rng.randint(0, 9))]
        try:
            open_ids.append(pool.open_sequence(tokens=tokens).id)
            if r > 0.9:
                pool.allocate(rng.randint(1, 2 * BB))
        except (PrefixOutOfMemory, OutOfMemory):
            if open_ids:
                pool.close_sequence(open_ids.pop(0))
    return pool


def corrupt_prefix(rng: random.Random, pool: PrefixPool) -> bool:
    core = pool.core
    raw = core._raw()
    n = pool.num_blocks
    evictable = set(core.evictable_blocks())
    heap_policy = pool.policy in ("fifo", "lfu", "belady")
    field = rng.choice(("refcnt", "hash", "hashed", "where", "prev", "next", "heap", "hpos",
                        "free_stack", "queue", "index", "top", "heap_size", "n_evictable",
                        "list0.head", "list0.tail", "list0.size", "list1.head", "list1.size"))
    if field == "index":
        if core.index and rng.random() < 0.7:
            h = rng.choice(list(core.index))
            value = rng.choice(values_for(rng, n))
            old = core.index[h]
            core.index[h] = value
            return old != value
        core.index[rng.getrandbits(64)] = rng.choice(values_for(rng, n))
        return True
    if field in raw:
        arr = raw[field]
        i = rng.randrange(arr.size)
        value = rng.choice(values_for(rng, n))
        old = write(arr, i, value)
        new = int(arr[i])
        if old == new:
            return False
        if field == "hash":
            return bool(raw["hashed"][i])
        if field == "hashed":
            return bool(old) != bool(new)
        if field in ("prev", "next"):
            return i in evictable and not heap_policy
        if field == "heap":
            return heap_policy and i < len(evictable)
        if field == "hpos":
            return heap_policy and i in evictable
        if field == "free_stack":
            return i < core.free_top
        if field == "queue":
            return pool.policy == "s3fifo" and (i in evictable or new > 1)
        return True  # refcnt, where
    value = rng.choice(values_for(rng, n))
    return core._poke(field, value) != value


def follow_up_prefix(rng: random.Random, pool: PrefixPool) -> None:
    for sid in list(pool._seqs):
        pool.close_sequence(sid)
    for aid in list(pool._allocs):
        pool.free(aid)
    assert pool.check() == [], pool.check()
    opened = []
    base = [rng.randrange(50) for _ in range(8)]
    for k in range(3 * pool.num_blocks // 4):
        try:
            opened.append(pool.open_sequence(tokens=base + [k, k + 1, k + 2, k + 3]).id)
        except PrefixOutOfMemory:
            pool.close_sequence(opened.pop(0))
    assert pool.check() == [], pool.check()
    for sid in opened:
        pool.close_sequence(sid)
    assert pool.check() == [], pool.check()


# -- the cache's policy slots and its entries' slots -----------------------------------------
def busy_cache(rng: random.Random) -> KVCache:
    pool = create_pool("paged", num_blocks=rng.choice((16, 40)), block_bytes=BB, device="cpu",
                       event_capacity=64)
    cache = KVCache(pool, policy=rng.choice(("lru", "fifo", "lfu", "s3fifo")))
    for _ in range(rng.randrange(8, 60)):
        key = f"k{rng.randrange(30)}"
        r = rng.random()
        if r < 0.3:
            cache.get(key)
        elif r < 0.4 and key in cache._entries:
            cache.remove(key)
        else:
            try:
                cache.put(key, rng.randint(1, 3 * BB), priority=rng.choice((None, 0, 1)))
            except OutOfMemory:
                pass
    return cache


def corrupt_cache(rng: random.Random, cache: KVCache) -> bool:
    structs = list(cache._by_priority.values())
    entries = [e for e in cache._entries.values() if not e.pinned]
    if entries and rng.random() < 0.2:
        e = rng.choice(entries)
        value = rng.choice(values_for(rng, 64))
        return e._poke("pslot", value) != value
    s = rng.choice(structs)
    raw = s._raw()
    field = rng.choice([*raw, *raw, "unused", "count", "list0.head", "list0.tail", "list0.size"])
    held = {i for i in range(len(raw["next"])) if s.key_at(i) is not None}
    if field in raw:
        arr = raw[field]
        i = rng.randrange(arr.size)
        value = rng.choice(values_for(rng, arr.size))
        old = write(arr, i, value)
        if old == int(arr[i]):
            return False
        if field == "next":
            return True  # a held key's list link, or an unused slot's link in the unused chain
        if field in ("prev", "freq", "in_small"):
            return i in held and not (field == "in_small" and bool(old) == bool(int(arr[i])))
        return False  # s3fifo hit counts: any value is a valid count
    value = rng.choice(values_for(rng, len(raw["next"])))
    return s._poke(field, value) != value


def follow_up_cache(rng: random.Random, cache: KVCache) -> None:
    for _ in range(60):
        key = f"f{rng.randrange(40)}"
        if rng.random() < 0.3:
            cache.get(key)
        else:
            cache.put(key, rng.randint(1, 3 * BB))
    assert cache.check() == [], cache.check()
    assert cache.pool.check() == [], cache.pool.check()
    cache.clear()


# -- the event ring ---------------------------------------------------------------------------
def busy_ring(rng: random.Random):
    cache = busy_cache(rng)
    pool = cache.pool
    if pool.used_blocks < pool.num_blocks:  # a Python-recorded event too
        pool.set_state(pool.allocate(BB), 3)
    return cache


def corrupt_ring(rng: random.Random, cache) -> bool:
    ring = cache.pool.events
    raw = ring._raw()
    field = rng.choice(("kind", "kind", "bn", "bn", "boff", "boff", "vals", "bring", "ts",
                        "count", "last_seq", "bpos"))
    if field in raw:
        arr = raw[field]
        i = rng.randrange(arr.size)
        if field in ("kind", "bn", "boff") and len(ring):  # mostly an event the ring holds
            i = (ring.last_seq - rng.randrange(len(ring)) - 1) % ring.capacity
        write(arr, i, rng.choice(values_for(rng, arr.size)))
    else:
        ring._poke(field, rng.choice(values_for(rng, ring.capacity) + [rng.randrange(200)]))
    return None  # many writes are harmless (an old event's values): check() judges alone


def follow_up_ring(rng: random.Random, cache) -> None:
    ring = cache.pool.events
    ring.after(0, limit=10_000, block_ids=True)
    ring.raw_after(0)
    ring.export(0)
    ring.record("oom", 1, 2, 3, "capacity")
    assert ring.check() == [], ring.check()


STRUCTURES = {
    "paged": (busy_paged, corrupt_paged, lambda c: c.check(), follow_up_paged),
    "prefix": (busy_prefix, corrupt_prefix, lambda c: c.check(), follow_up_prefix),
    "cache": (busy_cache, corrupt_cache, lambda c: c.check(), follow_up_cache),
    "ring": (busy_ring, corrupt_ring, lambda c: c.pool.events.check(), follow_up_ring),
}


def run_case(structure: str, seed: int) -> str:
    build, corrupt, check, follow_up = STRUCTURES[structure]
    rng = random.Random(f"{structure}-{seed}")
    thing = build(rng)
    before = check(thing)
    if before:
        return f"FAIL {seed} sound before the write, yet check() says {before[:2]}"
    if structure == "ring" and thing.pool.events.check():
        return f"FAIL {seed} the ring is unsound before the write"
    harmful = corrupt(rng, thing)
    problems = check(thing)
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        return f"FAIL {seed} check() returned {problems!r}"
    if harmful and not problems:
        return f"FAIL {seed} a harmful write left check() clean"
    if problems and harmful is False:
        return f"FAIL {seed} a write the structure never reads made check() report {problems[:2]}"
    if not problems:
        try:
            follow_up(rng, thing)
        except (AssertionError, CorruptState, NotFound, KeyError, IndexError, ValueError) as e:
            return f"FAIL {seed} check() was clean but the follow-up failed: {e!r}"
    return f"OK {seed} {len(problems)}"


def links_case(seed: int) -> str:
    """The paged core's chain links alone: one random link of a handed-out block overwritten."""
    rng = random.Random(f"links-{seed}")
    pool = busy_paged(rng)
    links = pool._core._raw()["next"]
    b = rng.randrange(max(pool._core.fresh, 1))
    old = write(links, b, rng.choice(values_for(rng, pool.num_blocks) + [rng.randrange(pool.num_blocks)]))
    problems = pool.check()
    if not all(isinstance(p, str) for p in problems):
        return f"FAIL {seed} check() returned {problems!r}"
    if int(links[b]) != old and b < pool._core.fresh and not problems:
        return f"FAIL {seed} a broken link left check() clean"
    return f"OK {seed} {len(problems)}"


def one_case(structure: str, seed: int) -> str:
    try:
        return links_case(seed) if structure == "links" else run_case(structure, seed)
    except Exception:  # check() must answer, never raise
        return f"FAIL {seed} raised: " + traceback.format_exc(limit=4).replace("\n", " | ")


def run_forked(structure: str, first: int, end: int, each: bool) -> tuple[list[str], int]:
    """Run cases first.. in a forked child (one case only when `each`) until it finishes or
    dies; (its lines, its wait status). The child writes each line as its case ends, so a
    crash is pinned on the case after the last line."""
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        out = os.fdopen(write_end, "w", buffering=1)
        for seed in range(first, first + 1 if each else end):
            out.write(one_case(structure, seed) + "\n")
            out.flush()
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    return lines, os.waitpid(pid, 0)[1]


def main() -> None:
    """Cases run in forked children: a crash ends its child, is reported as CRASH with the
    case it hit, and the next child carries on after it. With --each, every case gets a
    child of its own (a fork costs tens of milliseconds with torch loaded, a case about 3)."""
    structure, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    each = "--each" in sys.argv[4:]
    seed, end = first, first + count
    while seed < end:
        lines, status = run_forked(structure, seed, end, each)
        for line in lines:
            print(line, flush=True)
        seed += len(lines)
        if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            print(f"CRASH {seed} {how}", flush=True)
            seed += 1


if __name__ == "__main__":
    main()
