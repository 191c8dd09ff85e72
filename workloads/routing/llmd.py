"""llm-d's precise prefix-cache routing: a weighted sum of scorers, the highest total wins.

Follows llm-d/llm-d-inference-scheduler `deploy/config/epp-precise-prefix-cache-config.yaml`
(the default profile of the precise guide: `precise-prefix-cache-scorer` weight 2.0,
`kv-cache-utilization-scorer` 1.0, `queue-scorer` 1.0, `max-score-picker`), with

- `precise-prefix-cache-scorer` (`pkg/plugins/scorer/precise_prefix_cache.go`,
  `computeScoresFromKeyToPods`): a pod's match is the number of consecutive leading blocks of
  the prompt it holds, read from the real cache (fed by KV events). Two ways to turn it into a
  score in [0, 1]:
  - `llmd_precise`: the fraction of the prompt's blocks matched (`matchBlocks / totalBlocks`,
    the `PrefixCacheMatchInfo` the scorer publishes and the gateway's prefix scorer's rule);
  - `llmd_precise_minmax`: the scorer's own `indexedScoresToNormalizedScoredPods` (`utils.go`):
    pods holding none of the prompt score 0, the others are min-max normalised (all 1.0 when
    equal). A lone pod holding just the first block then scores 1.0, which outweighs both load
    scorers together: on a trace whose prompts all share their first block it piles every new
    conversation onto one pod until that pod's KV cache is full.
- `kv-cache-utilization-scorer` (gateway-api-inference-extension): `1 - KV cache usage`;
- `queue-scorer` (gateway-api-inference-extension): `(max_q - q) / (max_q - min_q)` over the
  waiting queues, 1.0 for every pod when all are equal;
- `max-score-picker`: the highest total; it shuffles the pods first, so ties go to a random
  one (here from a generator seeded with the policy's seed).
"""

from __future__ import annotations

import random

from .policies import Cluster, Policy, RouteRequest

WEIGHTS = {"prefix": 2.0, "kv_utilization": 1.0, "queue": 1.0}


def fraction_scores(matches: list[int], total_blocks: int) -> list[float]:
    """The share of the prompt's blocks each pod holds as a leading run."""
    return [m / total_blocks for m in matches]


def prefix_scores(matches: list[int]) -> list[float]:
    """The scorer's min-max normalisation of each pod's leading matched blocks."""
    present = [m for m in matches if m > 0]
    if not present:
        return [0.0] * len(matches)
    lo, hi = min(present), max(present)
    if lo == hi:
        return [1.0 if m > 0 else 0.0 for m in matches]
    return [(m - lo) / (hi - lo) if m > 0 else 0.0 for m in matches]


def queue_scores(queues: list[int]) -> list[float]:
    lo, hi = min(queues), max(queues)
    if lo == hi:
        return [1.0] * len(queues)
    return [(hi - q) / (hi - lo) for q in queues]


class LlmdPrecise(Policy):
    """llm-d's default precise-prefix profile (see the module docstring)."""

    def __init__(self, n: int, seed: int = 0, minmax: bool = False) -> None:
        super().__init__(n, seed)
        self.name = "llmd_precise_minmax" if minmax else "llmd_precise"
        self.minmax = minmax
        self.rng = random.Random(seed)
        self.last_scores: list[float] = []

    def scores(self, matches: list[int], usages: list[float], queues: list[int],
               total_blocks: int = 1) -> list[float]:
        prefix = prefix_scores(matches) if self.minmax else fraction_scores(matches, total_blocks)
        queue = queue_scores(queues)
        return [WEIGHTS["prefix"] * p + WEIGHTS["kv_utilization"] * (1.0 - u) + WEIGHTS["queue"] * q
                for p, u, q in zip(prefix, usages, queue)]

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        matches = cluster.matches(req)
        usages = [cluster.kv_usage(r) for r in range(self.n)]
        totals = self.last_scores = self.scores(matches, usages, cluster.waiting, len(req.blocks))
        best = max(totals)
        tied = [r for r in range(self.n) if totals[r] == best]
        pick = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        self.kind = "score"
        self.rule = (f"highest score {best:.2f} = 2 x prefix + kv free + queue "
                     f"({matches[pick]} blocks cached)")
        return pick
