"""One simulated engine's state: a real kvscope prefix-caching pool (`allocator.PrefixPool`, LRU
eviction, blocks hashed from their token ids as vLLM chains them) under the serving simulator's
schedule (`workloads/simulator.py`, the costs of `workloads.routing.serving.ServingCosts`), run in
wall-clock time: a request queues, is admitted when the batch and the pool have room, prefills
only its uncached tokens, then decodes; its futures resolve when the simulator says its first
token is out and when it is done. Its counters, vLLM's /metrics series (`SimEngine.collect`) and
its KV events (kvscope's `PoolPublisher`, vLLM's wire: PUB + replay ROUTER sockets, `BlockStored`
with token ids and parent hashes, `BlockRemoved`) are read from here; the HTTP API is
`sim_http.py`, N engines on one loop `sim.py`.

Tokens: the engines share one tokenizer, a word tokenizer: a prompt is split on whitespace and
each word is one token whose id is a hash of the word (`token_id`). So the same text is the same
token ids on every engine, and a router that tokenizes (via `/tokenize` or `/render`) sees exactly
what the engine caches. `token_scale` says how many model tokens one such token stands for: the
costs are per model token, so a block of 16 words can play a 512-token trace block.

Times: simulated seconds pass at `speed` times wall-clock seconds from the engines' start.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from allocator import InvalidRequest, PrefixPool
from kvevents.pool_publisher import PoolPublisher
from workloads.routing.serving import Replica, ServingCosts
from workloads.simulator import PrefixStrategy, SimConfig
from workloads.simulator import Request as SimRequest
from workloads.trace import Trace

MODEL = "kvscope-sim"
MAX_PROMPT_TOKENS = 1 << 20  # one prompt, in the engine's tokens (a bound before any work)
MAX_OUTPUT_TOKENS = 1 << 16
MAX_SERVED = 1 << 20  # tagged requests an engine remembers (a bound on `served`)


@lru_cache(maxsize=1 << 18)
def token_id(word: str) -> int:
    """The id of one word: 31 bits of its BLAKE2b (the same on every engine and every run)."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") >> 1


TOKENIZERS = ("words", "chars")


def tokenize(text: str, tokenizer: str = "words") -> list[int]:
    """`words`: one token per whitespace-separated word (`token_id`); `chars`: one token per
    character, its code point (what the routing lab's prompts use: workloads/routing/real_prompts.py)."""
    if tokenizer == "chars":
        return [ord(c) for c in text]
    return [token_id(w) for w in text.split()]


def detokenize(ids: Iterable[int]) -> str:
    return " ".join(f"t{int(i)}" for i in ids)


OUTPUT_WORD = "tok"  # every generated token is this word


def output_text(n: int) -> str:
    return " ".join(itertools.repeat(OUTPUT_WORD, n))


OUTPUT_TOKEN = token_id(OUTPUT_WORD)


