"""Sequence mode: a trace routed over N LRU block caches, in arrival order, without time.

The model, exactly:

- One 512-token block per trace `hash_id`, named by its prefix-tree node (`MooncakeTrace.nodes`:
  two blocks are the same only when their whole prefixes agree, so an id repeated under another
  prefix is another block); a request's last block holds `input_length - 512 * (k - 1)` tokens
  (k blocks).
- Each replica is an LRU of `capacity_tokens // 512` blocks.
- A request's hit is the longest run of its leading blocks cached on the chosen replica,
  weighted by tokens.
- After the lookup all of the request's blocks become most recent, tail first (the deepest
  block is touched first), so on eviction the deepest block of the least recent request goes
  first.

Reported: token-weighted `hit_ratio`; `imbalance`, the max over the mean of the per-replica
input tokens; `duplicated_blocks`, the distinct blocks cached on two or more replicas at the end.

Load-aware policies see cumulative load here (nothing finishes without time): `requests` and
`routed` count every request routed to a replica, `tokens` their prompt + output tokens,
`waiting` equals `requests`, and the KV usage is the LRU's fill.
"""

from __future__ import annotations

import gc
from collections import Counter, OrderedDict
from contextlib import contextmanager

from allocator import InvalidRequest

from ..mooncake import MooncakeTrace
from .policies import BLOCK_TOKENS, Cluster, Policy, RouteRequest, prefix_run


def check_grid(replicas: int, capacity_tokens: int) -> None:
    """Raises InvalidRequest unless N >= 1 and the capacity holds at least one block."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidRequest(f"replicas must be a whole number >= 1, got {replicas!r}")
    if (isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int)
            or capacity_tokens < BLOCK_TOKENS):
        raise InvalidRequest(f"capacity_tokens must be at least one {BLOCK_TOKENS}-token block, "
                             f"got {capacity_tokens!r}")


def requests(trace: MooncakeTrace):
    """The trace's requests as `RouteRequest`s, in arrival order; their blocks are prefix-tree
    nodes (equal to the trace's ids on a trace whose ids never repeat under another prefix,
    such as the bundled one)."""
    ids = trace.nodes.tolist()
    offsets = trace.offsets.tolist()
    for i, (t, n_in, n_out) in enumerate(zip(trace.arrival_s.tolist(), trace.input_length.tolist(),
                                             trace.output_length.tolist())):
        yield RouteRequest(i, t, ids[offsets[i]:offsets[i + 1]], n_in, n_out)


class LruCluster(Cluster):
    """N LRU caches of trace blocks (`OrderedDict`: O(1) touch and eviction, in C)."""

    def __init__(self, n: int, capacity_tokens: int) -> None:
        check_grid(n, capacity_tokens)
        self.n = n
        self.capacity = capacity_tokens // BLOCK_TOKENS
        self.caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
        self.now = 0.0
        self.requests = [0] * n
        self.tokens = [0] * n
        self.routed = self.requests
        self.waiting = self.requests
        self.input_tokens = [0] * n
        self._matched_for = -1
        self._matches: list[int] = []

    def matches(self, req: RouteRequest) -> list[int]:
        if self._matched_for != req.index:
            self._matches = [prefix_run(req.blocks, c) for c in self.caches]
            self._matched_for = req.index
        return self._matches

    def kv_usage(self, r: int) -> float:
        return len(self.caches[r]) / self.capacity

    def serve(self, req: RouteRequest, r: int) -> int:
        """Look `req` up on replica r, touch its blocks tail first, evict; returns hit tokens."""
        cache = self.caches[r]
        hit = req.prefix_tokens(prefix_run(req.blocks, cache))
        move = cache.move_to_end
        for b in reversed(req.blocks):
            if b in cache:
                move(b)
            else:
                cache[b] = None
        cap = self.capacity
        while len(cache) > cap:
            cache.popitem(last=False)
        self.requests[r] += 1
        self.tokens[r] += req.tokens + req.output_tokens
        self.input_tokens[r] += req.tokens
        return hit

    def duplicated_blocks(self) -> int:
        counts = Counter(b for cache in self.caches for b in cache)
        return sum(1 for c in counts.values() if c >= 2)


@contextmanager
def no_gc():
    """Pause the cyclic garbage collector: the routers' trees allocate hundreds of thousands of
    small containers and nothing here makes cycles, so collections only cost time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_sequence(trace: MooncakeTrace, n: int, capacity_tokens: int, policy: Policy,
                 progress=None, decisions=None) -> dict:
    """Route every request of `trace` with `policy` over n LRU caches; returns the figures.
    `decisions` (a `DecisionLog`) gets every decision."""
    cluster = LruCluster(n, capacity_tokens)
    hit_total = query_total = 0
    total = len(trace)
    with no_gc():
        for req in requests(trace):
            cluster.now = req.arrival_s
            r = policy.route(req, cluster)
            if decisions is not None:
                decisions.add(req, r, cluster, policy)  # before serving: the caches as routed
            hit = cluster.serve(req, r)
            if decisions is not None:
                decisions.captured(req.index, hit)
            hit_total += hit
            query_total += req.tokens
            if progress is not None and req.index % 256 == 0:
                progress(req.index, total)
    mean = sum(cluster.input_tokens) / n
    return {
        "hit_ratio": hit_total / query_total if query_total else 0.0,
        "imbalance": max(cluster.input_tokens) / mean if mean else 0.0,
        "duplicated_blocks": cluster.duplicated_blocks(),
        "hit_tokens": hit_total,
        "prompt_tokens": query_total,
        "replica_input_tokens": list(cluster.input_tokens),
        "replica_requests": list(cluster.requests),
    }
