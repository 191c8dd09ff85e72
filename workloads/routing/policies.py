"""Routing policies: which of N replicas serves a request.

A policy sees a `RouteRequest` (the request's trace blocks and lengths) and a `Cluster` (what a
router can know about the replicas: their real cached prefixes, their load) and returns a
replica index. Policies that keep router-side state (SGLang's approximate tree, Dynamo's active
sequences) update it inside `route` and through the `prefilled` / `finished` notifications the
serving mode sends. After each call `rule` names the rule that decided, for the live view's
explanations and for the tests.

What "load" means depends on the mode (see `Cluster`): in serving mode it is the requests and
tokens routed to a replica and not yet finished; in sequence mode nothing ever finishes, so it
is everything routed there so far.

The simple policies live here; the engines' routers have a file each: `sglang.py`, `vllm_kv.py`,
`dynamo.py`, `llmd.py`. `make_policy(name, n, seed)` builds any of them by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

BLOCK_TOKENS = 512  # the Mooncake trace's block size: one hash_id per 512 prompt tokens


@dataclass(slots=True)
class RouteRequest:
    """One trace request as a router sees it. `blocks` are its blocks' prefix-tree nodes (the
    trace's hash_ids, numbered by prefix: `MooncakeTrace.nodes`), first block first;
    `tokens` its prompt length (the last block holds `tokens - 512 * (len(blocks) - 1)`)."""

    index: int
    arrival_s: float
    blocks: list[int]
    tokens: int
    output_tokens: int

    def prefix_tokens(self, matched_blocks: int) -> int:
        """Prompt tokens in the first `matched_blocks` blocks (the last block may be partial)."""
        return self.tokens if matched_blocks >= len(self.blocks) else BLOCK_TOKENS * matched_blocks


class Cluster:
    """What a router may ask about the replicas. Subclassed by each mode.

    `requests[r]` / `tokens[r]`: requests and their prompt + output tokens routed to replica r
    and not finished; `routed[r]`: requests routed to r so far; `waiting[r]`: requests waiting
    for admission at r. All lists of length `n`, kept current by the mode.
    """

    n: int
    now: float
    requests: list[int]
    tokens: list[int]
    routed: list[int]
    waiting: list[int]

    def matches(self, req: RouteRequest) -> list[int]:
        """Leading blocks of `req` cached on each replica (its real cache contents)."""
        raise NotImplementedError

    def kv_usage(self, r: int) -> float:
        """Fraction of replica r's KV cache in use, in [0, 1]."""
        raise NotImplementedError


class Policy:
    """Base class: `route` picks a replica; `prefilled` / `finished` tell the policy that a
    request it routed got its first token / completed (serving mode only)."""

    name = "base"
    rule = ""  # the last decision's rule, in a sentence
    kind = ""  # ... and in one word (workloads.routing.decisions.RULES)

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.seed = seed

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        raise NotImplementedError

    def prefilled(self, index: int, replica: int) -> None:
        pass

    def finished(self, index: int, replica: int) -> None:
        pass


def argmin_first(values) -> int:
    """Index of the smallest value; the lowest index among ties."""
    best = 0
    for i in range(1, len(values)):
        if values[i] < values[best]:
            best = i
    return best


class RoundRobin(Policy):
    """Request i goes to replica i mod N (the order of arrival)."""

    name = "round_robin"
    kind = "round_robin"

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        self.rule = "next in turn"
        return req.index % self.n


class Random(Policy):
    """A uniformly random replica from a generator seeded with `seed` (reproducible)."""

    name = "random"
    kind = "random"

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.rng = random.Random(seed)

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        self.rule = "random"
        return self.rng.randrange(self.n)


class LeastLoaded(Policy):
    """The replica with the fewest outstanding tokens (prompt + output); lowest index on ties."""

    name = "least_loaded"
    kind = "least_loaded"

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        self.rule = "fewest outstanding tokens"
        return argmin_first(cluster.tokens)


class PowerOfTwo(Policy):
    """Two distinct replicas drawn at random; the one with fewer outstanding requests wins, the
    first drawn on a tie. Follows sgl-project/sglang `sgl-model-gateway/src/policies/
    power_of_two.rs` (`if load1 <= load2 { idx1 } else { idx2 }`)."""

    name = "power_of_two"

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.rng = random.Random(seed)

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        if self.n == 1:
            self.rule, self.kind = "only replica", "only"
            return 0
        a, b = self.rng.sample(range(self.n), 2)
        self.rule, self.kind = "lighter of two random replicas", "power_of_two"
        return a if cluster.requests[a] <= cluster.requests[b] else b


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """SplitMix64's finalizer on one integer (the same bijection as `workloads.mooncake`)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Session(Policy):
    """Affinity without state: a consistent hash of the request's first block. Rendezvous
    (highest-random-weight) hashing: replica r scores mix(first_block * N_MAX + r) and the best
    score wins, so going from N to N+1 replicas moves only the keys the new replica wins."""

    name = "session"
    kind = "session"

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        key = req.blocks[0] << 8
        scores = [_mix(key + r) for r in range(self.n)]
        self.rule = "hash of the first block"
        return scores.index(max(scores))


class LongestPrefix(Policy):
    """The replica holding the most leading blocks of the request in its real cache. Ties go to
    the replica with the fewest requests routed so far, then the lowest index."""

    name = "longest_prefix"
    kind = "match"

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        matches = cluster.matches(req)
        best = max(matches)
        routed = cluster.routed
        pick = min((r for r in range(self.n) if matches[r] == best), key=lambda r: (routed[r], r))
        self.rule = f"longest cached prefix ({best} blocks)"
        return pick


SIMPLE = {cls.name: cls for cls in (RoundRobin, Random, LeastLoaded, PowerOfTwo, Session, LongestPrefix)}


def prefix_run(blocks: list[int], cache) -> int:
    """Leading blocks of `blocks` that are keys of `cache` (a dict or set)."""
    m = 0
    for b in blocks:
        if b not in cache:
            break
        m += 1
    return m


def softmax_pick(logits: list[float], temperature: float, rng: random.Random) -> int:
    """Lowest logit at temperature 0 (lowest index on ties); else a sample from the softmax
    of the negated logits rescaled to [-1/T, 0] (Dynamo's `softmax_sample`)."""
    if temperature == 0.0:
        return argmin_first(logits)
    lo, hi = min(logits), max(logits)
    if lo == hi:
        probs = np.full(len(logits), 1.0 / len(logits))
    else:
        scale = -1.0 / ((hi - lo) * temperature)
        probs = np.exp(np.asarray(logits) * scale - lo * scale)
        probs /= probs.sum()
    sample = rng.random()
    cum = 0.0
    for i, p in enumerate(probs.tolist()):
        cum += p
        if sample <= cum:
            return i
    return len(logits) - 1
