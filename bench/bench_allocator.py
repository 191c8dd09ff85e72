"""Allocator core benchmark: kvscope against vLLM 0.33.0's BlockPool, side by side in one process.

1. M blocks/s per path, kvscope and vLLM interleaved run by run (gc on), median of RUNS:
   single-block allocate+free, 16-block, churn of 1-32-block requests with about half the pool
   live, and cache puts that evict on every put (1- and 16-block entries, a 4,096-block
   budget; and 1-block entries in a 65,536-block budget). vLLM is driven as
   its KV-cache manager drives it (`bench/vllm_baseline.py`): `get_new_blocks(n)`,
   `free_blocks` in reverse, and with caching on `cache_full_blocks` with precomputed hashes,
   so that every allocation evicts cached blocks. Ratio kvscope / vLLM per path (aim >= 3x).
2. Host metadata bytes per block of a 1,000,000-block pool full of 16-block allocations,
   measured with tracemalloc (everything the pool allocates except the tensor's storage), and
   the time to create that pool (aim <= 16 B, <= 10 ms); the same for vLLM's BlockPool.
3. Defragmentation copy bandwidth versus one contiguous `copy_` of the same bytes.

Without the vLLM wheel (see bench/vllm_baseline.py) the vLLM columns say why and kvscope runs
alone. Other benches reuse `Row`, `run_rows` and `print_rows` for their own paths.

Run: python -m bench allocator   (KVSCOPE_BENCH_RUNS=5 for more runs; about a minute at 3;
KVSCOPE_BENCH_ROWS=cache_evict_big for one throughput row alone).
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from allocator import KVCache, create_pool
from bench import vllm_baseline
from bench.quick import sized

POOL_BLOCKS = sized(1_000_000, 65_536)
BLOCK = 16  # bytes per block: the tensor is irrelevant to the bookkeeping measured here
RUNS = int(os.environ.get("KVSCOPE_BENCH_RUNS", sized("3", "1")))
MOVED = sized(1_000_000, 20_000)  # blocks moved per workload on the pool paths
CACHE_MOVED = sized(200_000, 5_000)  # on the cache paths (vLLM's 1-block evicting put is ~5 us)
CACHE_BLOCKS = 4_096  # cache budget in blocks, as the bench has always used (and vLLM's pool)
BIG_CACHE_BLOCKS = 65_536  # the same with 16x the entries: every structure out of the CPU caches
AIM_RATIO = 3.0
# KVSCOPE_BENCH_ROWS=cache_evict_big,churn measures those throughput rows alone (keys in rows()).
ONLY = {k for k in os.environ.get("KVSCOPE_BENCH_ROWS", "").split(",") if k}

# A workload factory builds its state (untimed) and returns a step function and the blocks
# the timed call moves.
Workload = Callable[[], tuple[Callable[[], None], int]]


@dataclass
class Row:
    """One compared path: the same workload for kvscope and for vLLM (None: no counterpart)."""

    key: str
    label: str
    kvscope: Workload
    vllm: Workload | None
    kv_rates: list[float] = field(default_factory=list)
    vllm_rates: list[float] = field(default_factory=list)


def timed(workload: Workload) -> float:
    """Blocks/s of one timed call of the workload's step (gc on, as in a server)."""
    step, blocks = workload()
    gc.collect()
    t0 = time.perf_counter()
    step()
    return blocks / (time.perf_counter() - t0)


def run_rows(rows: list[Row], runs: int = RUNS, vllm: bool = True) -> list[Row]:
    """Measure every row `runs` times, kvscope and vLLM alternating which goes first."""
    for r in range(runs):
        for row in rows:
            sides = [("kv", row.kvscope)] + ([("vllm", row.vllm)] if vllm and row.vllm else [])
            if r % 2:
                sides.reverse()
            for side, workload in sides:
                rate = timed(workload)
                (row.kv_rates if side == "kv" else row.vllm_rates).append(rate)
    return rows


def print_rows(rows: list[Row], vllm_note: str = "") -> dict:
    out = {}
    print(f"{'path (M blocks/s, median)':46s} {'kvscope':>9s} {'vLLM':>9s} {'ratio':>8s}"
          "  (ratio: median of the per-run ratios)")
    for row in rows:
        kv = statistics.median(row.kv_rates)
        if row.vllm_rates:
            vl = statistics.median(row.vllm_rates)
            # Each run measures both sides back to back: the median of the per-run ratios is
            # steadier than a ratio of medians when the machine's load drifts between runs.
            ratio = statistics.median(k / v for k, v in zip(row.kv_rates, row.vllm_rates))
            mark = "met" if ratio >= AIM_RATIO else "MISSED"
            print(f"{row.label:46s} {kv / 1e6:9.2f} {vl / 1e6:9.2f} {ratio:7.2f}x  (aim >= "
                  f"{AIM_RATIO:.0f}x: {mark}; runs kvscope {fmt(row.kv_rates)}, vLLM {fmt(row.vllm_rates)})")
            out[row.key] = {"kvscope": kv, "vllm": vl, "ratio": ratio}
        else:
            print(f"{row.label:46s} {kv / 1e6:9.2f} {'-':>9s} {'-':>8s}  {vllm_note}")
            out[row.key] = {"kvscope": kv}
    return out


