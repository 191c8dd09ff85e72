"""Live workloads: a scenario or a trace replay driven step by step against a server's pool.

The contract the server calls (app/ never reaches further into workloads/):

    wl = build_live_workload(pool, {"kind": "scenario", "name": "chat", "seed": 0, "speed": 1.0})
    wl = build_live_workload(pool, {"kind": "trace", "limit": 500, "speed": 1.0})
    wl = build_live_workload(prefix_pool, {"kind": "mooncake", "limit": 500, "speed": 1.0})
    while wl.advance(dt_s):      # run what `dt_s` wall seconds hold at `speed`; False once done
        ...
    wl.progress()                # {name, kind, state: running|finished|stopped, done, total}
    wl.stop()                    # frees what the workload still holds

Each `advance` does bounded work (at most `MAX_OPS_PER_ADVANCE` pool calls), so a slow pool or
a huge speed makes the workload lag, never block the server. Scenario speed 1.0 runs about 25-50
ops/s; trace speed 1.0 replays the trace in real time (simulated seconds per wall second).

Ownership: a workload frees every raw allocation it made when it finishes or is stopped, so the
pool is left as it was found. Cache entries written by the chat scenario stay in the cache: they
are ordinary evictable entries, and the hit-rate picture they leave is the point of the demo.
Allocations that vanish under the workload (someone reset the pool) are counted as `lost` and
forgotten, never an error.

The Mooncake workload (`MooncakeWorkload`) is the live trace workload with `PrefixStrategy`: the
trace's requests, with their prompt block hashes, into a prefix-caching pool, so sharing, hits
and eviction show on the dashboard. Each admission opens a sequence by the prompt's block
hashes (`tokens_per_block` of the pool, a divisor of 512), decode appends, completion closes and
leaves the prompt's blocks cached. Speed 1.0 replays in real time (the trace spans about an
hour); requests longer than the whole pool are skipped.
"""

from __future__ import annotations

import math

from allocator import InvalidRequest, Pool, PrefixPool

from .mooncake import load_mooncake, sub_blocks
from .prefix_sim import prompt_hashes
from .report import strategy_report
from .scenarios import Geometry, OpRunner, drive, estimate_ops, make_scenario
from .simulator import PagedStrategy, PrefixStrategy, SimConfig, Simulator
from .spec import WorkloadSpec
from .trace import load_trace

MAX_OPS_PER_ADVANCE = 2000


class LiveWorkload:
    """Base: a named workload with a state machine running -> finished | stopped."""

    kind = "base"

    def __init__(self, pool: Pool, name: str, speed: float) -> None:
        self.pool = pool
        self.name = name
        self.speed = speed
        self.state = "running"
        self._event("running")

    def advance(self, dt_s: float) -> bool:
        """Run what `dt_s` wall seconds hold at this speed. Returns False when finished."""
        if self.state != "running":
            return False
        if not isinstance(dt_s, (int, float)) or not math.isfinite(dt_s) or dt_s < 0:
            raise InvalidRequest(f"dt_s must be a finite number >= 0, got {dt_s!r}")
        if self._step(float(dt_s) * self.speed):
            return True
        self._release()
        self.state = "finished"
        self._event("finished")
        return False

    def stop(self) -> None:
        """Stop now and free every allocation the workload still holds (idempotent)."""
        if self.state == "running":
            self._release()
            self.state = "stopped"
            self._event("stopped")

    def progress(self) -> dict:
        """`done` of `total` steps. While running, done < total always (`total` may be an
        estimate that grows when exceeded); once finished, done == total == the steps run."""
        done, total = self._counts()
        if self.state == "finished":
            total = done
        elif self.state == "running":
            total = max(total, done + 1)
        else:
            total = max(total, done)
        return {"name": self.name, "kind": self.kind, "state": self.state,
                "done": done, "total": total}

    def _event(self, state: str) -> None:
        p = self.progress()
        self.pool.events.record("workload", self.name, state, p["done"], p["total"])

    # -- subclass hooks ---------------------------------------------------------------------
    def _step(self, sim_seconds: float) -> bool:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _counts(self) -> tuple[int, int]:
        raise NotImplementedError


