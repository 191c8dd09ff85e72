"""`kvscope route --router sglang|vllm`: a trace through a real router in front of simulated engines.

The routers are the real ones, started from their packages (workloads/routing/real_router.py: `smg
launch` of sglang-router, vllm-router), in front of N simulated engines of this process
(app/engines/sim.py: a real prefix-caching pool each, LRU, 512-token blocks of `capacity_tokens`,
the serving simulator's costs, `--speed` times real time). The trace is replayed as real HTTP
requests at its timestamps divided by the speed, as many in flight as arrive, each prompt made
from the trace's block ids so that a block is the same text wherever it appears
(`workloads.routing.real_prompts.prompt_text`: one character per token; the engines tokenize by
character). Which engine served a request is recorded at the engine (the body's `user` names the
request), never taken from the router.

Reported, as a `kvscope route` row: `hit_ratio` from the decision log (each request's cached tokens
at its first admission, over the prompt tokens) beside `engine_hit_ratio` from the engines' own
counters (`vllm:prefix_cache_hits` over `_queries`, which also count a preempted request's
re-admission), `available_hit_ratio` (what the engine holding the longest prefix had when the
request arrived), TTFT p50 / p99 (simulated seconds, at the engines), `imbalance` and the
requests per engine. Every request's decision goes to the decision log (`rule` `router`: the real
router decided; the candidates are each engine's cached leading blocks and its requests in
flight when the request arrived).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from allocator._prefix import block_hash, root_hash

from allocator import InvalidRequest
from workloads.mooncake import load_mooncake
from workloads.routing import dynosim, make_policy
from workloads.routing.bounds import bound_key, compute_bounds, with_bounds
from workloads.routing.decisions import DecisionLog
from workloads.routing.policies import BLOCK_TOKENS, prefix_run
from workloads.routing.real_prompts import prompt_text
from workloads.routing.real_router import RealRouter, RouterError, RouterUnavailable, router_kind
from workloads.routing.serving import MAX_LEN, ServingCosts, add_cost_flags, costs_from_args, run_serving

from .sim import SimEngines

MAX_IN_FLIGHT = 512  # requests the replay holds open at once (each is a thread and two sockets)


def _hashes(tokens: list[int]) -> list[int]:
    """The full blocks' hashes of `tokens` as the engines' pools chain them (no salt)."""
    out, parent = [], root_hash(None)
    for i in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = block_hash(parent, tokens[i:i + BLOCK_TOKENS])
        out.append(parent)
    return out


def _post(host: str, port: int, body: bytes, timeout: float) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


class RouterSession:
    """N simulated engines behind one real router, every request's decision logged as the engines
    see it: when a request tagged `r<i>` (the body's `user`, i its line of the trace) arrives at
    an engine, that engine served it, and each engine's cached leading blocks and requests in
    flight then are its candidates; its first token sets the tokens it found cached.
    `router`: sglang, vllm (cache_aware) or vllm-kv (vllm-router's kv_aware, fed the engines' KV
    events). `start()` / `close()`, or a context manager. The engines publish KV events when
    `events` (a fleet can follow them) and always for vllm-kv."""

    def __init__(self, router: str, configs: list, *, speed: float = 1.0,
                 decisions: DecisionLog | None = None, events: bool = False) -> None:
        self.router = router
        self.kv_aware = router == "vllm-kv"  # vllm-router's kv_aware: it follows the KV events
        self.kind = router_kind("vllm" if self.kv_aware else router)  # unknown or missing: raises
        if any(c.block_size != BLOCK_TOKENS for c in configs):
            raise InvalidRequest(f"engines behind a router use {BLOCK_TOKENS}-token blocks")
        self.engines = SimEngines(configs, speed=speed, events=events or self.kv_aware)
        self.log = decisions
        self.arrivals: dict[str, tuple] = {}  # tag -> (matches, loads) on every engine
        self.rt: RealRouter | None = None

    @property
    def url(self) -> str:
        return self.rt.url if self.rt is not None else ""

    def start(self) -> RouterSession:
        engines = self.engines
        engines.start()
        try:
            index = {id(e): k for k, e in enumerate(engines.engines)}
            engines.call(lambda: [setattr(e, "on_arrival", self._arrived) or
                                  setattr(e, "on_first", self._first) for e in engines.engines])
            self._index = index
            args: tuple[str, ...] = ()
            if self.kv_aware:
                for u, e in zip(engines.urls, engines.events()):  # one flag per engine
                    args += ("--kv-event-source", f"{u}={e['endpoint']}",
                             "--kv-event-replay-source", f"{u}={e['replay_endpoint']}")
                args += ("--kv-event-block-size", str(BLOCK_TOKENS), "--kv-event-model", "kvscope-sim")
            self.rt = RealRouter("vllm" if self.kv_aware else self.router, engines.urls,
                                 policy="kv_aware" if self.kv_aware else "cache_aware",
                                 args=args).start()
        except BaseException:
            self.close()
            raise
        return self

    def _arrived(self, engine, tag: str, tokens: list[int]) -> None:
        """On the engines' loop, as a tagged request arrives at `engine`."""
        es = self.engines.engines
        matches = tuple(prefix_run(_hashes(tokens), e.pool.core.index) for e in es)
        loads = tuple(e.running() + e.waiting() for e in es)
        self.arrivals[tag] = (matches, loads)
        i = _request_of(tag)
        if self.log is not None and i is not None:
            k = self._index[id(engine)]
            best = max(matches)
            self.log.add_record(i, k, "router", f"the real {self.router} router chose engine {k}",
                                matches, loads, None, best, None,
                                min(BLOCK_TOKENS * best, len(tokens) - 1))

    def _first(self, engine, tag: str, cached: int) -> None:
        i = _request_of(tag)
        if self.log is not None and i is not None:
            self.log.captured(i, cached)

    def log_tail(self, chars: int = 200_000) -> str:
        return self.rt.log_tail(chars) if self.rt is not None else ""

    def close(self) -> None:
        if self.rt is not None:
            self.rt.close()
        self.engines.stop()

    def __enter__(self) -> RouterSession:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _request_of(tag: str) -> int | None:
    """The trace line a tag `r<i>` names, or None for another tag."""
    if tag[:1] == "r" and tag[1:].isdigit() and len(tag) < 12:
        return int(tag[1:])
    return None


def router_engines(n: int, capacity_tokens: int, costs: ServingCosts | None = None,
                   prefix: str = "engine") -> list:
    """N simulated engines as `kvscope route --router` runs them: `capacity_tokens` each in
    512-token blocks, tokenizing by character (`prompt_text`), under `costs`."""
    blocks = capacity_tokens // BLOCK_TOKENS
    if blocks < 1:
        raise InvalidRequest(f"capacity_tokens must hold one {BLOCK_TOKENS}-token block")
    return SimEngines.uniform(n, prefix=prefix, num_blocks=blocks, block_size=BLOCK_TOKENS,
                              tokenizer="chars", costs=costs or ServingCosts(),
                              max_model_len=min(MAX_LEN, blocks * BLOCK_TOKENS))


def run_router(trace, *, router: str, n: int, capacity_tokens: int, speed: float,
               costs: ServingCosts | None = None, decisions: DecisionLog | None = None,
               progress=None, timeout_s: float = 600.0) -> dict:
    """Replay `trace` through the real `router` over n simulated engines; returns the row."""
    if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
        raise InvalidRequest(f"--speed must be a positive number, got {speed!r}")
    costs = costs or ServingCosts()
    configs = router_engines(n, capacity_tokens, costs)
    with RouterSession(router, configs, speed=speed, decisions=decisions) as session:
        host, port = session.url.removeprefix("http://").rsplit(":", 1)
        rows = replay(trace, host, int(port), speed, configs[0].max_len(), progress, timeout_s)
        engines = session.engines
        served = engines.call(lambda: [dict(e.served) for e in engines.engines], timeout=60)
        stats = engines.stats()
        log_tail = session.log_tail()
    row = figures(trace, router, n, capacity_tokens, speed, rows, served, stats,
                  session.arrivals, costs)
    row["router_fell_back_to_load"] = "load-only" in log_tail.lower()
    return row


def replay(trace, host: str, port: int, speed: float, max_len: int, progress=None,
           timeout_s: float = 600.0, stop=None) -> dict:
    """Send `trace` to the router at host:port at its timestamps over `speed`, as many in flight
    as arrive (at most MAX_IN_FLIGHT); `stop` (an Event) ends it early. Returns the failures,
    the requests too long for the engines, and the wall clock it took."""
    ids, offsets = trace.hash_ids.tolist(), trace.offsets.tolist()
    arrival = trace.arrival_s.tolist()
    inputs, outputs = trace.input_length.tolist(), trace.output_length.tolist()
    failed: list[str] = []
    skipped = 0
    lock = threading.Lock()
    slots = threading.Semaphore(MAX_IN_FLIGHT)

    def send(i: int, body: bytes) -> None:
        try:
            status = _post(host, port, body, timeout_s)
            if status != 200:
                with lock:
                    failed.append(f"request {i}: HTTP {status}")
        except OSError as exc:
            with lock:
                failed.append(f"request {i}: {exc}")
        finally:
            slots.release()

    t0 = time.monotonic()
    with ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="route-replay") as pool:
        for i in range(len(trace)):
            out = max(1, outputs[i])
            if inputs[i] + out > max_len:
                skipped += 1
                continue
            due = t0 + (arrival[i] - arrival[0]) / speed
            wait = due - time.monotonic()
            if stop is not None and (stop.wait(max(0.0, wait)) or stop.is_set()):
                break
            if stop is None and wait > 0:
                time.sleep(wait)
            prompt = prompt_text(ids[offsets[i]:offsets[i + 1]], inputs[i])
            body = json.dumps({"model": "kvscope-sim", "prompt": prompt, "max_tokens": out,
                               "user": f"r{i}"}).encode()
            slots.acquire()
            pool.submit(send, i, body)
            if progress is not None and i % 64 == 0:
                progress(i, len(trace))
    if progress is not None:
        progress(len(trace), len(trace))
    return {"failed": failed, "skipped": skipped, "wall_s": time.monotonic() - t0}


