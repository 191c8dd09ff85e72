"""Serving mode: the trace at its timestamps through N simulated replicas behind a router.

Each replica is the serving simulator (`workloads/simulator.py`) on its own prefix-caching pool
(`allocator.PrefixPool`, 512-token blocks named by the trace's prefix tree, LRU): a request queues,
is admitted when the batch and the pool have room, prefills only its uncached tokens (the batch
stalls meanwhile), then decodes one token per step, at the costs of `ServingCosts` (by default
Dynamo's mocker's polynomials, as DynoSim replays; or linear per-token costs). Before each arrival
every replica is advanced to the arrival time, so the router sees real load: requests and tokens in
flight, waiting queues, KV usage and (for the precise policies) the pools' real cache contents.

Figures: `hit_ratio` (prompt tokens found cached at each request's first admission, over prompt
tokens), `available_hit_ratio` (what the replica with the longest cached prefix held for each
request when it was routed: the most any router could have captured then), `ttft_p50_s` /
`ttft_p99_s` (arrival to the end of the prefill that produced the first token), throughput
(completed requests over the simulated seconds to the last completion), `imbalance` and
`duplicated_blocks` as in sequence mode.

NOTE: only full blocks are cached (a prompt's partial last block is recomputed, as engines do),
so hit ratios here sit a little below sequence mode's, which counts the partial block too.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import asdict, dataclass

import numpy as np

from allocator import InvalidRequest, PrefixPool

from ..mooncake import MooncakeTrace, expand
from ..simulator import COST_MODELS, PrefixStrategy, SimConfig, Simulator, dynosim_prefill_s
from .policies import BLOCK_TOKENS, Cluster, Policy, RouteRequest, prefix_run
from .sequence import check_grid, no_gc, requests

MAX_LEN = 131_072  # the bundled trace's prompts reach 126,195 tokens: a 128k-context model
# The simulated pools hold one byte per token (simulator.py's NOTE) plus per-block arrays: this
# many tokens over all replicas keeps a sweep point within about a GiB of memory.
MAX_SERVING_TOKENS = 1 << 30


DEFAULT_COSTS = "dynosim"
LINEAR = {"prefill_tokens_per_s": 20_000.0, "step_base_ms": 12.0, "step_seq_ms": 0.15}


@dataclass(slots=True)
class ServingCosts:
    """How a replica's time passes (simulated seconds). `model` "dynosim", the default: Dynamo's
    mocker engine's prefill and decode polynomials, what its offline replay DynoSim runs on
    (workloads/simulator.py `COST_MODELS`, cited there; the three per-token costs are then
    unused). `model` "linear": a prefill of `prefill_token_s` per computed token and a decode step
    of `step_base_s + step_seq_s * batch` (defaults: the serving simulator's
    Llama-3-8B-on-one-A100 shape, 20,000 tokens/s, 12 ms plus 0.15 ms per running request).
    At most `max_batch` requests run at once either way."""

    prefill_token_s: float = 1.0 / LINEAR["prefill_tokens_per_s"]
    step_base_s: float = LINEAR["step_base_ms"] / 1000
    step_seq_s: float = LINEAR["step_seq_ms"] / 1000
    max_batch: int = 256
    model: str = DEFAULT_COSTS

    def check(self) -> None:
        for name in ("prefill_token_s", "step_base_s", "step_seq_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise InvalidRequest(f"{name} must be a finite number >= 0, got {value!r}")
        if self.model not in COST_MODELS:
            raise InvalidRequest(f"unknown cost model {self.model!r}; choose from {', '.join(COST_MODELS)}")
        if self.model != "linear":
            linear = ServingCosts(model="linear")
            changed = [name for name in ("prefill_token_s", "step_base_s", "step_seq_s")
                       if getattr(self, name) != getattr(linear, name)]
            if changed:
                raise InvalidRequest(f"{', '.join(changed)} set the linear cost model, which "
                                     f"model {self.model!r} does not use: give model='linear'")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise InvalidRequest(f"max_batch must be a whole number >= 1, got {self.max_batch!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def add_cost_flags(p, what: str = "replica") -> None:
    """The serving costs' command-line flags, one set for every CLI that simulates time."""
    p.add_argument("--costs", choices=COST_MODELS, default=DEFAULT_COSTS, help=(
        f"how a {what}'s time passes: dynosim (the default: Dynamo's mocker's prefill and decode "
        "polynomials, what DynoSim replays with) or linear (the three costs below)"))
    p.add_argument("--prefill-tokens-per-s", type=float, default=None, help=(
        f"--costs linear: prefill speed of a {what} (default 20,000 tokens/s)"))
    p.add_argument("--step-base-ms", type=float, default=None,
                   help="--costs linear: decode step time at batch 0 (default 12 ms)")
    p.add_argument("--step-seq-ms", type=float, default=None,
                   help="--costs linear: decode step time added per running request (default 0.15 ms)")
    p.add_argument("--max-batch", type=int, default=256,
                   help=f"most requests running at once per {what} (default 256)")