def fmt(rates: list[float]) -> str:
    return "/".join(f"{r / 1e6:.2f}" for r in rates)


# -- kvscope workloads ---------------------------------------------------------------------
def kv_pool():
    # With its event history, as the server keeps every pool it serves.
    return create_pool("paged", num_blocks=POOL_BLOCKS, block_bytes=BLOCK, device="cpu", history=True)


def kv_alloc_free(blocks_per_op: int) -> Workload:
    def build():
        pool = kv_pool()
        alloc, free, size, n = pool.allocate, pool.free, blocks_per_op * BLOCK, MOVED // blocks_per_op

        def step():
            for _ in range(n):
                free(alloc(size))
        return step, n * blocks_per_op
    return build


def churn_plan(seed: int = 42) -> tuple[list[int], list[int], list[int]]:
    """(sizes that fill about half the pool, then per step: the live slot freed and the new
    request's size), drawn once so kvscope and vLLM replay the same requests."""
    rng = random.Random(seed)
    fill, total = [], 0
    while total < POOL_BLOCKS // 2:
        fill.append(rng.randint(1, 32))
        total += fill[-1]
    victims, sizes, moved = [], [], 0
    while moved < MOVED:
        victims.append(rng.randrange(len(fill)))
        sizes.append(rng.randint(1, 32))
        moved += sizes[-1]
    return fill, victims, sizes


PLAN = churn_plan()


def kv_churn() -> tuple[Callable[[], None], int]:
    pool = kv_pool()
    fill, victims, sizes = PLAN
    alloc, free = pool.allocate, pool.free
    live = [alloc(s * BLOCK) for s in fill]

    def step():
        for j, s in zip(victims, sizes):
            free(live[j])
            live[j] = alloc(s * BLOCK)
    return step, sum(sizes)


