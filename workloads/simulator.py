"""A small serving simulator: replay a trace of requests through a real allocator pool.

Model (iteration-level batching, as in Orca and vLLM):

- A request arrives at its trace timestamp and joins a FCFS queue. The head of the queue is
  admitted when the batch has room (`max_batch`) and the strategy can reserve its memory; a
  request behind a blocked head waits (no overtaking).
- Admission runs the prefill: the request's context (prompt) tokens are allocated and the clock
  advances by `prefill_token_s` per context token (the whole batch stalls meanwhile).
- Each decode step, every running request produces one token and its KV grows by one token.
  A step takes `step_base_s + step_seq_s * batch` seconds. After `GeneratedTokens` steps the
  request completes and frees everything it holds. Its final length is context + generated.
- When growth fails for lack of memory, the running request that arrived last is preempted
  (freed, requeued at the head of the queue, and recomputed later: its re-admission allocates
  and prefills everything it had so far), repeatedly until the growth succeeds; vLLM's
  recompute preemption.

Strategies (each drives a real `allocator` pool):

- `paged`: a `PagedPool` of `tokens_per_block`-token blocks; allocates the context's blocks,
  extends by one block whenever a token crosses a block boundary.
- `contiguous-max`: a `ContiguousPool` with one unit per token; reserves `max_len` tokens (the
  model's maximum length) up front, as systems without paging must.
- `contiguous-pow2`: reserves the next power of two >= context + 1 tokens; when the request
  outgrows it, doubles it with `extend` (in place when the neighbour is free, else a real move).
- `contiguous-oracle`: reserves exactly context + generated tokens (knows the output length).

NOTE: the pools hold `sim_bytes_per_token` bytes (default 1) per token rather than the model's
128 KiB, so the full trace needs kilobytes, not tens of GiB, while every allocation, extend,
move and free goes through the real allocator bookkeeping. Reports scale memory back to the
model's bytes (`tokens * model.bytes_per_token`).

NOTE: between events nothing but the token counts changes, so the simulator jumps from event to
event (an arrival, a request crossing its reservation boundary, a completion) and integrates the
linear growth in closed form: no Python work per token, only per block.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from allocator import (
    ContiguousPool,
    InvalidRequest,
    NotFound,
    OutOfMemory,
    PagedPool,
    Pool,
    get_model,
    positive_int,
)

from .trace import Trace

# How the simulator reserves a request's KV memory: paged blocks on demand, or one contiguous
# extent sized to the max length, the next power of two, or (oracle) the true final length. Not
# the allocator's strategies (allocator/vocab.py): these are serving-engine reservation schemes,
# named by SimConfig.strategy and `kvscope replay --strategies`.
RESERVATIONS = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle")
GIB = 1 << 30
# How time passes. "linear": a prefill costs `prefill_token_s` per computed token and a decode
# step `step_base_s + step_seq_s * batch`. "dynosim": the timing of Dynamo's mocker engine, which
# DynoSim replays with (ai-dynamo `lib/mocker/src/common/perf_model.rs`, `PerfModel::Polynomial`):
# a prefill of t new tokens (over the batch) takes 4.209989e-07 t^2 + 1.518344e-02 t + 16.50142
# ms, in chunks of at most DYNOSIM_CHUNK tokens (its scheduler's token budget per step), and a
# decode step max(1, -25.74 p^2 + 54.01 p + 5.74) ms with p the running requests' tokens over the
# KV capacity (at most 1).
COST_MODELS = ("linear", "dynosim")
DYNOSIM_CHUNK = 8192


def dynosim_prefill_s(tokens: int) -> float:
    """The mocker's prefill time for `tokens` new tokens, chunk by chunk (seconds)."""
    def chunk_ms(t: float) -> float:
        return 4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01
    full, rest = divmod(tokens, DYNOSIM_CHUNK)
    ms = full * chunk_ms(DYNOSIM_CHUNK) + (chunk_ms(rest) if rest else 0.0)
    return ms / 1000.0


def dynosim_step_s(active_tokens: int, capacity_tokens: int) -> float:
    """The mocker's decode step with `active_tokens` in the batch (seconds)."""
    p = min(1.0, active_tokens / capacity_tokens) if capacity_tokens > 0 else 1.0
    return max(1.0, -25.74 * p * p + 54.01 * p + 5.74) / 1000.0