@dataclass
class SimEngineConfig:
    """One simulated engine. `num_blocks` blocks of `block_size` tokens; `costs` (by default
    DynoSim's, per token), `token_scale` model tokens per engine token (linear costs only);
    `max_model_len` in engine tokens (default: the whole pool)."""

    name: str
    num_blocks: int = 4096
    block_size: int = 16
    token_scale: int = 1
    costs: ServingCosts = field(default_factory=ServingCosts)
    max_model_len: int | None = None
    model: str = MODEL
    tokenizer: str = "words"  # or "chars" (TOKENIZERS)

    def check(self) -> None:
        for key in ("num_blocks", "block_size", "token_scale"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequest(f"{key} must be a whole number >= 1, got {v!r}")
        if self.tokenizer not in TOKENIZERS:
            raise InvalidRequest(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.num_blocks > 1 << 22:
            raise InvalidRequest(f"num_blocks is at most {1 << 22:,}, got {self.num_blocks:,}")
        self.costs.check()
        if self.token_scale != 1 and self.costs.model != "linear":
            raise InvalidRequest(f"token_scale {self.token_scale} scales the linear costs; with the "
                                 f"{self.costs.model} costs every token is a model token (use "
                                 "costs linear, or token_scale 1)")

    def max_len(self) -> int:
        return self.max_model_len or self.num_blocks * self.block_size


class _TokenStrategy(PrefixStrategy):
    """The simulator's prefix strategy, opening each sequence with its token ids: the pool hashes
    the full blocks (its stored events then carry the tokens, as vLLM's do). A preempted request
    is opened again from its tokens at re-admission, its generated tokens appended after."""

    def __init__(self, pool, max_len: int, block_size: int) -> None:
        super().__init__(pool, 1, max_len, block_size, hashes=None)
        self.tokens: dict[int, list[int]] = {}

    def open(self, r):
        return self.pool.open_sequence(tokens=self.tokens[r.rid])

    def extend(self, aid: int, n: int) -> None:
        """The generated tokens (each the word `tok`) join the sequence; the blocks they fill
        are cached, as vLLM caches a request's full output blocks."""
        self.pool.append(aid, tokens=[OUTPUT_TOKEN] * n)

    def forget(self, rid: int) -> None:
        """Request rid is done (a preempted one is released, then admitted again: its tokens
        stay until it completes)."""
        self.tokens.pop(rid, None)


class Pending:
    """One request inside an engine: its futures resolve on the engine's loop."""

    __slots__ = ("rid", "prompt_tokens", "output_tokens", "first", "done")

    def __init__(self, rid: int, prompt_tokens: int, output_tokens: int, loop) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.first = loop.create_future()  # cached tokens at its first admission
        self.done = loop.create_future()


class SimEngine:
    """One engine's state: the pool, the simulator, its counters, its KV-event publisher. Used
    on one event loop (the HTTP handlers and the ticker share it); nothing here blocks."""

    def __init__(self, cfg: SimEngineConfig, *, events_endpoint: str | None = "tcp://127.0.0.1:*",
                 replay_endpoint: str | None = "tcp://127.0.0.1:*", speed: float = 1.0,
                 t0: float | None = None) -> None:
        cfg.check()
        if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
            raise InvalidRequest(f"speed must be a positive number, got {speed!r}")
        self.cfg = cfg
        self.speed = float(speed)
        self.t0 = time.monotonic() if t0 is None else t0
        bs, scale, c = cfg.block_size, cfg.token_scale, cfg.costs
        self.pool = PrefixPool(cfg.num_blocks, bs, tokens_per_block=bs, policy="lru",
                               device="cpu", name=cfg.name, event_capacity=1 << 16)
        max_len = cfg.max_len()
        self.strategy = _TokenStrategy(self.pool, max_len, bs)
        sim_cfg = SimConfig(strategy="paged", pool_tokens=cfg.num_blocks * bs, max_len=max_len,
                            tokens_per_block=bs, max_batch=c.max_batch,
                            step_base_s=c.step_base_s * scale, step_seq_s=c.step_seq_s * scale,
                            prefill_token_s=c.prefill_token_s * scale, cost_model=c.model)
        sim_cfg.validate()
        empty = Trace(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.sim = Replica(empty, sim_cfg, pool=self.pool, strategy=self.strategy,
                           capacity_tokens=cfg.num_blocks * bs, on_finished=self._finished)
        self.pending: dict[int, Pending] = {}
        self._rids = itertools.count()
        self.publisher = None
        if events_endpoint is not None:
            self.publisher = PoolPublisher(self.pool, events_endpoint, replay_endpoint=replay_endpoint)
        self.counts = {"requests": 0, "completed": 0, "prompt_tokens": 0, "generation_tokens": 0,
                       "refused": 0}
        self.ttft: list[float] = []
        self.errors = 0
        self.served: dict[str, dict] = {}  # tag -> arrival, first token, cached tokens
        self.tags: dict[int, str] = {}  # request id -> tag, until it is done
        self.on_arrival = None  # called with (engine, tag, tokens) as a tagged request arrives
        self.on_first = None  # called with (engine, tag, cached tokens) at its first token
        self._registry = CollectorRegistry()
        self._registry.register(self)

    # -- time ---------------------------------------------------------------------------------
    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def advance(self) -> float:
        """Run the simulator to now: resolve first tokens and completions, publish KV events.
        Returns the simulated time it ran to."""
        sim = self.sim
        t = self.now()
        # the simulator's clock runs ahead of the wall through a prefill (it charges the whole
        # stall at once): never ask it to run to a time it has passed
        sim.run_until(max(t, sim.now))
        prefills = sim.prefills
        while prefills and prefills[0][0] <= t:
            _, rid = prefills.popleft()
            p = self.pending.get(rid)
            if p is not None and not p.first.done():
                req = sim.requests[rid]
                self.ttft.append(sim.first_token[rid] - req.arrival)
                self._note_first(rid, sim.first_token[rid], req.first_cached or 0)
                p.first.set_result(req.first_cached or 0)
        if self.publisher is not None:
            self.publisher.flush()
        return t

    def _finished(self, rid: int) -> None:
        self.strategy.forget(rid)
        p = self.pending.pop(rid, None)
        if p is None:
            return
        self.counts["completed"] += 1
        self.counts["generation_tokens"] += p.output_tokens
        req = self.sim.requests[rid]
        if not p.first.done():  # a first token and the end in the same step
            first = self.sim.first_token.get(rid, req.finished_at)
            self.ttft.append(first - req.arrival)
            self._note_first(rid, first, req.first_cached or 0)
            p.first.set_result(req.first_cached or 0)
        self.tags.pop(rid, None)
        if not p.done.done():
            p.done.set_result(req.first_cached or 0)

    # -- requests ------------------------------------------------------------------------------
    def submit(self, tokens: list[int], max_tokens: int, loop, tag: str | None = None) -> Pending:
        """Queue a request now. Raises InvalidRequest (nothing queued) when it cannot fit.
        `tag` (the body's `user`) names it in `served`, with what it found and when."""
        n = len(tokens)
        if n < 1:
            raise InvalidRequest("the prompt is empty: send at least one token")
        if not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
            raise InvalidRequest(f"max_tokens must be 1..{MAX_OUTPUT_TOKENS}, got {max_tokens}")
        limit = self.cfg.max_len()
        if n + max_tokens > limit:
            self.counts["refused"] += 1
            raise InvalidRequest(
                f"this model's maximum context length is {limit} tokens; the prompt has {n} "
                f"and max_tokens asks {max_tokens} more")
        t = self.advance()  # the request arrives now, after everything due before it
        sim = self.sim
        rid = next(self._rids)
        # arrives now, even while the simulator's clock is ahead (inside a prefill stall): the
        # wait for that stall is part of its time to first token
        req = SimRequest(rid, t, n, max_tokens)
        self.strategy.tokens[rid] = tokens
        sim.requests.append(req)
        sim._arrivals.append(req)
        p = Pending(rid, n, max_tokens, loop)
        self.pending[rid] = p
        if tag is not None and len(self.served) < MAX_SERVED:
            if self.on_arrival is not None:
                self.on_arrival(self, tag, tokens)
            self.tags[rid] = tag
            self.served[tag] = {"arrival_s": req.arrival, "first_token_s": None, "cached": None}
        self.counts["requests"] += 1
        self.counts["prompt_tokens"] += n
        return p

    def _note_first(self, rid: int, at: float, cached: int) -> None:
        tag = self.tags.get(rid)
        if tag is not None:
            self.served[tag].update(first_token_s=at, cached=cached)
            if self.on_first is not None:
                self.on_first(self, tag, cached)

    # -- what routers read ---------------------------------------------------------------------
    def kv_usage(self) -> float:
        core = self.pool.core
        return 1.0 - (core.free_top + core.n_evictable) / self.pool.num_blocks

    def running(self) -> int:
        return len(self.sim.running)

    def waiting(self) -> int:
        return len(self.sim.queue) + len(self.sim._arrivals)

    def server_info(self) -> dict:
        cfg = self.cfg
        return {"model_path": cfg.model, "served_model_name": cfg.model, "tokenizer_path": cfg.model,
                "block_size": cfg.block_size, "page_size": cfg.block_size,
                "num_gpu_blocks": cfg.num_blocks, "max_total_num_tokens": cfg.num_blocks * cfg.block_size,
                "max_model_len": cfg.max_len(), "context_length": cfg.max_len(),
                "kv_events": self.events_info(), "engine": "kvscope-sim", "name": cfg.name}

    def events_info(self) -> dict | None:
        if self.publisher is None:
            return None
        pub = self.publisher.publisher
        return {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint, "topic": pub.topic}

    def stats(self) -> dict:
        p = self.pool.prefix_stats()
        ttft = np.sort(np.asarray(self.ttft, dtype=np.float64))
        return {"name": self.cfg.name, **self.counts, "running": self.running(),
                "waiting": self.waiting(), "kv_usage": self.kv_usage(),
                "prefix_cache_queries": p["queries"], "prefix_cache_hits": p["hits"],
                "hit_ratio": p["hit_ratio"], "cached_blocks": p["cached_hashes"],
                "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else None,
                "preemptions": self.sim.counters.preemptions, "errors": self.errors,
                "simulated_s": self.sim.now}

    def collect(self):
        """The engine's series under vLLM's names (a prometheus_client collector)."""
        cfg, p = self.cfg, self.pool.prefix_stats()
        labels, values = ["model_name", "engine"], [cfg.model, "0"]
        info = GaugeMetricFamily("vllm:cache_config_info", "the KV cache's configuration",
                                 labels=["block_size", "num_gpu_blocks", "enable_prefix_caching",
                                         "engine"])
        info.add_metric([str(cfg.block_size), str(cfg.num_blocks), "True", "0"], 1)
        yield info
        for name, doc, value in (
                ("vllm:num_requests_running", "requests in the batch", self.running()),
                ("vllm:num_requests_waiting", "requests queued", self.waiting()),
                ("vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", self.kv_usage())):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            yield g
        for name, doc, value in (
                ("vllm:prefix_cache_queries", "prompt tokens looked up", p["queries"]),
                ("vllm:prefix_cache_hits", "prompt tokens found cached", p["hits"]),
                ("vllm:prompt_tokens", "prompt tokens", self.counts["prompt_tokens"]),
                ("vllm:generation_tokens", "generated tokens", self.counts["generation_tokens"]),
                ("vllm:request_success", "requests completed", self.counts["completed"])):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            yield c

    def metrics_text(self) -> bytes:
        return generate_latest(self._registry)

    def fail(self, exc: BaseException) -> None:
        """The simulator raised (a bug): every request in it fails with that error; the engine
        starts over empty so later requests are served."""
        logging.getLogger("kvscope.sim").error("engine %s: %r", self.cfg.name, exc, exc_info=exc)
        for p in self.pending.values():
            for f in (p.first, p.done):
                if not f.done():
                    f.set_exception(RuntimeError(f"engine {self.cfg.name} failed: {exc!r}"))
        self.pending.clear()
        self.sim._arrivals.clear()
        self.sim.queue.clear()
        self.sim.release_running()
        self.errors += 1

    def close(self) -> None:
        for p in self.pending.values():
            for f in (p.first, p.done):
                if not f.done():
                    f.cancel()
        self.pending.clear()
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