def costs_from_args(args) -> ServingCosts:
    """ServingCosts from `add_cost_flags`' flags. Raises InvalidRequest (one line, what to fix)
    for a bad value, or a linear cost given with another cost model."""
    given = {name: getattr(args, name) for name in LINEAR if getattr(args, name) is not None}
    if given and args.costs != "linear":
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InvalidRequest(f"{flags} set the linear cost model: add --costs linear (the default, "
                             f"{DEFAULT_COSTS}, is Dynamo's mocker's timing)")
    v = {**LINEAR, **given}
    if not (math.isfinite(v["prefill_tokens_per_s"]) and v["prefill_tokens_per_s"] > 0):
        raise InvalidRequest(f"--prefill-tokens-per-s must be a positive number, got "
                             f"{v['prefill_tokens_per_s']}")
    for name in ("step_base_ms", "step_seq_ms"):
        if not (math.isfinite(v[name]) and v[name] >= 0):
            raise InvalidRequest(f"--{name.replace('_', '-')} must be a number >= 0, got {v[name]}")
    if args.max_batch < 1:
        raise InvalidRequest(f"--max-batch must be at least 1, got {args.max_batch}")
    return ServingCosts(prefill_token_s=1.0 / v["prefill_tokens_per_s"],
                        step_base_s=v["step_base_ms"] / 1000, step_seq_s=v["step_seq_ms"] / 1000,
                        max_batch=args.max_batch, model=args.costs)


class Replica(Simulator):
    """The simulator with notifications: `first_token[rid]` is when request rid's first
    prefill ended; `prefills` queues (time, rid) of those first tokens for the router, which
    may still be behind them; `on_finished(rid)` is called at completion.

    Requests admitted together (an admission group: those that arrived while the replica was
    busy, or at the same instant) are prefilled first come first served, as a chunked-prefill
    scheduler with a token budget works through them: a request's first token comes when the
    group's tokens up to and including its own are computed (the cost of those tokens, by the
    cost model), not when the whole group is done; the batch still stalls for the whole group."""

    def __init__(self, *args, on_finished, **kw) -> None:
        super().__init__(*args, **kw)
        self._arrivals.clear()  # requests arrive only when the router sends them
        self.first_token: dict[int, float] = {}
        self.prefills: deque[tuple[float, int]] = deque()
        self.on_finished = on_finished

    def _prefill_s(self, tokens: int) -> float:
        if self.cfg.cost_model == "dynosim":
            return dynosim_prefill_s(tokens)
        return tokens * self.cfg.prefill_token_s

    def _admit(self) -> None:
        before = len(self.running)
        start = self.now
        super()._admit()
        if len(self.running) > before:
            first = self.first_token
            done = 0  # the group's tokens computed so far, in admission order
            for r in list(self.running.values())[before:]:
                done += r.context - r.cached
                if r.rid not in first:
                    at = min(self.now, start + self._prefill_s(done))
                    first[r.rid] = at
                    self.prefills.append((at, r.rid))

    def _finish(self, r) -> None:
        super()._finish(r)
        self.on_finished(r.rid)