FINISH, GROW = 0, 1  # event kinds; at one step, completions run first so growth sees their memory


@dataclass(slots=True)
class SimConfig:
    """Parameters of one replay. Times are simulated seconds.

    Default step costs are a rough Llama-3-8B-on-one-A100 shape (about 12 ms per decode step
    plus 0.15 ms per running sequence; prefill about 20,000 tokens/s); they set how fast
    simulated time passes, not which strategy wins.
    """

    strategy: str = "paged"  # one of RESERVATIONS
    model: str = "llama-3-8b"
    pool_tokens: int | None = None  # KV pool size in tokens; default from pool_gib
    pool_gib: float = 40.0  # KV pool size in GiB of the model's KV (used when pool_tokens is None)
    tokens_per_block: int = 16
    max_len: int | None = None  # the model's max sequence length (default: the preset's)
    max_batch: int = 256
    step_base_s: float = 0.012
    step_seq_s: float = 0.00015
    prefill_token_s: float = 0.00005
    fit: str = "first"
    sim_bytes_per_token: int = 1
    # "linear": the costs above; "dynosim": Dynamo's mocker's polynomials (`COST_MODELS`)
    cost_model: str = "linear"

    def validate(self) -> None:
        if self.cost_model not in COST_MODELS:
            raise InvalidRequest(f"unknown cost model {self.cost_model!r}; choose from {list(COST_MODELS)}")
        if self.strategy not in RESERVATIONS:
            raise InvalidRequest(f"unknown strategy {self.strategy!r}; choose from {list(RESERVATIONS)}")
        geometry = get_model(self.model)
        for name in ("tokens_per_block", "max_batch", "sim_bytes_per_token", "max_len", "pool_tokens"):
            value = getattr(self, name)
            if value is not None or name not in ("max_len", "pool_tokens"):
                positive_int(value, name)
        if self.pool_tokens is None and not (self.pool_gib > 0):
            raise InvalidRequest(f"pool_gib must be positive, got {self.pool_gib!r}")
        if self.capacity_tokens() < self.max_length():
            raise InvalidRequest(
                f"the pool ({self.capacity_tokens()} tokens) must hold one max-length sequence "
                f"({self.max_length()} tokens of {geometry.name})"
            )

    def max_length(self) -> int:
        return self.max_len or get_model(self.model).max_tokens

    def capacity_tokens(self) -> int:
        """Pool size in tokens, a whole number of blocks (the same for every strategy)."""
        tokens = self.pool_tokens
        if tokens is None:
            tokens = int(self.pool_gib * GIB) // get_model(self.model).bytes_per_token
        return tokens // self.tokens_per_block * self.tokens_per_block

    def to_dict(self) -> dict:
        return asdict(self)


class Request:
    """One trace request as it moves through the simulator (all lengths in tokens).

    `context` is what its next (re)admission allocates: the prompt, or after a preemption the
    prompt plus everything generated so far (recomputed). `length_at(step) = context + step - s0`.
    """

    __slots__ = ("rid", "arrival", "prompt", "final", "context", "s0", "cap", "recorded", "aid",
                 "epoch", "admitted_at", "finished_at", "preemptions", "finish_step", "cached",
                 "computed", "first_cached")

    def __init__(self, rid: int, arrival: float, prompt: int, generated: int) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.final = prompt + generated
        self.context = prompt
        self.s0 = 0
        self.cap = 0  # tokens the current reservation holds
        self.recorded = 0  # tokens the pool was told about (its requested bytes)
        self.aid = 0
        self.epoch = 0  # bumped on preemption: heap events of older epochs are stale
        self.admitted_at: float | None = None  # first admission (simulated s)
        self.finished_at: float | None = None
        self.preemptions = 0
        self.finish_step = 0
        self.cached = 0  # context tokens found in a prefix cache at the latest admission
        self.computed = 0  # prefill tokens computed, over every admission
        self.first_cached: int | None = None  # cached tokens at the first admission


