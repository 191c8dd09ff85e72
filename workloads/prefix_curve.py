"""Prefix-cache hit ratio vs capacity vs eviction policy, with Bélády's MIN as the bound.

The Mooncake paper's Figure 9 analysis, run on the allocator's real prefix cache: requests in
arrival order, one at a time (no concurrency). For each request

1. `open_sequence(block_hashes=...)` on a paged pool with prefix caching: the cache reports the
   prompt's longest cached prefix; the request's hit is `min(cached_tokens, input_length)` (a
   trace block stands for 512 tokens, the last one may be partial);
2. the prompt's blocks not cached are allocated; when the pool is full, idle cached blocks are
   evicted by the pool's policy (the request's own blocks are in use, never victims);
3. `close_sequence`: the blocks go back idle, tail first, so the head of a prompt is the most
   recently used and a cache shrinks from the tails of prompts.

`hit_ratio = sum(hits) / sum(input_length)`. The capacity is the pool's size: capacity_tokens //
tokens_per_block blocks. A prompt longer than the whole pool opens only its first pool-sized
part (everything else evicted, as inserting the whole prompt and then trimming the cache to its
capacity would leave it). With infinite capacity nothing is evicted: the maximum hit ratio.

Bélády's MIN (`belady`): the pool's `belady` policy with caller-supplied next uses. A block's next
use is the index of the next request whose prompt contains it (inf if none), plus a depth
fraction `(d + 1) / (D + 1)` (d the block's position in the prompt, D larger than any) so that,
among blocks next needed by the same request, the deepest goes first. That tie-break matters:
a block is only useful with its whole prefix cached, and a request that needs a block needs its
parent too (the parent's next use is never later), so evicting the child first keeps the cache
prefix-closed. MIN is then optimal for the number of block hits (each block access in arrival
order, unit size, demand insertion); the token-weighted ratio counts the last, partial block of
a prompt for less than 512 tokens, so MIN is a bound only up to that weighting and up to the
prefix constraint: a cached block whose parent is gone earns nothing, which MIN's exchange
argument (every access stands alone) does not model. See `bound_note()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from allocator import InvalidRequest, create_pool

from .mooncake import ATTRIBUTION, TRACE_BLOCK_TOKENS, MooncakeTrace, sub_blocks

POLICY_NAMES = ("lru", "fifo", "lfu", "s3fifo")
BOUND = "belady"
CURVE_POLICIES = (*POLICY_NAMES, BOUND)
DEFAULT_CAPACITIES = (100_000, 300_000, 1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000)
LENGTH_BUCKETS = (4_000, 8_000, 16_000, 32_000)
PAPER = {
    "source": "Qin et al., Mooncake, USENIX FAST 2025",
    "cache_ratio": 0.40,
    "cache_ratio_note": "Table 2: 'cache ratio' of the conversation workload (12,031 requests)",
    "local_cache_tokens": 3_000_000,
    "local_cache_note": ("Figure 9 / Section 6: a 3M-token local cache reaches under 50% of the "
                         "maximum hit ratio in most workloads"),
}

Progress = Callable[[int, int], None]
PoolFactory = Callable[[int, int, str], object]


def prefix_pool(num_blocks: int, tokens_per_block: int, policy: str):
    """A CPU paged pool with prefix caching, one byte per token (the curve needs bookkeeping,
    not KV bytes; the same code path the dashboard's pools take)."""
    return create_pool("paged", num_blocks=num_blocks, block_bytes=tokens_per_block,
                       tokens_per_block=tokens_per_block, device="cpu", event_capacity=1,
                       prefix_caching={"policy": policy})


@dataclass(slots=True)
class Prepared:
    """A trace ready for every run: per request its prompt length, its pool block hashes
    (`hashes(i)`; kept for 512-token blocks, recomputed per run for smaller ones, where the
    whole trace would be millions of ints) and, on demand, Bélády's next use of each block."""

    trace: MooncakeTrace
    tokens_per_block: int
    inputs: list[int]
    _hashes: list[list[int]] | None = None
    _next_use: list[list[float]] | None = None

    def hashes(self, i: int) -> list[int]:
        if self._hashes is not None:
            return self._hashes[i]
        return self.trace.block_hashes(i, self.tokens_per_block)

    @property
    def distinct_blocks(self) -> int:
        return self.trace.num_nodes * sub_blocks(self.tokens_per_block)

    @property
    def input_tokens(self) -> int:
        return sum(self.inputs)

    def next_use(self) -> list[list[float]]:
        if self._next_use is None:
            self._next_use = next_uses(self.trace, self.tokens_per_block)
        return self._next_use


def prepare(trace: MooncakeTrace, tokens_per_block: int = TRACE_BLOCK_TOKENS) -> Prepared:
    sub_blocks(tokens_per_block)
    prep = Prepared(trace, tokens_per_block, trace.input_length.tolist())
    if tokens_per_block == TRACE_BLOCK_TOKENS:
        prep._hashes = [trace.block_hashes(i) for i in range(len(trace))]
    return prep


def next_uses(trace: MooncakeTrace, tokens_per_block: int = TRACE_BLOCK_TOKENS) -> list[list[float]]:
    """Per request, per pool block: the next request index using the block's prefix node (inf if
    none) plus the depth tie-break fraction described in the module docstring."""
    k = sub_blocks(tokens_per_block)
    nodes, offsets = trace.nodes, trace.offsets
    req = np.repeat(np.arange(len(trace)), np.diff(offsets))
    # A node occurs at most once per request (it sits at one depth), so sorting the occurrences
    # by (node, request) puts each occurrence right before the node's next one.
    order = np.lexsort((req, nodes))
    nxt = np.full(len(nodes), np.inf)
    same = nodes[order[1:]] == nodes[order[:-1]]
    nxt[order[:-1][same]] = req[order[1:][same]]
    depth = np.arange(len(nodes)) - offsets[req]
    span = float(np.diff(offsets).max(initial=0) * k + 1)
    out: list[list[float]] = []
    for i in range(len(trace)):
        a, b = int(offsets[i]), int(offsets[i + 1])
        base = np.repeat(nxt[a:b], k)
        d = (np.repeat(depth[a:b] * k, k) + np.tile(np.arange(k), b - a) + 1) / span
        out.append((base + d).tolist())
    return out


@dataclass(frozen=True, slots=True)
class Point:
    capacity_tokens: int | None  # None: infinite
    policy: str
    hit_tokens: int
    input_tokens: int
    evicted_blocks: int
    wall_s: float

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def row(self) -> dict:
        return {"capacity_tokens": self.capacity_tokens, "policy": self.policy,
                "hit_ratio": self.hit_ratio, "hit_tokens": self.hit_tokens,
                "evicted_blocks": self.evicted_blocks}


def run_point(prep: Prepared, capacity_tokens: int | None, policy: str,
              make_pool: PoolFactory = prefix_pool, progress: Progress | None = None,
              done: int = 0, total: int = 0) -> Point:
    """Replay the prepared trace on a fresh prefix-caching pool of `capacity_tokens`."""
    t0 = time.perf_counter()
    tpb = prep.tokens_per_block
    if capacity_tokens is None:
        blocks = max(prep.distinct_blocks, 1)
    else:
        blocks = capacity_tokens // tpb
        if blocks < 1:
            raise InvalidRequest(f"capacity {capacity_tokens} tokens holds no {tpb}-token block")
    pool = make_pool(blocks, tpb, policy)
    uses = prep.next_use() if policy == BOUND else None
    hits = 0
    open_sequence, close_sequence = pool.open_sequence, pool.close_sequence
    for i, n_in in enumerate(prep.inputs):
        hashes = prep.hashes(i)
        nxt = None if uses is None else uses[i]
        if len(hashes) > blocks:
            hashes = hashes[:blocks]
            nxt = None if nxt is None else nxt[:blocks]
        info = open_sequence(block_hashes=hashes, num_tokens=len(hashes) * tpb, next_use=nxt)
        cached = info.cached_tokens
        hits += cached if cached < n_in else n_in
        close_sequence(info.id)
        if progress is not None and not i % 500:
            progress(done + i, total)
    stats = pool.prefix_stats()
    return Point(capacity_tokens, policy, hits, prep.input_tokens,
                 int(stats["evicted"]),
                 time.perf_counter() - t0)


def infinite_ratios(trace: MooncakeTrace) -> dict:
    """The infinite-capacity maximum computed without any cache (a request's hit is its longest
    prefix of nodes seen before), weighted three ways: by tokens (the curve's definition), by
    blocks, and as the mean over requests of each request's own ratio. The paper does not say
    which its "cache ratio" is; the report shows all three."""
    seen: set[int] = set()
    hit_tokens = hit_blocks = 0
    ratios = np.zeros(len(trace))
    for i in range(len(trace)):
        nodes = trace.block_nodes(i).tolist()
        matched = 0
        for node in nodes:
            if node not in seen:
                break
            matched += 1
        n_in = int(trace.input_length[i])
        hit = min(matched * TRACE_BLOCK_TOKENS, n_in)
        hit_tokens += hit
        hit_blocks += matched
        ratios[i] = hit / n_in
        seen.update(nodes)
    n, total = len(trace), int(trace.input_length.sum())
    buckets = []
    edges = (0, *LENGTH_BUCKETS, np.inf)
    for lo, hi in zip(edges, edges[1:]):
        inside = (trace.input_length >= lo) & (trace.input_length < hi)
        if inside.any():
            buckets.append({"min_tokens": int(lo), "max_tokens": None if hi == np.inf else int(hi),
                            "requests": int(inside.sum()), "mean_ratio": float(ratios[inside].mean())})
    return {"token_weighted": hit_tokens / total if total else 0.0,
            "block_weighted": hit_blocks / int(trace.offsets[-1]) if n else 0.0,
            "request_mean": float(ratios.mean()) if n else 0.0,
            "by_prompt_length": buckets}


def max_hit_ratio_by_set(trace: MooncakeTrace) -> float:
    """The token-weighted maximum (see `infinite_ratios`); the pool's infinite run must agree."""
    return float(infinite_ratios(trace)["token_weighted"])


def check_policies(names: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    bad = [p for p in names if p not in CURVE_POLICIES]
    if bad or not names:
        raise InvalidRequest(f"unknown policies {bad}; choose from {','.join(CURVE_POLICIES)}")
    return names


def check_capacities(values: Sequence[int], tokens_per_block: int) -> list[int]:
    out = sorted(set(values))
    bad = [c for c in out if isinstance(c, bool) or not isinstance(c, int) or c < tokens_per_block]
    if bad or not out:
        raise InvalidRequest(f"capacities must be integers of at least one block "
                             f"({tokens_per_block} tokens), got {bad or 'none'}")
    return out


def capacity_curve(trace: MooncakeTrace, capacities: Sequence[int] = DEFAULT_CAPACITIES,
                   policies: Sequence[str] = CURVE_POLICIES,
                   tokens_per_block: int = TRACE_BLOCK_TOKENS,
                   make_pool: PoolFactory = prefix_pool,
                   progress: Progress | None = None) -> dict:
    """Every (capacity, policy) point plus the infinite-capacity maximum, as a JSON report."""
    policies = check_policies(policies)
    capacities = check_capacities(capacities, tokens_per_block)
    prep = prepare(trace, tokens_per_block)
    n = len(trace)
    total = n * (len(capacities) * len(policies) + 1)
    done = 0
    best = run_point(prep, None, "lru", make_pool, progress, done, total)
    done += n
    points: list[Point] = []
    for cap in capacities:
        for p in policies:
            points.append(run_point(prep, cap, p, make_pool, progress, done, total))
            done += n
    if progress is not None:
        progress(total, total)
    return {
        "trace": trace.summary(),
        "tokens_per_block": tokens_per_block,
        "definition": ("arrival order, no concurrency; hit = min(cached prefix tokens, "
                       "input_length); hit_ratio = sum(hits) / sum(input_length)"),
        "capacities_tokens": capacities,
        "policies": policies,
        "max_hit_ratio": best.hit_ratio,
        "max_hit_ratio_weightings": infinite_ratios(trace),
        "curve": [p.row() for p in points],
        "checks": curve_checks(points, best.hit_ratio),
        "paper": PAPER,
        "bound_note": bound_note(),
        "attribution": ATTRIBUTION,
    }


def curve_checks(points: Sequence[Point], max_ratio: float) -> dict:
    """The targets, checked on the measured points: MIN >= every policy at every capacity, LRU
    non-decreasing in capacity, nothing above the maximum."""
    by = {(p.capacity_tokens, p.policy): p.hit_ratio for p in points}
    caps = sorted({p.capacity_tokens for p in points})
    beaten = [f"{pol} {by[c, pol]:.4f} > belady {by[c, BOUND]:.4f} at {c:,}"
              for c in caps for pol in POLICY_NAMES
              if (c, pol) in by and (c, BOUND) in by and by[c, pol] > by[c, BOUND] + 1e-12]
    lru = [by[c, "lru"] for c in caps if (c, "lru") in by]
    return {
        "belady_bounds_policies": not beaten,
        "belady_beaten_at": beaten,
        "lru_non_decreasing": all(a <= b + 1e-12 for a, b in zip(lru, lru[1:])),
        "all_below_max": all(p.hit_ratio <= max_ratio + 1e-12 for p in points),
    }


def bound_note() -> str:
    return ("Bélády's MIN here evicts the idle cached block whose next use (the next request whose "
            "prompt holds it) is farthest, deepest block first among equals. It is optimal for "
            "the count of block hits when every access stands alone; a prefix cache adds two "
            "things MIN does not model: a block earns a hit only while its whole prefix is "
            "cached (the tie-break keeps the cache prefix-closed, since a block's parent is never "
            "needed later than the block), and hits are weighted by tokens, so a prompt's last, "
            "partial block is worth less than 512 tokens. MIN is therefore a bound up to the "
            "prefix constraint and that weighting, not a proven optimum of the token-weighted "
            "ratio; the curve checks that it bounds every policy measured.")


def ratio_at(report: dict, capacity: int, policy: str) -> float | None:
    for row in report["curve"]:
        if row["capacity_tokens"] == capacity and row["policy"] == policy:
            return row["hit_ratio"]
    return None