class ServingCluster(Cluster):
    """N replicas and the router's view of them."""

    def __init__(self, trace: MooncakeTrace, n: int, capacity_tokens: int,
                 costs: ServingCosts, policy: Policy) -> None:
        check_grid(n, capacity_tokens)
        if n * capacity_tokens > MAX_SERVING_TOKENS:
            raise InvalidRequest(
                f"serving mode simulates at most {MAX_SERVING_TOKENS:,} tokens of KV over all "
                f"replicas; {n} x {capacity_tokens:,} is {n * capacity_tokens:,}")
        costs.check()
        self.n = n
        self.now = 0.0
        self.requests = [0] * n
        self.tokens = [0] * n
        self.routed = [0] * n
        self.waiting = [0] * n
        self.input_tokens = [0] * n
        self.policy = policy
        self.hashes = [expand(trace.block_nodes(i), BLOCK_TOKENS) for i in range(len(trace))]
        self.owner: dict[int, int] = {}
        blocks = capacity_tokens // BLOCK_TOKENS
        max_len = min(MAX_LEN, blocks * BLOCK_TOKENS)
        cfg = SimConfig(strategy="paged", pool_tokens=blocks * BLOCK_TOKENS, max_len=max_len,
                        tokens_per_block=BLOCK_TOKENS, max_batch=costs.max_batch,
                        step_base_s=costs.step_base_s, step_seq_s=costs.step_seq_s,
                        prefill_token_s=costs.prefill_token_s, cost_model=costs.model)
        cfg.validate()
        lengths = trace.input_length.tolist()
        hashes = self.hashes

        def full_hashes(rid: int) -> list[int]:
            return hashes[rid][:lengths[rid] // BLOCK_TOKENS]

        self.replicas: list[Replica] = []
        for r in range(n):
            pool = PrefixPool(blocks, BLOCK_TOKENS, tokens_per_block=BLOCK_TOKENS, policy="lru",
                              device="cpu", name=f"replica-{r}", event_capacity=1)
            strategy = PrefixStrategy(pool, 1, max_len, BLOCK_TOKENS, full_hashes)
            self.replicas.append(Replica(trace.to_trace(), cfg, pool=pool, strategy=strategy,
                                         capacity_tokens=blocks * BLOCK_TOKENS,
                                         on_finished=self._finished))
        self.max_len = max_len
        self._matched_for = -1
        self._matches: list[int] = []

    def _finished(self, rid: int) -> None:
        r = self.owner[rid]
        req = self.replicas[r].requests[rid]
        self.requests[r] -= 1
        self.tokens[r] -= req.final
        self.policy.finished(rid, r)

    def advance(self, t: float) -> None:
        """Run every replica up to time t; first tokens produced by then reach the router
        (`prefilled`). `waiting[r]` counts the requests at r without a first token at t, what
        an engine reports as waiting while chunked prefill works through them."""
        self.now = t
        policy = self.policy
        for r, sim in enumerate(self.replicas):
            sim.run_until(t)
            prefills = sim.prefills
            while prefills and prefills[0][0] <= t:
                _, rid = prefills.popleft()
                self.waiting[r] -= 1
                policy.prefilled(rid, r)

    def drain(self) -> None:
        """Run every replica to the end, telling the router each first token."""
        for r, sim in enumerate(self.replicas):
            sim.run()
            while sim.prefills:
                _, rid = sim.prefills.popleft()
                self.waiting[r] -= 1
                self.policy.prefilled(rid, r)

    def matches(self, req: RouteRequest) -> list[int]:
        if self._matched_for != req.index:
            full = self.hashes[req.index][:req.tokens // BLOCK_TOKENS]
            self._matches = [prefix_run(full, sim.pool.core.index) for sim in self.replicas]
            self._matched_for = req.index
        return self._matches

    def kv_usage(self, r: int) -> float:
        pool = self.replicas[r].pool
        return 1.0 - (pool.core.free_top + pool.core.n_evictable) / pool.num_blocks

    def send(self, req: RouteRequest, r: int) -> None:
        sim = self.replicas[r]
        sim._arrivals.append(sim.requests[req.index])
        self.owner[req.index] = r
        self.requests[r] += 1
        self.waiting[r] += 1
        self.routed[r] += 1
        self.tokens[r] += req.tokens + req.output_tokens
        self.input_tokens[r] += req.tokens

    def duplicated_blocks(self) -> int:
        counts = Counter(h for sim in self.replicas for h in sim.pool.core.index)
        return sum(1 for c in counts.values() if c >= 2)


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def run_serving(trace: MooncakeTrace, n: int, capacity_tokens: int, policy: Policy,
                costs: ServingCosts | None = None, progress=None, decisions=None) -> dict:
    """Route `trace` at its timestamps over n simulated replicas; returns the figures.
    `decisions` (a `DecisionLog`) gets every decision; what each request found cached is set
    once it was admitted."""
    costs = costs or ServingCosts()
    cluster = ServingCluster(trace, n, capacity_tokens, costs, policy)
    available: dict[int, int] = {}
    rejected = 0
    total = len(trace)
    with no_gc():
        for req in requests(trace):
            cluster.advance(req.arrival_s)
            if req.tokens + req.output_tokens > cluster.max_len:
                rejected += 1
                continue
            r = policy.route(req, cluster)
            best = max(cluster.matches(req))
            available[req.index] = min(req.prefix_tokens(best), req.tokens - 1)
            if decisions is not None:
                decisions.add(req, r, cluster, policy, available=available[req.index])
            cluster.send(req, r)
            if progress is not None and req.index % 256 == 0:
                progress(req.index, total)
        cluster.drain()
    served = [(cluster.replicas[r], cluster.replicas[r].requests[rid])
              for rid, r in cluster.owner.items()]
    if decisions is not None:
        for _, q in served:
            decisions.captured(q.rid, q.first_cached)
    prompts = sum(q.prompt for _, q in served)
    hits = sum(q.first_cached or 0 for _, q in served)
    ttft = [sim.first_token[q.rid] - q.arrival for sim, q in served if q.rid in sim.first_token]
    done = [q.finished_at for _, q in served if q.finished_at is not None]
    makespan = max(done) if done else 0.0
    mean = sum(cluster.input_tokens) / n
    ttft_sorted = np.sort(np.asarray(ttft, dtype=np.float64))
    return {
        "hit_ratio": hits / prompts if prompts else 0.0,
        "available_hit_ratio": sum(available.values()) / prompts if prompts else 0.0,
        "imbalance": max(cluster.input_tokens) / mean if mean else 0.0,
        "duplicated_blocks": cluster.duplicated_blocks(),
        "ttft_p50_s": _pct(ttft_sorted, 50),
        "ttft_p99_s": _pct(ttft_sorted, 99),
        "ttft_mean_s": float(ttft_sorted.mean()) if len(ttft_sorted) else 0.0,
        "throughput_rps": len(done) / makespan if makespan else 0.0,
        "completed": len(done),
        "rejected_too_long": rejected,
        "simulated_seconds": makespan,
        "preemptions": sum(sim.counters.preemptions for sim in cluster.replicas),
        "replica_input_tokens": list(cluster.input_tokens),
        "replica_requests": list(cluster.routed),
        "costs": costs.to_dict(),
        "ttft_cdf_s": _cdf_points(ttft_sorted),
    }


def _cdf_points(sorted_values: np.ndarray, points: int = 101) -> list[float]:
    """The TTFT quantiles at 0, 1, ..., 100 % (what the chart draws), in seconds."""
    if not len(sorted_values):
        return []
    return [float(v) for v in np.quantile(sorted_values, np.linspace(0, 1, points))]