def figures(trace, router, n, capacity_tokens, speed, rows, served, stats, arrivals,
            costs) -> dict:
    """A `kvscope route` row from what the engines recorded (`served`, `stats`, `arrivals`)."""
    wall = rows["wall_s"]
    inputs = trace.input_length.tolist()
    engine_of: dict[int, int] = {}
    for e, got in enumerate(served):
        for tag in got:
            engine_of[int(tag[1:])] = e
    hits = prompts = available = 0
    ttft: list[float] = []
    per_engine_tokens = [0] * n
    per_engine_requests = [0] * n
    for i in sorted(engine_of):
        e = engine_of[i]
        rec = served[e][f"r{i}"]
        matches, loads = arrivals.get(f"r{i}", ((0,) * n, (0,) * n))
        best = max(matches)
        avail = min(BLOCK_TOKENS * best, inputs[i] - 1)
        cached = rec["cached"]
        prompts += inputs[i]
        hits += cached or 0
        available += avail
        per_engine_tokens[e] += inputs[i]
        per_engine_requests[e] += 1
        if rec["first_token_s"] is not None:
            ttft.append(rec["first_token_s"] - rec["arrival_s"])
    mean = sum(per_engine_tokens) / n
    queries = sum(s["prefix_cache_queries"] for s in stats)
    engine_hits = sum(s["prefix_cache_hits"] for s in stats)
    t = np.sort(np.asarray(ttft, dtype=np.float64))

    def pct(q: float) -> float:
        return float(np.percentile(t, q)) if len(t) else 0.0
    return {"policy": f"router:{router}", "replicas": n, "capacity_tokens": capacity_tokens,
            "mode": "router", "hit_ratio": hits / prompts if prompts else 0.0,
            "engine_hit_ratio": engine_hits / queries if queries else 0.0,
            "available_hit_ratio": available / prompts if prompts else 0.0,
            "imbalance": max(per_engine_tokens) / mean if mean else 0.0,
            "ttft_p50_s": pct(50), "ttft_p99_s": pct(99),
            "completed": sum(s["completed"] for s in stats), "routed": len(engine_of),
            "failed": len(rows["failed"]), "first_failures": rows["failed"][:5],
            "rejected_too_long": rows["skipped"], "hit_tokens": hits, "prompt_tokens": prompts,
            "replica_requests": per_engine_requests, "replica_input_tokens": per_engine_tokens,
            "preemptions": sum(s["preemptions"] for s in stats), "speed": speed,
            "wall_s": wall, "costs": costs.to_dict()}


