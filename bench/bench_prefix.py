"""Prefix-caching benchmark: kvscope's PrefixPool against vLLM 0.33.0's BlockPool (caching on),
in the same process, interleaved, median of several rounds.

Paths (16-block sequences, block size 16, 4,096-block pools):
- `cached open+close`: a sequence whose 16 blocks are all cached is opened (16 hash lookups, 16
  reference counts up, idle blocks out of the eviction list) and closed (tail first back in).
  vLLM: get_cached_block per hash, touch, free_blocks(reversed).
- `miss+evict open+close`: every block of the pool is idle and cached; a sequence of 16 fresh
  hashes misses at the first lookup, takes 16 blocks by evicting 16 cached ones, stores its 16
  hashes, and is closed. vLLM: get_cached_block (miss), get_new_blocks(16) (evicts),
  cache_full_blocks, free_blocks(reversed).
- `cached open+close, by tokens`: kvscope hashing 256 token ids itself (chained 64-bit hash);
  vLLM's figure is the same as the first row, whose hashes were computed beforehand (vLLM
  hashes at request creation, outside BlockPool), so this ratio is conservative for kvscope.

kvscope records its events (open/stored/removed/close) and stamps its block map on every
operation; vLLM runs with KV events off. Target: >= 3x on the first two rows.

Run: python -m bench prefix   (also run by `python -m bench allocator`); about 20 s.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator import create_pool
from bench import vllm_baseline
from bench.quick import sized

BLOCKS = 4096
SEQ_BLOCKS = 16
BS = 16
ROUNDS = sized(7, 1)
OPS = sized(2000, 100)
TARGET = 3.0


def vllm_module():
    """(vllm_baseline module, None) or (None, why it is unavailable)."""
    if vllm_baseline.load() is None:
        return None, vllm_baseline.why_missing
    return vllm_baseline, None


def kv_pool():
    return create_pool("paged", num_blocks=BLOCKS, block_bytes=64, tokens_per_block=BS, device="cpu",
                       prefix_caching={"policy": "lru"}, event_capacity=10_000, history=True)


# -- kvscope ---------------------------------------------------------------------------------
def kv_cached(by_tokens: bool = False):
    pool = kv_pool()
    tokens = list(range(SEQ_BLOCKS * BS))
    hashes = list(range(1, SEQ_BLOCKS + 1))
    kw = {"tokens": tokens} if by_tokens else {"block_hashes": hashes, "num_tokens": SEQ_BLOCKS * BS}
    pool.close_sequence(pool.open_sequence(**kw).id)
    open_, close = pool.open_sequence, pool.close_sequence

    def step():
        close(open_(**kw).id)
    return step


def kv_miss_evict():
    pool = kv_pool()
    counter = iter(range(1, 1 << 62))
    n = SEQ_BLOCKS * BS
    for _ in range(BLOCKS // SEQ_BLOCKS):  # fill the pool with idle cached blocks
        pool.close_sequence(pool.open_sequence(block_hashes=[next(counter) for _ in range(SEQ_BLOCKS)],
                                               num_tokens=n).id)
    assert pool.core.free_top == 0
    open_, close = pool.open_sequence, pool.close_sequence

    def step():
        close(open_(block_hashes=[next(counter) for _ in range(SEQ_BLOCKS)], num_tokens=n).id)
    return step


# -- vLLM --------------------------------------------------------------------------------------
def vllm_cached(vb):
    driver = vb.VllmDriver(BLOCKS, caching=True, block_size=BS)
    pool = driver.pool
    request = driver.hashes(SEQ_BLOCKS)
    driver.free(driver.allocate(SEQ_BLOCKS, request))
    hashes = request.block_hashes
    get, touch, free = pool.get_cached_block, pool.touch, pool.free_blocks
    groups = [0]

    def step():
        blocks = []
        for h in hashes:  # vLLM's find_longest_cache_hit for one group
            got = get(h, groups)
            if got is None:
                break
            blocks.append(got[0])
        touch(blocks)
        free(reversed(blocks))
    return step


def vllm_miss_evict(vb):
    driver = vb.VllmDriver(BLOCKS, caching=True, block_size=BS)
    pool = driver.pool
    for _ in range(BLOCKS // SEQ_BLOCKS):
        driver.free(driver.allocate(SEQ_BLOCKS, driver.hashes(SEQ_BLOCKS)))
    get, new, cache, free = pool.get_cached_block, pool.get_new_blocks, pool.cache_full_blocks, pool.free_blocks
    groups = [0]

    def step():
        request = driver.hashes(SEQ_BLOCKS)  # 16 fresh 32-byte hashes (vLLM's BlockHash)
        assert get(request.block_hashes[0], groups) is None
        blocks = new(SEQ_BLOCKS)
        cache(request, blocks, 0, SEQ_BLOCKS, BS, 0)
        free(reversed(blocks))
    return step


def per_op_us(step) -> float:
    t0 = time.perf_counter()
    for _ in range(OPS):
        step()
    return (time.perf_counter() - t0) / OPS * 1e6


def compare(name: str, kv_step, vl_step) -> dict:
    kv, vl = [], []
    for _ in range(ROUNDS):
        kv.append(per_op_us(kv_step))
        if vl_step is not None:
            vl.append(per_op_us(vl_step))
    row = {"path": name, "kvscope_us": statistics.median(kv)}
    if vl:
        row["vllm_us"] = statistics.median(vl)
        row["ratio"] = row["vllm_us"] / row["kvscope_us"]
    return row


def run() -> list[dict]:
    vb, why = vllm_module()
    if vb is None:
        print(f"vLLM BlockPool not measured: {why}; kvscope alone")
    rows = [
        compare("cached open+close (16 blocks)", kv_cached(), vllm_cached(vb) if vb else None),
        compare("miss+evict open+close (16 blocks)", kv_miss_evict(), vllm_miss_evict(vb) if vb else None),
    ]
    tokens = compare("cached open+close, by tokens", kv_cached(by_tokens=True), None)
    if vb:
        tokens["vllm_us"] = rows[0]["vllm_us"]
        tokens["ratio"] = tokens["vllm_us"] / tokens["kvscope_us"]
    rows.append(tokens)
    print(f"{'path':40s} {'kvscope us/op':>14s} {'vLLM us/op':>11s} {'kvscope/vLLM':>13s}")
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        flag = "" if "ratio" not in r or r["ratio"] >= TARGET or "tokens" in r["path"] else "  (below 3x)"
        vl = f"{r['vllm_us']:.2f}" if "vllm_us" in r else "-"
        print(f"{r['path']:40s} {r['kvscope_us']:14.2f} {vl:>11s} {ratio:>13s}{flag}")
    return rows


if __name__ == "__main__":
    run()
