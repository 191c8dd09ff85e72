"""Live Mooncake replay: the trace's requests, with their prompt block hashes, into a server's
prefix-caching pool at a chosen speed, so sharing, hits and eviction show on the dashboard.

It is the live trace workload (`live.TraceWorkload`: the serving simulator paced by wall time,
bounded work per advance) with `PrefixStrategy`: each admission opens a sequence by the prompt's
block hashes (`tokens_per_block` of the pool, a divisor of 512), decode appends, completion
closes and leaves the prompt's blocks cached. Speed 1.0 replays in real time (the trace spans
about an hour); requests longer than the whole pool are skipped.
"""

from __future__ import annotations

from allocator import InvalidRequest, Pool, PrefixPool

from .live import LiveWorkload, TraceWorkload
from .mooncake import load_mooncake, sub_blocks
from .prefix_sim import prompt_hashes
from .simulator import PrefixStrategy, SimConfig, Simulator


class MooncakeWorkload(TraceWorkload):
    """Mooncake trace replay on a live prefix-caching pool (see the module docstring)."""

    kind = "mooncake"

    def __init__(self, pool: Pool, limit: int, speed: float) -> None:
        if not isinstance(pool, PrefixPool):
            raise InvalidRequest("the mooncake workload needs a pool with prefix caching "
                                 '(create it with "prefix_caching": {"policy": ...})')
        tpb = pool.tokens_per_block
        try:
            sub_blocks(tpb)
        except InvalidRequest:
            raise InvalidRequest(f"the mooncake workload needs tokens_per_block dividing 512 "
                                 f"(the trace's block), this pool has {tpb}") from None
        trace = load_mooncake(limit=limit)
        capacity = pool.num_blocks * tpb
        strategy = PrefixStrategy(pool, max(1, pool.block_bytes // tpb), capacity, tpb,
                                  prompt_hashes(trace, tpb))
        cfg = SimConfig(strategy="paged", tokens_per_block=tpb, pool_tokens=capacity,
                        max_len=capacity)
        self._sim = Simulator(trace.to_trace(), cfg, pool=pool, strategy=strategy,
                              capacity_tokens=capacity)
        self._target = 0.0
        self._seen = None
        LiveWorkload.__init__(self, pool, "mooncake", speed)

    def summary(self) -> dict:
        out = super().summary()
        served = [r for r in self._sim.requests if r.admitted_at is not None]
        prompts = sum(r.prompt for r in served)
        out["prompt_tokens"] = prompts
        out["prefill_tokens"] = sum(r.computed for r in served)
        out["hit_ratio"] = sum(r.first_cached or 0 for r in served) / prompts if prompts else 0.0
        return out