# -- `kvscope route --router ...` ------------------------------------------------------------------
PROG = "kvscope route --router"


def _fmt(x) -> str:
    return "" if x is None else f"{x:.3f}"


def router_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Replay a Mooncake trace through a real router (sglang-router or vllm-router, "
        "cache_aware, or vllm-router's kv_aware) in front of N simulated engines (real prefix caches, the serving "
        "simulator's costs), and report the hit ratio from the engines' own counters, TTFT and "
        "imbalance, beside the lab's model of that router on the same requests."))
    p.add_argument("--router", required=True, help=(
        "sglang or vllm (cache_aware), or vllm-kv (vllm-router's kv_aware on the engines' KV "
        "events; the lab's model is vllm_kv_aware), or dynamo (Dynamo's KV router in its own "
        "offline replay, DynoSim, over Dynamo's mocker engines: no HTTP, simulated time)"))
    p.add_argument("--trace", help="Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--replicas", type=int, default=4, help="engines (default 4)")
    p.add_argument("--capacity-tokens", type=float, default=1_000_000,
                   help="KV tokens per engine (default 1,000,000)")
    p.add_argument("--limit", type=int, help="replay only the first N requests")
    p.add_argument("--speed", type=float, default=None,
                   help="times real time (default: the trace in about 60 s of wall clock)")
    p.add_argument("--decisions", metavar="FILE.jsonl", help="write every decision (docs/ROUTING.md#decisions)")
    p.add_argument("--out", default="reports/route", help="output directory (route_router.json)")
    add_cost_flags(p, "engine")
    args = p.parse_args(argv)
    try:
        label = args.router
        if label == "dynamo":
            why = dynosim.available()
            if why:
                raise InvalidRequest(why)
            kind = None
        else:
            kind = router_kind("vllm" if label == "vllm-kv" else label)
            model_name = kind.model_of("kv_aware" if label == "vllm-kv" else "cache_aware")
        if not 1 <= args.replicas <= 64:
            raise InvalidRequest(f"--replicas must be 1..64, got {args.replicas}")
        capacity = int(args.capacity_tokens)
        if capacity < BLOCK_TOKENS or capacity != args.capacity_tokens:
            raise InvalidRequest(f"--capacity-tokens must be a whole number >= {BLOCK_TOKENS}")
        if args.limit is not None and args.limit < 1:
            raise InvalidRequest(f"--limit must be at least 1, got {args.limit}")
        costs = costs_from_args(args)
        costs.check()
        trace = load_mooncake(args.trace, limit=args.limit)
        span = float(trace.arrival_s[-1] - trace.arrival_s[0])
        speed = args.speed if args.speed is not None else max(1.0, span / 60.0)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        log = DecisionLog(f"router:{label}", args.replicas, capacity) if args.decisions else None
        decisions_file = open(args.decisions, "w") if args.decisions else None  # noqa: SIM115
    except (InvalidRequest, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        if kind is None:  # Dynamo's own replay, in simulated time
            print(f"{PROG}: {len(trace):,} requests through Dynamo's KV router in DynoSim "
                  f"(ai-dynamo-runtime) over {args.replicas} mocker engines of {capacity:,} "
                  "tokens", flush=True)
            row = dynosim.run_dynosim(trace, args.replicas, capacity, "kv_router", log)
            model_name = "dynamo_kv"
        else:
            print(f"{PROG}: {len(trace):,} requests through the real {label} router "
                  f"({kind.package}) over {args.replicas} simulated engines of {capacity:,} "
                  f"tokens, at {speed:g}x real time", flush=True)
            row = run_router(trace, router=label, n=args.replicas, capacity_tokens=capacity,
                             speed=speed, costs=costs, decisions=log)
        model = run_serving(trace, args.replicas, capacity, make_policy(model_name, args.replicas),
                            costs)
    except (RouterError, RouterUnavailable, InvalidRequest) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidRequest) else 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        if decisions_file is not None:
            if log is not None:
                log.write_jsonl(decisions_file)
            decisions_file.close()
    row = with_bounds(row, compute_bounds(trace, bound_key("serving", args.replicas, capacity)))
    row["model"] = {"policy": model_name, **{k: model[k] for k in (
        "hit_ratio", "available_hit_ratio", "imbalance", "ttft_p50_s", "ttft_p99_s")}}
    (out / "route_router.json").write_text(json.dumps(row, indent=1) + "\n")
    table = (f"| | hit ratio | engines' counters | available | TTFT p50 | TTFT p99 | imbalance |\n"
             f"|---|---:|---:|---:|---:|---:|---:|\n"
             f"| {'Dynamo KV router (DynoSim)' if kind is None else f'real {label} router'} | "
             f"{row['hit_ratio']:.3f} | {_fmt(row.get('engine_hit_ratio'))} | "
             f"{_fmt(row['available_hit_ratio'])} | {row['ttft_p50_s']:.2f} s | "
             f"{row['ttft_p99_s']:.2f} s | {row['imbalance']:.2f} |")
    table += (f"\n| lab model `{model_name}` (serving mode) | {model['hit_ratio']:.3f} | | "
              f"{model['available_hit_ratio']:.3f} | {model['ttft_p50_s']:.2f} s | "
              f"{model['ttft_p99_s']:.2f} s | {model['imbalance']:.2f} |")
    print(table)
    print(f"bounds: pooled Belady {row['pooled_bound_hit_ratio']:.3f}, infinite cache "
          f"{row['infinite_bound_hit_ratio']:.3f}; the real router reaches "
          f"{row['of_pooled_bound']:.0%} of the pooled bound" if row["of_pooled_bound"] is not None
          else "bounds: nothing in this trace could be hit")
    if row.get("router_fell_back_to_load"):
        print(f"{PROG}: the router's log says it fell back to load-only scoring", file=sys.stderr)
    print(f"{row['routed']:,} routed, {row['failed']} failed, {row.get('rejected_too_long', 0)} "
          f"too long; requests per engine {row['replica_requests']}; {row['wall_s']:.1f} s of "
          "wall clock")
    if row["failed"]:
        print(f"{PROG}: failures: {'; '.join(row['first_failures'])}", file=sys.stderr)
    if args.decisions:
        print(f"wrote {len(log):,} decisions to {args.decisions}")
    print(f"wrote {out / 'route_router.json'}")
    return 1 if row["failed"] else 0