# -- strategies: how a request's reservation is taken and grown on a real pool ----------------
class Strategy:
    """Reserve, grow and release a request's KV memory on `pool`. Sizes in tokens.

    `admit` and `grow` raise OutOfMemory (the pool unchanged); `cap` is what the request's
    reservation holds afterwards. `growth_at` is the length that needs the next growth, or None.
    """

    name = "base"

    def __init__(self, pool: Pool, token_bytes: int, max_len: int) -> None:
        self.pool = pool
        self.tb = token_bytes
        self.max_len = max_len
        self.moved_tokens = 0
        self.calls = 0  # pool calls made: the live workload caps them per advance

    def initial(self, r: Request) -> int:
        raise NotImplementedError

    def admit(self, r: Request) -> None:
        cap = self.initial(r)
        self.calls += 1
        r.aid = self.pool.allocate(self.reserve_bytes(r, cap))
        r.cap = cap

    def reserve_bytes(self, r: Request, cap: int) -> int:
        r.recorded = cap
        return cap * self.tb

    def growth_at(self, r: Request) -> int | None:
        return r.cap + 1 if r.cap < r.final else None

    def grow(self, r: Request, length: int) -> None:
        raise NotImplementedError

    def release(self, r: Request) -> None:
        self.calls += 1
        self.pool.free(r.aid)