class ScenarioWorkload(LiveWorkload):
    """A scenario generator paced by its ops' `dt` (simulated seconds before each op)."""

    kind = "scenario"

    def __init__(self, pool: Pool, name: str, seed: int, speed: float) -> None:
        geo = Geometry.of(pool)
        if name == "chat" and pool.cache is None:
            raise InvalidRequest("the chat scenario needs a pool with a cache")
        self._gen = make_scenario(name, seed, geo)
        self._runner = OpRunner(pool)
        self._total = estimate_ops(name, geo)
        self._pending = None
        self._clock = 0.0  # simulated seconds elapsed
        self._due = 0.0  # when the pending op runs
        self._done = False
        super().__init__(pool, name, speed)

    def _step(self, sim_seconds: float) -> bool:
        self._clock += sim_seconds
        budget = MAX_OPS_PER_ADVANCE
        while budget > 0 and not self._done:
            if self._pending is None:
                self._pending, self._done = drive(self._gen, self._runner, max_ops=0)
                if self._done:
                    break
                self._due += self._pending.dt
            if self._due > self._clock:
                return True
            op = self._pending
            self._pending, self._done = drive(self._gen, self._runner, max_ops=1, pending=op)
            budget -= 1
            if self._pending is not None:
                self._due += self._pending.dt
        if budget == 0 and not self._done:
            self._clock = min(self._clock, self._due)  # lagging: do not bank unbounded time
        return not self._done

    def _release(self) -> None:
        self._runner.release_all()
        self._gen.close()

    def _counts(self) -> tuple[int, int]:
        done = self._runner.ops
        if done >= self._total:  # the estimate was exceeded (e.g. the pool was reset): grow it
            self._total = done + max(16, done // 4)
        return done, self._total

    def summary(self) -> dict:
        return self._runner.summary()


class TraceWorkload(LiveWorkload):
    """Trace replay on the live pool with its own strategy: allocate the context, extend as each
    block boundary is crossed (the pool sees every token by then), free on completion.

    Sizes: the pool's model geometry gives bytes per token; a pool without one is taken as 16
    tokens per block. Requests longer than the pool (or the model's max length) are skipped.
    """

    kind = "trace"

    def __init__(self, pool: Pool, limit: int, speed: float) -> None:
        trace = load_trace(limit=limit)
        tb = pool.bytes_per_token or max(1, pool.block_bytes // 16)
        tpb = max(1, pool.block_bytes // tb)
        capacity = pool.capacity_bytes // tb // tpb * tpb
        max_len = min(capacity, pool.model.max_tokens) if pool.model else capacity
        strategy = PagedStrategy(pool, tb, max_len, tpb)
        cfg = SimConfig(strategy="paged", tokens_per_block=tpb, pool_tokens=capacity, max_len=max_len)
        self._sim = Simulator(trace, cfg, pool=pool, strategy=strategy, capacity_tokens=capacity)
        self._target = 0.0
        self._seen = None
        super().__init__(pool, "trace", speed)

    def _step(self, sim_seconds: float) -> bool:
        sim = self._sim
        self._target += sim_seconds
        seen = (self.pool.used_blocks, len(self.pool))
        if seen != self._seen:  # others may have freed memory: retry a blocked admission
            sim.memory_changed()
            self._seen = seen
        more = sim.run_until(self._target, max_calls=MAX_OPS_PER_ADVANCE)
        if sim.now < self._target - 60:  # lagging by a minute: do not bank unbounded time
            self._target = sim.now + 60
        self._seen = (self.pool.used_blocks, len(self.pool))
        return more

    def _release(self) -> None:
        self._sim.release_running()

    def _counts(self) -> tuple[int, int]:
        c = self._sim.counters
        return c.completed + c.lost + c.rejected_too_long, len(self._sim.requests)

    def summary(self) -> dict:
        return strategy_report(self._sim)


class MooncakeWorkload(TraceWorkload):
    """Mooncake trace replay on a live prefix-caching pool (the module docstring's last part)."""

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


def build_live_workload(pool: Pool, spec: dict | WorkloadSpec) -> LiveWorkload:
    """A workload for `pool` from a spec (see the module docstring; a dict is parsed by
    `WorkloadSpec.parse`). Raises InvalidRequest."""
    if not isinstance(spec, WorkloadSpec):
        spec = WorkloadSpec.parse(spec)
    if spec.kind == "scenario":
        return ScenarioWorkload(pool, spec.name, spec.seed, spec.speed)
    if spec.kind == "mooncake":
        return MooncakeWorkload(pool, spec.limit, spec.speed)
    return TraceWorkload(pool, spec.limit, spec.speed)