def kv_cache(entry_blocks: int, budget: int = CACHE_BLOCKS) -> Workload:
    def build():
        pool = create_pool("paged", num_blocks=2 * budget, block_bytes=BLOCK, device="cpu", history=True)
        cache = KVCache(pool, budget * BLOCK, "lru")
        size, n = entry_blocks * BLOCK, CACHE_MOVED // entry_blocks
        for i in range(budget // entry_blocks):
            cache.put(f"warm{i}", size)
        keys = [f"k{i}" for i in range(n)]
        put = cache.put

        def step():
            for k in keys:
                put(k, size)
        return step, n * entry_blocks
    return build


# -- vLLM workloads (same shapes) -------------------------------------------------------------
def vllm_alloc_free(blocks_per_op: int) -> Workload:
    def build():
        d = vllm_baseline.VllmDriver(POOL_BLOCKS)
        alloc, free, n = d.allocate, d.free, MOVED // blocks_per_op

        def step():
            for _ in range(n):
                free(alloc(blocks_per_op))
        return step, n * blocks_per_op
    return build


def vllm_churn() -> tuple[Callable[[], None], int]:
    d = vllm_baseline.VllmDriver(POOL_BLOCKS)
    fill, victims, sizes = PLAN
    alloc, free = d.allocate, d.free
    live = [alloc(s) for s in fill]

    def step():
        for j, s in zip(victims, sizes):
            free(live[j])
            live[j] = alloc(s)
    return step, sum(sizes)


def vllm_cache(entry_blocks: int, budget: int = CACHE_BLOCKS) -> Workload:
    """Prefix caching on, pool of exactly the cache budget: every allocation takes blocks from
    the free queue's head, which hold cached hashes, so each one evicts."""
    def build():
        d = vllm_baseline.VllmDriver(budget, caching=True)
        n = CACHE_MOVED // entry_blocks
        for _ in range(budget // entry_blocks):
            d.free(d.allocate(entry_blocks, d.hashes(entry_blocks)))
        requests = [d.hashes(entry_blocks) for _ in range(n)]
        alloc, free = d.allocate, d.free

        def step():
            for req in requests:
                free(alloc(entry_blocks, req))
        return step, n * entry_blocks
    return build


def rows() -> list[Row]:
    return [
        Row("single", "single-block allocate+free", kv_alloc_free(1), vllm_alloc_free(1)),
        Row("batch16", "16-block allocate+free", kv_alloc_free(16), vllm_alloc_free(16)),
        Row("churn", "churn 1-32 blocks, ~half the pool live", kv_churn, vllm_churn),
        Row("cache_evict", "cache put evicting every time, 1-block entries", kv_cache(1),
            vllm_cache(1)),
        Row("cache_evict16", "  the same, 16-block entries", kv_cache(16), vllm_cache(16)),
        Row("cache_evict_big", f"  1-block entries, {BIG_CACHE_BLOCKS:,}-block budget",
            kv_cache(1, BIG_CACHE_BLOCKS), vllm_cache(1, BIG_CACHE_BLOCKS)),
    ]


# -- memory and creation ---------------------------------------------------------------------
def traced_bytes(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes tracemalloc sees allocated (and still held) by `build()`, and its result."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used, obj


def metadata(with_vllm: bool) -> dict:
    n = POOL_BLOCKS

    def kv_full():
        pool = kv_pool()
        ids = pool.allocate_many([16 * BLOCK] * (n // 16))
        return pool, ids

    kv_bytes, kept = traced_bytes(kv_full)
    ids_bytes = sys.getsizeof(kept[1]) + sum(sys.getsizeof(i) for i in kept[1])  # the caller's list
    kv_b = (kv_bytes - ids_bytes) / n
    del kept
    creates = []
    for _ in range(sized(5, 1)):
        gc.collect()
        t0 = time.perf_counter()
        pool = kv_pool()
        creates.append(time.perf_counter() - t0)
        del pool
    create_s = statistics.median(creates)
    out = {"bytes_per_block_full16": kv_b, "create_s": create_s}
    vl_line = ""
    if with_vllm:
        def vl_full():
            d = vllm_baseline.VllmDriver(n)
            held = [d.allocate(16) for _ in range(n // 16)]  # what the manager keeps per request
            return d, held

        vl_bytes, kept = traced_bytes(vl_full)
        del kept
        gc.collect()
        t0 = time.perf_counter()
        d = vllm_baseline.VllmDriver(n)
        vl_create = time.perf_counter() - t0
        del d
        out.update(vllm_bytes_per_block_full16=vl_bytes / n, vllm_create_s=vl_create)
        vl_line = f"; vLLM BlockPool {vl_bytes / n:.1f} B/block, created in {vl_create * 1e3:.0f} ms"
    print(f"metadata, 1M-block pool full of 16-block allocations (tracemalloc, tensor excluded): "
          f"{kv_b:.2f} B/block (aim <= 16: {'met' if kv_b <= 16 else 'MISSED'}){vl_line}")
    print(f"create a 1M-block pool: {create_s * 1e3:.1f} ms median of 5 (aim <= 10 ms: "
          f"{'met' if create_s <= 0.010 else 'MISSED'})")
    return out


def defrag_bandwidth() -> dict:
    """Compaction of a pool with every other block live, KV-sized blocks (64 KiB, 128 MiB pool):
    the copy alone and the whole defragment() call, against one contiguous copy_ of the same
    bytes into touched memory (a memcpy: the ceiling), same run; best of 5 each."""
    blocks, bb = sized(2048, 256), 64 * 1024
    copy_bw = total_bw = ref = 0.0
    for _ in range(sized(5, 1)):
        pool = create_pool("paged", num_blocks=blocks, block_bytes=bb, device="cpu", history=True)
        pool.storage.data.fill_(1)
        ids = [pool.allocate(bb) for _ in range(blocks)]
        for aid in ids[::2]:
            pool.free(aid)  # ~50% live, every other block
        report = pool.defragment()
        copy_bw = max(copy_bw, report.moved_bytes / report.copy_seconds / 1e9)
        total_bw = max(total_bw, report.moved_bytes / report.seconds / 1e9)
        src = pool.storage.data[blocks - report.moved_blocks:]
        out = torch.empty_like(src)
        out.fill_(0)
        t0 = time.perf_counter()
        out.copy_(src)
        ref = max(ref, report.moved_bytes / (time.perf_counter() - t0) / 1e9)
    print(f"defragment: {report.moved_bytes / 2**20:.0f} MiB moved in {report.moved_blocks} blocks of "
          f"{bb // 1024} KiB; copy {copy_bw:.2f} GB/s, whole call {total_bw:.2f} GB/s; "
          f"contiguous copy_ of the same bytes {ref:.2f} GB/s; ratio copy/memcpy {copy_bw / ref:.2f}")
    return {"defrag_copy_gbps": copy_bw, "defrag_call_gbps": total_bw, "clone_gbps": ref}


def run() -> dict:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    have_vllm = vllm_baseline.load() is not None
    note = "" if have_vllm else f"(vLLM not measured: {vllm_baseline.why_missing})"
    print(f"== allocator core: kvscope vs vLLM {vllm_baseline.VERSION} BlockPool, same process, "
          f"{RUNS} interleaved runs, gc on ==")
    if not have_vllm:
        print(note)
    t0 = time.perf_counter()
    picked = [row for row in rows() if not ONLY or row.key in ONLY]
    if ONLY:  # a selection measures its rows alone, without the memory and defrag parts
        print(f"rows selected by KVSCOPE_BENCH_ROWS: {', '.join(row.key for row in picked) or 'none'}")
        return {"throughput": print_rows(run_rows(picked, vllm=have_vllm), note)}
    out = {"throughput": print_rows(run_rows(picked, vllm=have_vllm), note),
           "metadata": metadata(have_vllm), "defrag": defrag_bandwidth()}
    print(f"(allocator bench took {time.perf_counter() - t0:.1f} s)")
    return out


if __name__ == "__main__":
    run()
