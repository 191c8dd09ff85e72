"""Dynamo's router on a trace, offline: DynoSim, the trace replay `ai-dynamo-runtime` ships
(`dynamo._core.run_mocker_trace_replay`): Dynamo's own KV router (or its round robin) in front
of N of Dynamo's mocker engines, in simulated time, with no NATS, etcd or GPU.

`run_dynosim(trace, n, capacity_tokens, router_mode)` writes the trace as Mooncake JSONL,
replays it with 512-token blocks and `capacity_tokens // 512` blocks per worker, and returns a
`kvscope route` row: `hit_ratio` (DynoSim's `prefix_cache_reused_ratio`: reused prompt tokens at
first admission over prompt tokens), `available_hit_ratio` (the best worker's overlap when each
request was routed, from its routing history), TTFT p50 / p99, `imbalance` (max over mean of the
prompt tokens per worker) and the requests per worker. With `decisions`, each request's decision
is logged (rule `router`): the worker it was routed to, and as its candidates the one thing
DynoSim reports per worker it did not choose: nothing (`candidates` is empty; the record keeps
the chosen worker's overlap and the best available). DynoSim breaks ties at random, unseeded,
so two runs of the same trace differ in which worker a request went to, not in their figures.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from allocator import InvalidRequest

from ..mooncake import MooncakeTrace
from .decisions import DecisionLog
from .policies import BLOCK_TOKENS

ROUTER_MODES = {"kv_router": "dynamo_kv", "round_robin": "round_robin"}  # -> the lab's model


def available() -> str | None:
    """None when DynoSim can run here, else the line that says what to install."""
    os.environ.setdefault("DYN_LOG", "warn")  # read as the module loads; else every decision is logged
    try:
        import dynamo._core as dyn
    except ImportError:
        return "Dynamo's replay needs ai-dynamo-runtime: pip install 'kvscope[routers]'"
    if not hasattr(dyn, "run_mocker_trace_replay"):
        return "this ai-dynamo-runtime has no run_mocker_trace_replay: pip install 'ai-dynamo-runtime>=1.6'"
    return None


def write_trace(trace: MooncakeTrace, path: Path) -> None:
    """`trace` as Mooncake JSONL (timestamps in ms from its first request)."""
    ids, offsets = trace.hash_ids.tolist(), trace.offsets.tolist()
    t0 = float(trace.arrival_s[0]) if len(trace) else 0.0
    with open(path, "w") as f:
        for i in range(len(trace)):
            f.write(json.dumps({"timestamp": round((float(trace.arrival_s[i]) - t0) * 1000, 3),
                                "input_length": int(trace.input_length[i]),
                                "output_length": int(trace.output_length[i]),
                                "hash_ids": ids[offsets[i]:offsets[i + 1]]}) + "\n")


def run_dynosim(trace: MooncakeTrace, n: int, capacity_tokens: int, router_mode: str = "kv_router",
                decisions: DecisionLog | None = None) -> dict:
    """DynoSim over `trace`; the row as `kvscope route` reports it. Raises InvalidRequest (an
    unknown router mode, a capacity below one block, DynoSim missing)."""
    if router_mode not in ROUTER_MODES:
        raise InvalidRequest(f"unknown DynoSim router mode {router_mode!r}: choose from "
                             f"{', '.join(ROUTER_MODES)}")
    if capacity_tokens < BLOCK_TOKENS:
        raise InvalidRequest(f"capacity_tokens must hold one {BLOCK_TOKENS}-token block")
    why = available()
    if why:
        raise InvalidRequest(why)
    import dynamo._core as dyn

    with tempfile.TemporaryDirectory(prefix="kvscope-dynosim-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(trace, path)
        t0 = time.perf_counter()
        out = dyn.run_mocker_trace_replay(
            [str(path)], extra_engine_args={"engine": {"block_size": BLOCK_TOKENS,
                                                        "num_gpu_blocks": capacity_tokens // BLOCK_TOKENS}},
            num_workers=n, trace_block_size=BLOCK_TOKENS, router_mode=router_mode,
            router_config=dyn.KvRouterConfig() if router_mode == "kv_router" else None,
            capture_per_request=True)
        wall = time.perf_counter() - t0
    return figures(trace, n, capacity_tokens, router_mode, out.summary, out.per_request,
                   decisions, wall)


def _worker(rec: dict) -> int | None:
    w = rec.get("decode_worker_idx")
    if w is None:
        hist = rec.get("routing_history") or []
        w = hist[-1].get("logical_worker_id") if hist else None
    return w


def in_trace_order(trace, per_request: list[dict]) -> list[dict]:
    """DynoSim's per-request records (in the order they finished) put in the trace's order, by
    (arrival ms, prompt length, output length); requests alike in all three are interchangeable
    for every figure and are taken in turn. Raises RuntimeError when they do not pair up."""
    t0 = float(trace.arrival_s[0]) if len(trace) else 0.0
    by_key: dict[tuple, list[dict]] = {}
    for rec in sorted(per_request, key=lambda r: r["arrival_time_ms"]):
        key = (round(rec["arrival_time_ms"]), int(rec["input_length"]),
               int(rec["requested_output_length"]))
        by_key.setdefault(key, []).append(rec)
    out = []
    for i in range(len(trace)):
        key = (round((float(trace.arrival_s[i]) - t0) * 1000), int(trace.input_length[i]),
               int(trace.output_length[i]))
        recs = by_key.get(key)
        if not recs:
            raise RuntimeError(f"DynoSim has no record of request {i} {key}")
        out.append(recs.pop(0))
    return out


def figures(trace, n, capacity_tokens, router_mode, summary, per_request, decisions, wall) -> dict:
    """The row from DynoSim's summary and per-request records."""
    inputs = trace.input_length.tolist()
    if len(per_request) != len(inputs):
        raise RuntimeError(f"DynoSim reports {len(per_request)} requests of {len(inputs)}")
    per_request = in_trace_order(trace, per_request)
    kv = router_mode == "kv_router"
    tokens = [0] * n
    requests = [0] * n
    available = 0
    ttft = []
    for i, rec in enumerate(per_request):
        w = _worker(rec)
        hist = rec.get("routing_history") or [{}]
        first = hist[0]
        best = int(first.get("best_available_overlap_blocks") or 0)
        chosen = int(first.get("selected_overlap_blocks") or 0)
        # only the KV router computes overlaps; for round robin what was available is unknown
        avail = min(BLOCK_TOKENS * best, inputs[i] - 1) if kv else None
        available += avail or 0
        if w is not None and 0 <= w < n:
            tokens[w] += inputs[i]
            requests[w] += 1
        if rec.get("ttft_ms") is not None:
            ttft.append(rec["ttft_ms"] / 1000)
        if decisions is not None and w is not None:
            decisions.add_record(i, int(w), "router",
                                 f"Dynamo's {router_mode} (DynoSim) chose worker {w}" + (
                                     f", {chosen} of the best {best} blocks cached there"
                                     if kv else ""),
                                 (), (), None, best, rec.get("reused_input_tokens"), avail)
    prompts = sum(inputs)
    mean = sum(tokens) / n
    t = np.sort(np.asarray(ttft, dtype=np.float64))

    def pct(q: float) -> float:
        return float(np.percentile(t, q)) if len(t) else 0.0
    return {"policy": f"router:dynamo-{router_mode}", "replicas": n,
            "capacity_tokens": capacity_tokens, "mode": "router",
            "hit_ratio": float(summary["prefix_cache_reused_ratio"]),
            "available_hit_ratio": (available / prompts if prompts else 0.0) if kv else None,
            "imbalance": max(tokens) / mean if mean else 0.0,
            "ttft_p50_s": pct(50), "ttft_p99_s": pct(99),
            "completed": int(summary["completed_requests"]), "routed": sum(requests),
            "failed": 0, "prompt_tokens": prompts, "replica_requests": requests,
            "replica_input_tokens": tokens, "wall_s": wall,
            "requests_per_s": len(inputs) / wall if wall > 0 else None}
