"""The limits beside every router: what no routing over N replicas of C tokens can beat.

Two bounds per (trace, mode, N, C), in the lab's own units (prompt tokens found cached, over
prompt tokens, 512-token trace blocks keyed by prefix-tree node, as both modes count hits):

- **infinite** (`infinite_bound_hit_ratio`): a cache that never evicts. Request i's hit is its
  longest run of leading blocks seen in earlier requests, counted as the mode counts it.
- **pooled** (`pooled_bound_hit_ratio`): one cache of all the replicas' blocks pooled,
  K = N x (C // 512) blocks, run by Bélády's MIN over the same requests in arrival order.

The access sequence is each request's blocks in order, request after request. In sequence mode
that is every block of every request, and a hit of m leading blocks is worth
`prefix_tokens(m)` (the last block holds `input_length - 512 * (k - 1)` tokens). In serving mode
it is the full blocks of the requests serving mode routes (those with prompt + output within a
replica's `max_len`), the partial last block is never cached, and a hit is worth
`min(512 m, input_length - 1)` (one token is always computed). The denominator is the mode's:
every prompt token of those requests.

MIN here is the variant with bypass: on a miss with the cache full, the block needed furthest in
the future among the cached ones *and the missed one* goes (the missed one is then not cached).
Bypass is what a replica does with a request longer than itself (sequence mode's LRU inserts it
and keeps only its head), so demand-only MIN, which must insert every block, is no bound: two
replicas of 2 blocks serving [a], [p1, p2, p3, p4], [a] keep `a` on one replica while the long
prompt passes through the other, where one 4-block cache that must take the long prompt loses
`a`. "Needed" is the position of the block's next access in the flattened sequence, so among
blocks next needed by the same request the deepest goes first; a block's parent is never needed
later than the block, so the cache stays prefix-closed and MIN's hits are exactly leading runs.

Why the pooled figure bounds every routing: at each request the union of the N replicas'
caches is one cache of at most K distinct blocks that only takes blocks of the request just
served; a request's hit on its replica is a leading run of that union. Replayed block by block,
such a cache can be matched by one that takes or bypasses each block at its access, and MIN with
bypass maximises the number of block hits of any such cache (unit sizes). MIN maximises block
hits, not tokens: a partial last block it hits is worth less than 512 tokens, and a routing that
hit a full block instead could score more tokens with fewer blocks. So the pooled bound counts
each of MIN's block hits as 512 tokens (`pooled tokens = 512 x MIN's block hits`), which bounds
every policy's tokens, and takes the smaller of that and the infinite bound, which bounds them
too. On a trace whose partial blocks are never hit the factor 512 is exact (serving mode never
caches partial blocks: there the only slack is the one token of a request hit whole); the rows
carry `pooled_bound_slack_tokens`, the tokens by which 512 x MIN's hits exceed MIN's own hits
counted as the mode counts them.

In serving mode the argument needs each replica to admit its requests in the order they were
routed, which the simulator does, except that a preempted request is admitted again and its
prompt's blocks are taken again without a new arrival; the bound is then exact only up to
preemptions (the rows count them; tests check the bound on random traces in both modes).

Cost: one pass of MIN over the trace's blocks per (mode, K, max_len), O(blocks log blocks) in
Python (about a second on the bundled trace's 288,500 blocks), shared by every policy of a
sweep (grid.py computes each once, in the executor, next to the points).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..mooncake import MooncakeTrace
from .policies import BLOCK_TOKENS
from .sequence import check_grid
from .serving import MAX_LEN


@dataclass(frozen=True, slots=True)
class BoundKey:
    """What the bounds depend on: the mode, the pooled capacity in blocks, and (serving mode)
    the longest request a replica admits. Equal keys share one computation."""

    mode: str
    pooled_blocks: int
    max_len: int | None


def bound_key(mode: str, replicas: int, capacity_tokens: int) -> BoundKey:
    check_grid(replicas, capacity_tokens)
    blocks = capacity_tokens // BLOCK_TOKENS
    if mode == "serving":
        return BoundKey(mode, replicas * blocks, min(MAX_LEN, blocks * BLOCK_TOKENS))
    return BoundKey(mode, replicas * blocks, None)


def accesses(trace: MooncakeTrace, key: BoundKey) -> tuple[list[list[int]], list[int], list[int]]:
    """Per request the blocks its mode looks up (prefix-tree nodes), the tokens a hit of its
    whole run is worth, and its prompt length; requests serving mode would not route are left
    out."""
    nodes = trace.nodes.tolist()
    offsets = trace.offsets.tolist()
    lengths = trace.input_length.tolist()
    runs: list[list[int]] = []
    whole: list[int] = []
    prompts: list[int] = []
    if key.mode == "sequence":
        for i, n in enumerate(lengths):
            runs.append(nodes[offsets[i]:offsets[i + 1]])
            whole.append(n)
            prompts.append(n)
    else:
        outputs = trace.output_length.tolist()
        for i, n in enumerate(lengths):
            if n + outputs[i] > key.max_len:
                continue  # serving mode rejects it before any router sees it
            full = n // BLOCK_TOKENS
            runs.append(nodes[offsets[i]:offsets[i] + full])
            whole.append(min(BLOCK_TOKENS * full, n - 1))
            prompts.append(n)
    return runs, whole, prompts


def hit_tokens(matched: int, blocks: int, whole: int) -> int:
    """Tokens of a hit of `matched` leading blocks out of `blocks`, as the mode counts them."""
    return whole if matched >= blocks else min(BLOCK_TOKENS * matched, whole)


def infinite_hits(runs: list[list[int]], whole: list[int]) -> tuple[int, int]:
    """(hit tokens, block hits) of a cache that never evicts."""
    seen: set[int] = set()
    tokens = blocks = 0
    for run, w in zip(runs, whole):
        m = 0
        for b in run:
            if b not in seen:
                break
            m += 1
        tokens += hit_tokens(m, len(run), w)
        blocks += m
        seen.update(run)
    return tokens, blocks


def next_uses(flat: np.ndarray) -> np.ndarray:
    """next[p]: the position of the next access to flat[p] after p, or len(flat) if none."""
    n = len(flat)
    nxt = np.full(n, n, dtype=np.int64)
    if n < 2:
        return nxt
    order = np.argsort(flat, kind="stable")  # by block, then by position
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def belady_hits(runs: list[list[int]], capacity_blocks: int) -> tuple[int, list[int]]:
    """Bélády's MIN with bypass over one cache of `capacity_blocks` blocks: (block hits, leading
    blocks hit per request). Every access counts on its own; the cache stays prefix-closed (see
    the module docstring), so each request's hits are a leading run."""
    flat = np.fromiter((b for run in runs for b in run), dtype=np.int64,
                       count=sum(len(r) for r in runs))
    never = len(flat)
    per_request = [0] * len(runs)
    distinct = len(np.unique(flat)) if never else 0
    if capacity_blocks >= distinct:  # nothing is ever evicted: every repeat access hits
        seen: set[int] = set()
        hits = 0
        for i, run in enumerate(runs):
            m = 0
            for b in run:
                if b not in seen:
                    break
                m += 1
            per_request[i] = m
            hits += sum(1 for b in run if b in seen)
            seen.update(run)
        return hits, per_request
    nxt = next_uses(flat).tolist()
    cached: dict[int, int] = {}  # block -> the position of its next access (its key)
    heap: list[tuple[int, int]] = []  # (-key, block), stale entries skipped on pop
    push, pop = heapq.heappush, heapq.heappop
    hits = 0
    p = 0
    for i, run in enumerate(runs):
        lead = 0
        leading = True
        for b in run:
            k = nxt[p]
            p += 1
            if b in cached:
                hits += 1
                if leading:
                    lead += 1
                cached[b] = k
                push(heap, (-k, b))
                continue
            leading = False
            if len(cached) < capacity_blocks:
                cached[b] = k
                push(heap, (-k, b))
                continue
            while cached.get(heap[0][1]) != -heap[0][0]:
                pop(heap)
            if -heap[0][0] <= k:
                continue  # the missed block is needed last: bypass it
            del cached[pop(heap)[1]]
            cached[b] = k
            push(heap, (-k, b))
            if len(heap) > 4 * capacity_blocks + 1024:  # drop stale entries now and then
                heap = [(-v, x) for x, v in cached.items()]
                heapq.heapify(heap)
        per_request[i] = lead
    return hits, per_request


