"""A Mooncake trace through a real router, one request at a time, and the agreement of its
decisions with the lab's model of it.

The parts, usable apart: `real_router.py` (`RealRouter`: SGLang's or vLLM's router binary as a
subprocess), `real_workers.py` (`HoldingWorkers`: workers that hold every request open;
`BlockEvents`: their KV events, for vLLM's `kv_aware`) and `real_prompts.py` (a trace request's
blocks as text, one character per token).

`replay(trace, n, kind)` puts them together and returns, per request, the worker that served
it as its position in the router's order, the index a lab policy returns (`RealReplay`), with
when each request was sent. With `policy="kv_aware"` each request's blocks are published by
the worker that received it, and the next request waits until the router's debug log shows it
read them and decided (`RealRouter.wait_log`); the router's credited tokens come back too.
`agreement()` (and `python -m workloads.routing.real`) compares those picks with the lab's
model of the router in sequence mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from allocator import InvalidRequest

from ..mooncake import load_mooncake
from .policies import BLOCK_TOKENS
from .real_prompts import prompt_text
from .real_router import RealRouter, RouterError, router_kind, router_version
from .real_workers import KV_LOG, MODEL_ID, BlockEvents, HoldingWorkers, prompt_digest
from .registry import make_policy
from .sequence import no_gc, run_sequence
from .sequence import requests as trace_requests
from .vllm_kv import credited_blocks

FDS_PER_REQUEST = 2  # a held request keeps two sockets open in the router, two here
FDS_SPARE = 256


def check_open_files(requests: int) -> None:
    """Raise this process's open-file limit to its hard limit (the router inherits it), and
    InvalidRequest when holding `requests` requests open would still not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and FDS_PER_REQUEST * requests + FDS_SPARE > soft:
        most = (soft - FDS_SPARE) // FDS_PER_REQUEST
        raise InvalidRequest(f"holding {requests:,} requests open needs about "
                             f"{FDS_PER_REQUEST * requests + FDS_SPARE:,} open files; this "
                             f"system allows {soft:,} (ulimit -n): route at most {most:,}")


@dataclass
class RealReplay:
    """What a real router did with a trace: `picks[i]` is the worker that served request i, as
    its position in the router's worker order (`order`, the workers' urls)."""

    router: str
    version: str
    n: int
    order: list[str]
    picks: list[int] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)  # the router's loads at the end
    sent_s: list[float] = field(default_factory=list)  # request i sent, s after the launch
    ready_s: float = 0.0  # when the router first listed its workers healthy, s after the launch
    policy: str = "cache_aware"
    credited: list[int] = field(default_factory=list)  # kv_aware: tokens it credited, each


def replay(trace, n: int, kind: str, *, limit: int | None = None, args: tuple[str, ...] = (),
           request_timeout_s: float = 30.0,
           not_before_s: dict[int, float] | None = None,
           policy: str = "cache_aware") -> RealReplay:
    """Send `trace`'s first `limit` requests (all by default) one at a time through a fresh
    `kind` router over n fresh holding workers: each request goes out once the previous one
    reached its worker. Raises RouterError when a request does not reach a worker in time.

    `not_before_s[i]`: request i is not sent before that many seconds after the router was
    ready (to let a wall-clock eviction happen between two requests, say).

    `policy` `kv_aware` (vLLM's router): the workers publish KV events (`BlockEvents`): once a
    request reached its worker, that worker stores the request's full blocks, and the next
    request goes out once the router has read them, so the router's index is the workers'
    caches as the lab's sequence mode has them (unbounded).

    The replay runs with the cyclic garbage collector paused (`no_gc`): the holding workers
    answer in this process, and vLLM's router waits about 1 s for a worker's `/tokenize` before
    it routes the prompt without its token ids (measured: a 1.5 s answer changes its picks, a
    0.5 s one does not). A full collection over a heap holding numpy, torch and the held
    requests takes ~0.2 s of CPU on an idle machine, seconds on a loaded one; one that lands
    while the router waits is a wrong pick, and the picks after it can differ. What a replay
    allocates is bounded (`check_open_files`)."""

    version = router_version(kind)
    kind_ = router_kind(kind)
    total = len(trace) if limit is None else min(limit, len(trace))
    check_open_files(total)
    reqs = [r for r, _ in zip(trace_requests(trace), range(total))]
    prompts = (prompt_text(r.blocks, r.tokens) for r in reqs)
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_gc())
        workers = stack.enter_context(HoldingWorkers(n))
        on_pick = events = None
        if policy == "kv_aware":
            kind_.model_of(policy)  # a router with a kv_aware the lab models
            events = stack.enter_context(BlockEvents(workers.urls))
            args = (*events.args(), *args)
        router = stack.enter_context(RealRouter(kind, workers.urls, args=args, policy=policy,
                                                rust_log=KV_LOG if events else None))
        credited: list[int] = []
        if events is not None:
            events.sync(router, request_timeout_s)

            async def on_pick(i: int, worker: int) -> None:
                credited.append(await asyncio.to_thread(
                    events.store_and_wait, router, worker, reqs[i], request_timeout_s))
        position = {url: router.order.index(url) for url in workers.urls}
        picks, loads, sent = workers.call(_send(workers, router, prompts, request_timeout_s,
                                                not_before_s or {}, on_pick))
        return RealReplay(kind, version, n, list(router.order),
                          [position[workers.urls[w]] for w in picks], loads, sent,
                          router.ready_at - router.started_at, policy, credited)