class PagedStrategy(Strategy):
    """Blocks on demand: the context's blocks at admission, one more per boundary crossed."""

    name = "paged"

    def __init__(self, pool: Pool, token_bytes: int, max_len: int, tokens_per_block: int) -> None:
        super().__init__(pool, token_bytes, max_len)
        self.tpb = tokens_per_block

    def initial(self, r: Request) -> int:
        return -(-r.context // self.tpb) * self.tpb

    def reserve_bytes(self, r: Request, cap: int) -> int:
        r.recorded = r.context  # the pool sees the tokens really held: its internal fragmentation is exact
        return r.context * self.tb

    def grow(self, r: Request, length: int) -> None:
        self.calls += 1
        self.pool.extend(r.aid, (length - r.recorded) * self.tb)
        r.recorded = length
        r.cap = -(-length // self.tpb) * self.tpb


class PrefixStrategy(PagedStrategy):
    """Paged blocks through a prefix-caching pool (`allocator.PrefixPool`): admission opens a
    sequence named by the prompt's block hashes, so a cached prefix is shared, not allocated,
    and its tokens are not prefilled again; decode appends; completion closes (the prompt's
    blocks stay cached, evictable when idle).

    `hashes(rid)` gives the hashes of request rid's full prompt blocks. Generated tokens carry
    no hashes (the trace has none), so a preempted request re-admits its prompt from the cache
    and recomputes what it had generated. At least one token is always computed (the next
    token needs a forward pass, as vLLM recomputes a fully cached prompt's last token).
    """

    name = "prefix"

    def __init__(self, pool: Pool, token_bytes: int, max_len: int, tokens_per_block: int,
                 hashes) -> None:
        super().__init__(pool, token_bytes, max_len, tokens_per_block)
        self.hashes = hashes

    def open(self, r: Request):
        """Open request r's prompt on the pool (named by its block hashes here)."""
        return self.pool.open_sequence(block_hashes=self.hashes(r.rid), num_tokens=r.prompt)

    def extend(self, aid: int, n: int) -> None:
        """Append n tokens the request generated (they carry no hashes here: not cached)."""
        self.pool.append(aid, num_tokens=n)

    def admit(self, r: Request) -> None:
        pool = self.pool
        self.calls += 1
        info = self.open(r)
        if r.context > r.prompt:
            try:
                self.calls += 1
                self.extend(info.id, r.context - r.prompt)
            except OutOfMemory:
                pool.close_sequence(info.id)
                raise
        r.aid = info.id
        r.cached = min(info.cached_tokens, r.context - 1)
        r.recorded = r.context
        r.cap = -(-r.context // self.tpb) * self.tpb

    def grow(self, r: Request, length: int) -> None:
        self.calls += 1
        self.extend(r.aid, length - r.recorded)
        r.recorded = length
        r.cap = -(-length // self.tpb) * self.tpb

    def release(self, r: Request) -> None:
        self.calls += 1
        self.pool.close_sequence(r.aid)


class MaxStrategy(Strategy):
    name = "contiguous-max"

    def initial(self, r: Request) -> int:
        return self.max_len


class OracleStrategy(Strategy):
    name = "contiguous-oracle"

    def initial(self, r: Request) -> int:
        return r.final


class Pow2Strategy(Strategy):
    """Next power of two >= context + 1 (capped at max_len); doubles when outgrown."""

    name = "contiguous-pow2"

    def initial(self, r: Request) -> int:
        return min(1 << r.context.bit_length(), self.max_len)

    def grow(self, r: Request, length: int) -> None:
        new_cap = r.cap
        while new_cap < length:
            new_cap = min(new_cap * 2, self.max_len)
        self.calls += 1
        if self.pool.extend(r.aid, (new_cap - r.cap) * self.tb):
            self.moved_tokens += r.cap
        r.recorded = r.cap = new_cap


def build_pool_and_strategy(cfg: SimConfig) -> tuple[Pool, Strategy]:
    """A CPU pool of `capacity_tokens` tokens at `sim_bytes_per_token` bytes each."""
    cfg.validate()
    tb = cfg.sim_bytes_per_token
    tokens = cfg.capacity_tokens()
    max_len = cfg.max_length()
    kw = dict(device="cpu", name=cfg.strategy, event_capacity=1)
    if cfg.strategy == "paged":
        pool = PagedPool(tokens // cfg.tokens_per_block, cfg.tokens_per_block * tb, **kw)
        return pool, PagedStrategy(pool, tb, max_len, cfg.tokens_per_block)
    pool = ContiguousPool(tokens, tb, fit=cfg.fit, **kw)
    cls = {"contiguous-max": MaxStrategy, "contiguous-oracle": OracleStrategy,
           "contiguous-pow2": Pow2Strategy}[cfg.strategy]
    return pool, cls(pool, tb, max_len)


@dataclass(slots=True)
class Integrals:
    """Time integrals (token * seconds) of the memory classes; shares are ratios of them."""

    token_states: float = 0.0  # KV slots holding a computed token
    reserved: float = 0.0  # allocated slots this request will fill before it completes
    internal: float = 0.0  # allocated slots it will never fill
    allocated: float = 0.0
    external: float = 0.0  # free slots while the queue head waits with cause "fragmentation"
    capacity: float = 0.0
    batch: float = 0.0  # running requests * seconds
    seconds: float = 0.0


@dataclass(slots=True)
class Counters:
    arrived: int = 0
    admitted: int = 0
    completed: int = 0
    rejected_too_long: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    blocked_admissions: dict = field(default_factory=lambda: {"capacity": 0, "fragmentation": 0})
    failed_growths: dict = field(default_factory=lambda: {"capacity": 0, "fragmentation": 0})
    lost: int = 0  # live only: allocations that vanished under us (pool reset by someone else)
    steps: int = 0


class Simulator:
    """Event-driven replay of `trace` on one strategy. `run()` offline, `run_until(t)` live.

    Invariants: `running` holds admitted requests in admission order, each with exactly one
    live (current-epoch) event on the heap; `_alloc` / `_minfill` are the sums over running
    requests of `cap` and `min(cap, final)`; `_tokens` is their summed length at step `_tok_step`.
    """

    def __init__(self, trace: Trace, cfg: SimConfig | None = None, *,
                 pool: Pool | None = None, strategy: Strategy | None = None,
                 capacity_tokens: int | None = None) -> None:
        self.cfg = cfg or SimConfig()
        if pool is None:
            pool, strategy = build_pool_and_strategy(self.cfg)
            capacity_tokens = self.cfg.capacity_tokens()
        self.pool, self.strategy = pool, strategy
        self.capacity_tokens = capacity_tokens
        max_len = strategy.max_len
        self.requests = [
            Request(i, a, c, g) for i, (a, c, g) in enumerate(zip(
                trace.arrival_s.tolist(), trace.context.tolist(), trace.generated.tolist()))
        ]
        self.too_long = [r for r in self.requests if r.final > max_len]
        self.counters = Counters(rejected_too_long=len(self.too_long))
        self._arrivals = deque(r for r in self.requests if r.final <= max_len)
        self.integrals = Integrals()
        self.queue: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._heap: list[tuple[int, int, int, int]] = []
        self.step = 0
        self.now = 0.0
        self._tokens = 0
        self._tok_step = 0
        self._alloc = 0
        self._minfill = 0
        self._blocked_frag = False
        self._retry = True  # memory or the queue head changed since the last failed admission
        self.wall_s = 0.0

    # -- public --------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return len(self.requests) - len(self.too_long)

    @property
    def finished(self) -> bool:
        return not (self._arrivals or self.queue or self.running)

    # -- for a live driver (workloads/live.py) ----------------------------------------------
    def memory_changed(self) -> None:
        """Someone else freed or took pool memory: retry a blocked admission at the next step."""
        self._retry = True

    def release_running(self) -> int:
        """Take every running request out of the batch and free its memory (a stopped live
        replay leaves the pool as it found it); returns how many were running."""
        running = list(self.running.values())
        for r in running:
            self._remove(r)
            self._release(r)
        return len(running)

    def run(self, progress=None) -> Simulator:
        """Replay to the end. `progress(done, total)` is called now and then."""
        t0 = time.perf_counter()
        last = 0
        while not self.finished:
            before = (self.step, self.now, self.strategy.calls)
            self.run_until(math.inf, max_calls=20_000)
            if (self.step, self.now, self.strategy.calls) == before:
                raise RuntimeError(f"replay stuck: queue head {self.queue[0].rid} never fits")
            if progress is not None and self.counters.completed - last >= 200:
                last = self.counters.completed
                progress(last, self.total)
        if progress is not None:
            progress(self.counters.completed, self.total)
        self.wall_s += time.perf_counter() - t0
        return self

    def run_until(self, t_end: float, max_calls: int | None = None) -> bool:
        """Advance until simulated time `t_end` (stopping at a step boundary before it), or
        until `max_calls` pool calls were made. Returns False once everything has completed."""
        strategy = self.strategy
        calls_end = None if max_calls is None else strategy.calls + max_calls
        arrivals, heap = self._arrivals, self._heap
        cfg = self.cfg
        while True:
            self._enqueue_arrivals()
            self._admit()
            if calls_end is not None and strategy.calls >= calls_end:
                return not self.finished
            batch = len(self.running)
            if batch == 0:
                if not arrivals:
                    return not self.finished
                nxt = arrivals[0].arrival
                if nxt > t_end:
                    self._idle(t_end - self.now)
                    return True
                self._idle(nxt - self.now)
                continue
            while heap[0][3] != self.requests[heap[0][2]].epoch or heap[0][2] not in self.running:
                heapq.heappop(heap)
            if cfg.cost_model == "dynosim":
                step_s = dynosim_step_s(self._tokens + batch * (self.step - self._tok_step),
                                        self.capacity_tokens)
            else:
                step_s = cfg.step_base_s + cfg.step_seq_s * batch
            k = heap[0][0] - self.step
            if arrivals:
                k = min(k, max(1, math.ceil((arrivals[0].arrival - self.now) / step_s)))
            if k > 0 and t_end != math.inf:
                k = min(k, int((t_end - self.now) / step_s))
                if k <= 0:
                    return True
            self._advance(k, step_s, batch)
            self._events()

    # -- the loop's parts ----------------------------------------------------------------------
    def _enqueue_arrivals(self) -> None:
        arrivals, now = self._arrivals, self.now
        while arrivals and arrivals[0].arrival <= now:
            r = arrivals.popleft()
            if not self.queue:
                self._retry = True
            self.queue.append(r)
            self.counters.arrived += 1

    def _idle(self, seconds: float) -> None:
        if seconds > 0:
            self._integrate(seconds, 0)
            self.now += seconds

    def _integrate(self, seconds: float, growth: int) -> None:
        """Add `seconds` of the current state; token states grow by `growth` token-seconds."""
        ig = self.integrals
        tokens = self._tokens + len(self.running) * (self.step - self._tok_step)
        ig.token_states += tokens * seconds + growth
        ig.reserved += (self._minfill - tokens) * seconds - growth
        ig.internal += (self._alloc - self._minfill) * seconds
        ig.allocated += self._alloc * seconds
        ig.capacity += self.capacity_tokens * seconds
        ig.batch += len(self.running) * seconds
        ig.seconds += seconds
        if self._blocked_frag:
            ig.external += (self.capacity_tokens - self._alloc) * seconds

    def _advance(self, k: int, step_s: float, batch: int) -> None:
        # During step j (1..k) each running request holds one more token than at the start.
        self._integrate(k * step_s, batch * step_s * k * (k + 1) / 2)
        self.step += k
        self.now += k * step_s
        self.counters.steps += k

    def _sync_tokens(self) -> None:
        self._tokens += len(self.running) * (self.step - self._tok_step)
        self._tok_step = self.step

    def _events(self) -> None:
        heap, step, reqs, running = self._heap, self.step, self.requests, self.running
        while heap and heap[0][0] == step:
            _, kind, rid, epoch = heapq.heappop(heap)
            r = reqs[rid]
            if r.epoch != epoch or rid not in running:
                continue
            if kind == GROW and not self._grow(r):
                continue
            if step == r.finish_step:
                self._finish(r)
            else:
                self._schedule(r)

    def _schedule(self, r: Request) -> None:
        at = self.strategy.growth_at(r)
        grow_step = None if at is None else r.s0 + at - r.context
        if grow_step is not None and grow_step <= r.finish_step:
            heapq.heappush(self._heap, (grow_step, GROW, r.rid, r.epoch))
        else:
            heapq.heappush(self._heap, (r.finish_step, FINISH, r.rid, r.epoch))

    def _grow(self, r: Request) -> bool:
        """Grow `r` to its length now, preempting the latest arrivals while memory lacks.
        Returns False when `r` itself was preempted (or lost)."""
        length = r.context + self.step - r.s0
        while True:
            old_cap = r.cap
            try:
                self.strategy.grow(r, length)
            except OutOfMemory as exc:
                self.counters.failed_growths[exc.cause] += 1
                victim = self.running[max(self.running)]
                self._preempt(victim)
                if victim is r:
                    return False
                continue
            except NotFound:
                self._lose(r)
                return False
            self._alloc += r.cap - old_cap
            self._minfill += min(r.cap, r.final) - min(old_cap, r.final)
            return True

    def _remove(self, r: Request) -> int:
        """Take `r` out of the batch; returns its length now."""
        self._sync_tokens()
        length = r.context + self.step - r.s0
        del self.running[r.rid]
        self._tokens -= length
        self._alloc -= r.cap
        self._minfill -= min(r.cap, r.final)
        r.epoch += 1
        self._retry = True
        return length

    def _release(self, r: Request) -> None:
        try:
            self.strategy.release(r)
        except NotFound:
            self.counters.lost += 1

    def _finish(self, r: Request) -> None:
        self._remove(r)
        self._release(r)
        r.finished_at = self.now
        self.counters.completed += 1

    def _preempt(self, r: Request) -> None:
        length = self._remove(r)
        self._release(r)
        r.context = length
        r.preemptions += 1
        self.counters.preemptions += 1
        self.counters.recomputed_tokens += length
        self.queue.appendleft(r)

    def _lose(self, r: Request) -> None:
        self._remove(r)
        self.counters.lost += 1
        r.finished_at = self.now

    def _admit(self) -> None:
        if not self._retry or not self.queue:
            return
        self._retry = False
        queue, running, strategy = self.queue, self.running, self.strategy
        prefill = 0
        while queue and len(running) < self.cfg.max_batch:
            r = queue[0]
            try:
                strategy.admit(r)
            except OutOfMemory as exc:
                self.counters.blocked_admissions[exc.cause] += 1
                self._blocked_frag = exc.cause == "fragmentation"
                break
            queue.popleft()
            self._blocked_frag = False
            self._sync_tokens()
            r.s0 = self.step
            r.finish_step = self.step + r.final - r.context
            if r.admitted_at is None:
                r.admitted_at = self.now
                self.counters.admitted += 1
            running[r.rid] = r
            self._tokens += r.context
            self._alloc += r.cap
            self._minfill += min(r.cap, r.final)
            computed = r.context - r.cached
            r.computed += computed
            if r.first_cached is None:
                r.first_cached = r.cached
            prefill += computed
            self._schedule(r)
        if not queue:
            self._blocked_frag = False
        if prefill:
            if self.cfg.cost_model == "dynosim":
                seconds = dynosim_prefill_s(prefill)
            else:
                seconds = prefill * self.cfg.prefill_token_s
            self._integrate(seconds, 0)
            self.now += seconds


def simulate(trace: Trace, cfg: SimConfig | None = None, progress=None) -> Simulator:
    """Replay `trace` to the end with `cfg` and return the finished simulator."""
    return Simulator(trace, cfg).run(progress)