def compute_bounds(trace: MooncakeTrace, key: BoundKey) -> dict:
    """Both bounds for `key` on `trace`, in tokens and as ratios over the mode's prompt tokens."""
    runs, whole, prompts = accesses(trace, key)
    prompt_tokens = sum(prompts)
    inf_tokens, _ = infinite_hits(runs, whole)
    blocks, lead = belady_hits(runs, key.pooled_blocks)
    min_tokens = sum(hit_tokens(m, len(r), w) for m, r, w in zip(lead, runs, whole))
    pooled = min(BLOCK_TOKENS * blocks, inf_tokens)
    return {
        "pooled_bound_blocks": key.pooled_blocks,
        "pooled_bound_tokens": pooled,
        "pooled_bound_slack_tokens": pooled - min_tokens,
        "infinite_bound_tokens": inf_tokens,
        "bound_prompt_tokens": prompt_tokens,
        "pooled_bound_hit_ratio": pooled / prompt_tokens if prompt_tokens else 0.0,
        "infinite_bound_hit_ratio": inf_tokens / prompt_tokens if prompt_tokens else 0.0,
    }


def with_bounds(row: dict, bounds: dict) -> dict:
    """`row` with the bounds of its (mode, N, C) and its hit ratio as a fraction of the pooled
    bound (None when the bound is 0: nothing could be hit)."""
    pooled = bounds["pooled_bound_hit_ratio"]
    return {**row, **bounds,
            "of_pooled_bound": row["hit_ratio"] / pooled if pooled > 0 else None}
