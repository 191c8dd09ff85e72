"""GPU-free engines a real router can talk to: N simulated OpenAI-compatible servers in one process.

Each engine is a real kvscope prefix-caching pool (`allocator.PrefixPool`, LRU eviction, blocks
hashed from their token ids as vLLM chains them) under the serving simulator's schedule
(`workloads/simulator.py`, the costs of `workloads.routing.serving.ServingCosts`), run in wall-clock
time: a request queues, is admitted when the batch and the pool have room, prefills only its
uncached tokens, then decodes; its HTTP answer comes when the simulator says it is done (its
first streamed chunk when the prefill ends). So a router in front sees real load and queueing, and
its decisions show up as cache hits or misses in the engines' own counters.

What each engine answers (what sglang-router, vllm-router and Dynamo's frontend probe and send):
`GET /health`, `/health_generate`, `/v1/models`, `/get_server_info` (with `block_size` and
`page_size`), `/get_model_info`, `/metrics` (vLLM's names: `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`, `vllm:cache_config_info`, ...), `POST /v1/completions`,
`/v1/chat/completions` (both with `stream`), `/generate` (SGLang's), `/tokenize`,
`/detokenize` and `/v1/completions/render` (prompt to token ids, as vLLM's render endpoint);
and KV events in vLLM's wire format (PUB + replay ROUTER sockets, `BlockStored` with token ids
and parent hashes, `BlockRemoved`).

Tokens: the engines share one tokenizer, a word tokenizer: a prompt is split on whitespace and
each word is one token whose id is a hash of the word (`token_id`). So the same text is the same
token ids on every engine, and a router that tokenizes (via `/tokenize` or `/render`) sees exactly
what the engine caches. `token_scale` says how many model tokens one such token stands for: the
costs are per model token, so a block of 16 words can play a 512-token trace block.

Times: simulated seconds pass at `speed` times wall-clock seconds from the engines' start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from allocator import InvalidRequest, PrefixPool
from kvevents.pool_publisher import PoolPublisher
from workloads.routing.serving import Replica, ServingCosts, add_cost_flags, costs_from_args
from workloads.simulator import PrefixStrategy, SimConfig
from workloads.simulator import Request as SimRequest
from workloads.trace import Trace

MODEL = "kvscope-sim"
MAX_PROMPT_TOKENS = 1 << 20  # one prompt, in the engine's tokens (a bound before any work)
MAX_OUTPUT_TOKENS = 1 << 16
MAX_BODY = 64 << 20
MAX_SERVED = 1 << 20  # tagged requests an engine remembers (a bound on `served`)
TICK_S = 0.002  # how often the simulators are advanced to the wall clock


@lru_cache(maxsize=1 << 18)
def token_id(word: str) -> int:
    """The id of one word: 31 bits of its BLAKE2b (the same on every engine and every run)."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little") >> 1


TOKENIZERS = ("words", "chars")


def tokenize(text: str, tokenizer: str = "words") -> list[int]:
    """`words`: one token per whitespace-separated word (`token_id`); `chars`: one token per
    character, its code point (what the routing lab's prompts use: workloads/routing/real.py)."""
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        import logging

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


# -- HTTP -----------------------------------------------------------------------------------------
class BadRequest(Exception):
    pass


def _prompt_tokens(engine: SimEngine, body: dict, *keys: str) -> list[int]:
    for key in keys:
        if key in body and body[key] is not None:
            v = body[key]
            if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
                v = v[0]  # a batch of one prompt
            if isinstance(v, str):
                if len(v) > MAX_PROMPT_TOKENS * 16:
                    raise BadRequest(f"{key} is longer than {MAX_PROMPT_TOKENS * 16:,} characters")
                ids = tokenize(v, engine.cfg.tokenizer)
            elif isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) and
                                             0 <= t < 1 << 31 for t in v):
                ids = list(v)
            else:
                raise BadRequest(f"{key} must be a string or a list of token ids (0 <= id < 2^31)")
            if len(ids) > MAX_PROMPT_TOKENS:
                raise BadRequest(f"{key} has {len(ids):,} tokens; at most {MAX_PROMPT_TOKENS:,}")
            return ids
    raise BadRequest(f"the body needs {' or '.join(repr(k) for k in keys)}")


