"""Dynamo's KV router: the lowest cost wins, cost = overlap_score_weight * prefill_blocks +
decode_blocks.

Follows ai-dynamo/dynamo `lib/llm/src/kv_router/scheduler.rs` `DefaultWorkerSelector` (v0.4-v0.6,
the cost the docs give: `logit = kv_overlap_score_weight * potential_prefill_blocks +
potential_active_blocks`), its `softmax_sample` (kept as is in `lib/kv-router/src/scheduling/
selector.rs`), `ActiveSequences` (`sequence.rs`) and the `KvRouterConfig` defaults
(`overlap_score_weight` 1.0, `router_temperature` 0.0, `router_ttl_secs` 120,
`router_track_active_blocks` and `router_assume_kv_reuse` on, output blocks not tracked):

- `overlap[r]`: the request's leading blocks cached on worker r.
- `prefill_blocks[r] = (active_prefill_tokens[r] + isl - cached_tokens[r]) / block_size`: the
  prompt tokens worker r still has to prefill, this request's uncached ones included. A
  request's tokens leave `active_prefill_tokens` once its first token is out.
- `decode_blocks[r]`: distinct prompt blocks of the requests active on r, counting this
  request's blocks (blocks shared between active requests count once). They leave when the
  request finishes.
- Temperature 0 takes the lowest cost (the source's `min_by` over a hash map leaves ties
  arbitrary: here the lowest index); above 0, a sample from the softmax of the negated costs
  rescaled to [-1/T, 0], from a generator seeded with the policy's seed.

Variants: `dynamo_kv` (precise) reads the workers' real cache contents, as Dynamo does from KV
events; `dynamo_kv_approx` uses only its own routing decisions: a request's blocks count as
cached on the chosen worker for `router_ttl_secs` of trace time (`ApproxKvIndexer`, the
`--no-kv-events` mode).

NOTE: the block size is the trace's (512 tokens), and `cached_tokens` counts a fully cached
request's partial last block at its real size, so the prefill term never goes negative.
"""

from __future__ import annotations

import random

from .policies import BLOCK_TOKENS, Cluster, Policy, RouteRequest, softmax_pick

VARIANTS = {
    "dynamo_kv": dict(precise=True),
    "dynamo_kv_approx": dict(precise=False),
}


class DynamoKv(Policy):
    """Dynamo's `DefaultWorkerSelector` with its router-side `ActiveSequences` bookkeeping."""

    def __init__(self, n: int, seed: int = 0, *, precise: bool = True,
                 overlap_score_weight: float = 1.0, temperature: float = 0.0,
                 ttl_s: float = 120.0) -> None:
        super().__init__(n, seed)
        self.name = "dynamo_kv" if precise else "dynamo_kv_approx"
        self.precise = precise
        self.overlap_score_weight = overlap_score_weight
        self.temperature = temperature
        self.ttl_s = ttl_s
        self.rng = random.Random(seed)
        self.active_refs: list[dict[int, int]] = [{} for _ in range(n)]  # block -> active requests
        self.active_prefill = [0] * n
        self.pending: dict[int, tuple[int, int, list[int]]] = {}  # index -> replica, tokens, blocks
        self.predicted: list[dict[int, float]] = [{} for _ in range(n)]  # block -> expiry (approx)
        self.last_logits: list[float] = []

    def overlaps(self, req: RouteRequest, cluster: Cluster) -> list[int]:
        if self.precise:
            return cluster.matches(req)
        now, out = cluster.now, []
        for pred in self.predicted:
            m = 0
            for b in req.blocks:
                if pred.get(b, -1.0) <= now:
                    break
                m += 1
            out.append(m)
        return out

    def logits(self, req: RouteRequest, overlaps: list[int]) -> list[float]:
        """The cost of each worker for `req` given its cached leading blocks."""
        distinct = set(req.blocks)
        out = []
        for r in range(self.n):
            new_tokens = req.tokens - req.prefix_tokens(overlaps[r])
            prefill_blocks = (self.active_prefill[r] + new_tokens) / BLOCK_TOKENS
            refs = self.active_refs[r]
            decode_blocks = len(refs) + sum(1 for b in distinct if b not in refs)
            out.append(self.overlap_score_weight * prefill_blocks + decode_blocks)
        return out

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        overlaps = self.overlaps(req, cluster)
        logits = self.last_logits = self.logits(req, overlaps)
        pick = softmax_pick(logits, self.temperature, self.rng)
        self.kind = "score"
        self.rule = (f"lowest cost {logits[pick]:.1f} = {self.overlap_score_weight:g} x prefill "
                     f"blocks + decode blocks ({overlaps[pick]} cached)")
        new_tokens = req.tokens - req.prefix_tokens(overlaps[pick])
        refs = self.active_refs[pick]
        distinct = list(dict.fromkeys(req.blocks))
        for b in distinct:
            refs[b] = refs.get(b, 0) + 1
        self.active_prefill[pick] += new_tokens
        self.pending[req.index] = (pick, new_tokens, distinct)
        if not self.precise:
            expiry = cluster.now + self.ttl_s
            pred = self.predicted[pick]
            for b in req.blocks:
                pred[b] = expiry
        return pick

    def prefilled(self, index: int, replica: int) -> None:
        entry = self.pending.get(index)
        if entry is not None and entry[1]:
            self.active_prefill[replica] -= entry[1]
            self.pending[index] = (entry[0], 0, entry[2])

    def finished(self, index: int, replica: int) -> None:
        entry = self.pending.pop(index, None)
        if entry is None:
            return
        self.active_prefill[replica] -= entry[1]
        refs = self.active_refs[replica]
        for b in entry[2]:
            left = refs[b] - 1
            if left:
                refs[b] = left
            else:
                del refs[b]