async def _send(workers: HoldingWorkers, router: RealRouter, prompts, timeout: float,
                not_before_s: dict[int, float],
                on_pick=None) -> tuple[list[int], list[int], list[float]]:
    """Picks (worker indices) of `prompts`, the router's loads with all of them held, and when
    each was sent (seconds after the router's launch). `on_pick(i, worker)` is awaited once
    request i reached its worker, before the next goes out."""
    import aiohttp

    url = router.url + "/v1/completions"
    picks: list[int] = []
    sent: list[float] = []
    tasks = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def post(body: bytes):
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.text()

        try:
            for i, prompt in enumerate(prompts):
                body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": 1,
                                   "temperature": 0}, ensure_ascii=False).encode()
                if i in not_before_s:
                    await asyncio.sleep(router.ready_at + not_before_s[i] - time.monotonic())
                sent.append(time.monotonic() - router.started_at)
                task = asyncio.ensure_future(post(body))
                tasks.append(task)
                waiter = asyncio.ensure_future(workers.wait_arrivals(i + 1, timeout))
                done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter not in done:  # the router answered without reaching a worker
                    waiter.cancel()
                    status, text = task.result() if not task.exception() else (0, repr(task.exception()))
                    raise RouterError(f"{router.kind.name} router answered request {i} with "
                                      f"{status} before any worker saw it: {text[:300]}")
                try:
                    waiter.result()
                except asyncio.TimeoutError:
                    raise RouterError(f"request {i} reached no worker within {timeout:g} s; "
                                      f"router log: {router.log_tail()}") from None
                arrival = workers.arrivals[i]
                if (len(workers.arrivals) != i + 1 or arrival.prompt_chars != len(prompt)
                        or arrival.prompt_digest != prompt_digest(prompt)):
                    raise RouterError(f"request {i}: the workers received "
                                      f"{len(workers.arrivals)} requests or another prompt")
                picks.append(arrival.worker)
                if on_pick is not None:
                    await on_pick(i, arrival.worker)
            async with session.get(router.url + "/workers") as r:
                loads = [w.get("load", 0) for w in (await r.json())["workers"]]
        finally:
            workers._release.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
    bad = [r for r in results if isinstance(r, BaseException) or r[0] != 200]
    if bad:
        raise RouterError(f"{len(bad)} requests failed once released, e.g. {bad[0]!r}"[:500])
    return picks, loads, sent


def agreement(trace, n: int, kind: str, *, limit: int | None = None,
              wall_clock: bool = False, policy: str = "cache_aware") -> dict:
    """`replay` and the lab's model of the router's `policy` (sequence mode) on the same
    requests: how many decisions agree, and the first that do not. The model evicts at the
    trace's times; `wall_clock`: at the times the requests were sent, the router's clock.
    kv_aware: also how many of the tokens the router credited as cached the model credits."""
    model = router_kind(kind).model_of(policy)
    if limit is not None:
        trace = trace.head(min(limit, len(trace)))
    t0 = time.perf_counter()
    real = replay(trace, n, kind, policy=policy)
    wall = time.perf_counter() - t0
    if wall_clock:
        trace = dataclasses.replace(trace, arrival_s=np.asarray(real.sent_s) - real.ready_s / 2)
    lab = make_policy(model, n)
    picks, rules, credited = [], [], []

    class _Recorder:
        def route(self, req, cluster):
            picks.append(lab.route(req, cluster))
            rules.append(lab.rule)
            credited.append(BLOCK_TOKENS * credited_blocks(cluster.matches(req)[picks[-1]],
                                                           req.tokens))
            return picks[-1]

    run_sequence(trace, n, 1 << 40, _Recorder())
    differ = [{"request": i, "model": picks[i], "real": real.picks[i], "rule": rules[i]}
              for i in range(len(picks)) if picks[i] != real.picks[i]]
    out = {"router": kind, "version": real.version, "policy": policy, "model": model,
           "replicas": n, "clock": "wall" if wall_clock else "trace",
           "requests": len(picks), "agree": len(picks) - len(differ),
           "agreement": 1 - len(differ) / len(picks) if picks else 1.0,
           "router_seconds": round(wall, 1), "first_differences": differ[:10]}
    if policy == "kv_aware":
        out["credited_agree"] = sum(a == b for a, b in zip(credited, real.credited))
        out["real_credited_tokens"] = sum(real.credited)
        out["model_credited_tokens"] = sum(credited)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m workloads.routing.real`: the agreement of a real router with its model."""

    p = argparse.ArgumentParser(prog="python -m workloads.routing.real", description=(
        "Replay a Mooncake trace through a real router over holding workers and compare each "
        "decision with the lab's model of it (sequence mode)."))
    p.add_argument("--router", default="sglang", help="sglang or vllm")
    p.add_argument("--policy", default="cache_aware", choices=("cache_aware", "kv_aware"),
                   help="the router's policy (kv_aware: vllm's, on KV events the workers "
                        "publish)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--limit", type=int, default=2000, help="first N requests (default 2000)")
    p.add_argument("--trace", help="Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--wall-clock", action="store_true",
                   help="evict the model's tree at the times the requests were sent (the "
                        "router's clock) instead of the trace's timestamps")
    args = p.parse_args(argv)
    try:
        if args.replicas < 1 or args.limit < 1:
            raise InvalidRequest("--replicas and --limit must be at least 1")
        result = agreement(load_mooncake(args.trace), args.replicas, args.router,
                           limit=args.limit, wall_clock=args.wall_clock, policy=args.policy)
    except (InvalidRequest, RouterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