def _chat_text(body: dict) -> str:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list of {role, content}")
    parts = []
    for m in msgs:
        if not isinstance(m, dict):
            raise BadRequest("each message must be an object with role and content")
        c = m.get("content")
        if isinstance(c, list):  # OpenAI content parts
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        if not isinstance(c, str):
            raise BadRequest("a message's content must be a string or a list of text parts")
        parts.append(c)
    return " ".join(parts)


def _max_tokens(body: dict, *keys: str, default: int = 16) -> int:
    for key in keys:
        v = body.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_OUTPUT_TOKENS:
                raise BadRequest(f"{key} must be a whole number 1..{MAX_OUTPUT_TOKENS}, got {v!r}")
            return v
    return default


def build_app(engine: SimEngine):
    """The engine's HTTP API (a Starlette app; FastAPI's validation is not wanted here: these
    endpoints answer what engines answer, including their error shape)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    loop_of = asyncio.get_running_loop
    ids = itertools.count(1)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                             "code": status}, status_code=status)

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the body is larger than {MAX_BODY >> 20} MiB")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def submit(tokens, max_tokens, body: dict) -> Pending:
        tag = body.get("user")
        try:
            return engine.submit(tokens, max_tokens, loop_of(),
                                 tag=tag if isinstance(tag, str) and len(tag) <= 256 else None)
        except InvalidRequest as exc:
            raise BadRequest(str(exc)) from None

    def usage(p: Pending, cached: int) -> dict:
        return {"prompt_tokens": p.prompt_tokens, "completion_tokens": p.output_tokens,
                "total_tokens": p.prompt_tokens + p.output_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def ok(_: Request):
        return Response(status_code=200)

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": engine.cfg.model, "object": "model", "created": 0, "owned_by": "kvscope",
            "max_model_len": engine.cfg.max_len()}]})

    async def server_info(_: Request):
        return JSONResponse(engine.server_info())

    async def model_info(_: Request):
        return JSONResponse({"model_path": engine.cfg.model, "tokenizer_path": engine.cfg.model,
                             "is_generation": True, "served_model_name": engine.cfg.model})

    async def metrics(_: Request):
        return Response(engine.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    async def stats(_: Request):
        return JSONResponse(engine.stats())

    async def tokenize_route(request: Request):
        body = await body_of(request)
        if "messages" in body:
            tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        else:
            tokens = _prompt_tokens(engine, body, "prompt", "text")
        return JSONResponse({"tokens": tokens, "count": len(tokens),
                             "max_model_len": engine.cfg.max_len()})

    async def detokenize_route(request: Request):
        body = await body_of(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BadRequest("tokens must be a list of token ids")
        return JSONResponse({"prompt": detokenize(tokens)})

    async def render(request: Request):
        """vLLM's render endpoints: a `GenerateRequest` (request_id, token_ids, sampling_params,
        model) for a chat, a list of them (one per prompt) for a completion."""
        body = await body_of(request)
        chat = request.url.path.startswith("/v1/chat/")
        if chat:
            tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        else:
            tokens = _prompt_tokens(engine, body, "prompt")
        out = {"request_id": f"render-{engine.cfg.name}-{next(ids)}", "token_ids": tokens,
               "token_offsets": None, "sampling_params": {
                   "max_tokens": _max_tokens(body, "max_completion_tokens", "max_tokens")},
               "model": body.get("model") or engine.cfg.model}
        return JSONResponse(out if chat else [out])

    async def respond(kind: str, p: Pending, stream: bool, name: str):
        """An OpenAI answer: the whole completion when the engine is done, or (stream) a first
        chunk when its prefill ends and the rest when it is done."""
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{engine.cfg.name}-{next(ids)}"
        created = int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if kind == "chat":
                key = "delta" if delta else "message"
                return {"index": 0, key: {"role": "assistant", "content": text},
                        "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        if not stream:
            cached = await p.done
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": name,
                                 "choices": [choice(output_text(p.output_tokens), "length", False)],
                                 "usage": usage(p, cached)})

        async def chunks():
            await p.first
            chunk = obj + ".chunk" if kind == "chat" else obj
            first = {"id": rid, "object": chunk, "created": created, "model": name,
                     "choices": [choice("tok", None, True)]}
            yield f"data: {json.dumps(first)}\n\n".encode()
            cached = await p.done
            rest = output_text(p.output_tokens - 1)
            last = {"id": rid, "object": chunk, "created": created, "model": name,
                    "choices": [choice((" " + rest) if rest else "", "length", True)],
                    "usage": usage(p, cached)}
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def completions(request: Request):
        body = await body_of(request)
        tokens = _prompt_tokens(engine, body, "prompt")
        p = submit(tokens, _max_tokens(body, "max_tokens"), body)
        return await respond("completion", p, bool(body.get("stream")),
                             body.get("model") or engine.cfg.model)

    async def chat(request: Request):
        body = await body_of(request)
        tokens = tokenize(_chat_text(body), engine.cfg.tokenizer)
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise BadRequest(f"the messages have {len(tokens):,} tokens; at most {MAX_PROMPT_TOKENS:,}")
        p = submit(tokens, _max_tokens(body, "max_completion_tokens", "max_tokens"), body)
        return await respond("chat", p, bool(body.get("stream")),
                             body.get("model") or engine.cfg.model)

    async def generate(request: Request):  # SGLang's native API
        body = await body_of(request)
        tokens = _prompt_tokens(engine, body, "input_ids", "text")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        p = submit(tokens, _max_tokens(params, "max_new_tokens"), body)
        cached = await p.done
        return JSONResponse({"text": output_text(p.output_tokens), "meta_info": {
            "id": f"{engine.cfg.name}-{p.rid}", "prompt_tokens": p.prompt_tokens,
            "completion_tokens": p.output_tokens, "cached_tokens": cached,
            "finish_reason": {"type": "length", "length": p.output_tokens}}})

    async def bad_request(_: Request, exc: BadRequest):
        return error(400, str(exc))

    routes = [
        Route("/health", ok), Route("/health_generate", ok), Route("/ping", ok),
        Route("/v1/models", models), Route("/get_server_info", server_info),
        Route("/server_info", server_info), Route("/get_model_info", model_info),
        Route("/model_info", model_info),
        Route("/metrics", metrics), Route("/stats", stats),
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
        Route("/v1/completions/render", render, methods=["POST"]),
        Route("/v1/chat/completions/render", render, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={BadRequest: bad_request})


# -- several engines in one process -------------------------------------------------------------
def _bound_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(512)
    sock.setblocking(False)
    return sock


class SimEngines:
    """N engines on one event loop, in a thread of their own (`start()` / `stop()`, or a context
    manager). Each engine's HTTP server binds `host:port` (port 0: one the system picks; else
    `port + i`); `urls`, `events` say where they are."""

    def __init__(self, configs: list[SimEngineConfig], *, host: str = "127.0.0.1", port: int = 0,
                 speed: float = 1.0, events: bool = True) -> None:
        if not configs:
            raise InvalidRequest("give at least one engine")
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"engine names must differ: {names}")
        self.configs, self.host, self.port, self.speed = configs, host, port, speed
        self.want_events = events
        self.engines: list[SimEngine] = []
        self.urls: list[str] = []
        self._sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    @classmethod
    def uniform(cls, n: int, *, prefix: str = "sim", **engine_kw) -> list[SimEngineConfig]:
        return [SimEngineConfig(f"{prefix}-{i}", **engine_kw) for i in range(n)]

    def start(self, timeout: float = 30.0) -> SimEngines:
        for c in self.configs:
            c.check()
        try:
            for i, _ in enumerate(self.configs):
                self._sockets.append(_bound_socket(self.host, self.port + i if self.port else 0))
        except OSError as exc:
            for s in self._sockets:
                s.close()
            self._sockets.clear()
            raise OSError(exc.errno, f"engine port {self.port + len(self._sockets)} on {self.host}: "
                                     f"{exc.strerror}") from None
        self.urls = [f"http://{self.host}:{s.getsockname()[1]}" for s in self._sockets]
        self._thread = threading.Thread(target=self._run, name="sim-engines", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the simulated engines did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start(); a started thread ends quietly
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        import uvicorn

        self._stop = asyncio.Event()
        t0 = time.monotonic()
        ev = "tcp://127.0.0.1:*" if self.want_events else None
        try:
            self.engines = [SimEngine(c, events_endpoint=ev, replay_endpoint=ev, speed=self.speed,
                                      t0=t0) for c in self.configs]
            tasks = []
            for engine, sock in zip(self.engines, self._sockets):
                # "error": a router's HTTP/2 probe (SGLang's) is a warning per probe otherwise
                config = uvicorn.Config(build_app(engine), log_level="error", lifespan="off",
                                        access_log=False, timeout_keep_alive=30, http="h11")
                server = uvicorn.Server(config)
                server.install_signal_handlers = lambda: None
                self._servers.append(server)
                tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
            ticker = asyncio.create_task(self._tick())
            while not all(s.started for s in self._servers):
                if any(t.done() for t in tasks):
                    for t in tasks:
                        if t.done() and t.exception():
                            raise t.exception()
                    raise RuntimeError("an engine's server stopped while starting")
                await asyncio.sleep(0.01)
            self._ready.set()
            await self._stop.wait()
            for s in self._servers:
                s.should_exit = True
            await asyncio.gather(*tasks, return_exceptions=True)
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        finally:
            for e in self.engines:
                e.close()
            for s in self._sockets:
                s.close()

    async def _tick(self) -> None:
        while True:
            for e in self.engines:
                try:
                    e.advance()
                except Exception as exc:  # a bug: fail that engine's requests, say why, go on
                    e.fail(exc)
            await asyncio.sleep(TICK_S)

    def call(self, fn, timeout: float = 10.0):
        """Run fn() on the engines' loop and return its result (reads state consistently)."""
        if self._loop is None:
            raise RuntimeError("not started")

        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stats(self) -> list[dict]:
        return self.call(lambda: [e.stats() for e in self.engines])

    def events(self) -> list[dict | None]:
        return self.call(lambda: [e.events_info() for e in self.engines])

    def stop(self, timeout: float = 30.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> SimEngines:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- `kvscope sim-engines` -------------------------------------------------------------------------
PROG = "kvscope sim-engines"


def parse(argv: list[str]):
    import argparse

    p = argparse.ArgumentParser(prog=PROG, description=(
        "Run N simulated OpenAI-compatible engines (no GPU, no model): each a real prefix-caching "
        "pool under the serving simulator's costs, with vLLM's /metrics and KV events. Put a real "
        "router in front of them (e.g. smg launch --worker-urls URL... --policy cache_aware)."))
    p.add_argument("--engines", type=int, default=4, help="how many (default 4, at most 64)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0,
                   help="engine i listens on PORT+i (default 0: ports the system picks, printed)")
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks per engine (default 4096)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--token-scale", type=int, default=1,
                   help="model tokens one prompt word stands for, for the costs (default 1)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    add_cost_flags(p, "engine")
    p.add_argument("--fleet-file", metavar="FILE.json",
                   help="write the engines as a kvscope fleet file (kvscope serve --fleet FILE.json)")
    args = p.parse_args(argv)
    if not 1 <= args.engines <= 64:
        p.error("--engines must be 1..64")
    if not 0 <= args.port <= 65535 - args.engines:
        p.error(f"--port must be 0..{65535 - args.engines}")
    if not (math.isfinite(args.speed) and args.speed > 0):
        p.error("--speed must be a positive number")
    try:
        args.costs = costs_from_args(args)
    except InvalidRequest as exc:
        p.error(str(exc))
    return args


def fleet_file(engines: SimEngines, name: str = "sim") -> dict:
    """The engines as a kvscope fleet file (the format of `kvscope serve --fleet`)."""
    out = []
    for cfg, url, ev in zip(engines.configs, engines.urls, engines.events()):
        row = {"name": cfg.name, "endpoint": ev["endpoint"], "replay_endpoint": ev["replay_endpoint"],
               "metrics_url": url + "/metrics", "block_size": cfg.block_size,
               "num_blocks": cfg.num_blocks}
        out.append(row)
    return {"name": name, "engines": out}


def main(argv: list[str]) -> int:
    import signal
    import sys

    args = parse(argv)
    try:
        costs = args.costs
        configs = SimEngines.uniform(args.engines, num_blocks=args.num_blocks,
                                     block_size=args.block_size, token_scale=args.token_scale,
                                     costs=costs)
        engines = SimEngines(configs, host=args.host, port=args.port, speed=args.speed).start()
    except (InvalidRequest, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        for cfg, url, ev in zip(configs, engines.urls, engines.events()):
            print(f"{cfg.name}  {url}  events {ev['endpoint']}  replay {ev['replay_endpoint']}",
                  flush=True)
        if args.fleet_file:
            with open(args.fleet_file, "w") as f:
                json.dump(fleet_file(engines), f, indent=1)
            print(f"{PROG}: fleet file {args.fleet_file} (kvscope serve --fleet {args.fleet_file})",
                  flush=True)
        print(f"{PROG}: {args.engines} engines up; Ctrl-C stops them", flush=True)
        done.wait()
    finally:
        engines.stop()
    return 0
