"""`kvscope mirror` (the dashboard on a live engine's prefix cache), `kvscope recording` (a
recorded event stream, summarised or played back on the dashboard) and `kvscope prefix --publish`
(a Mooncake trace as a live KV-event source)."""

from __future__ import annotations

import argparse
import json
import sys

import zmq
from pydantic import ValidationError

from allocator import create_pool
from allocator.errors import InvalidRequest
from allocator.prefix.mirror import MirrorPool
from kvevents.codec import WireError
from kvevents.engine_metrics import MetricsError, num_gpu_blocks
from kvevents.pool_publisher import PoolPublisher
from kvevents.recording import HISTORY_SUFFIX, SUFFIX, read, replay_into
from kvevents.trace_source import run_live_source

from ..schemas import PoolCreate
from ..services import Startup
from .dashboard import serve_dashboard

try:
    from workloads.mooncake import load_mooncake
except ImportError:  # a build without the trace reader: `prefix --publish` says so
    load_mooncake = None


def _serve(prog: str, args, pools: list) -> int:
    return serve_dashboard(prog, args, Startup(pools=pools), f"?pool={pools[0][0]['name']}")


def run_mirror(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    if args.num_blocks is None and not args.metrics_url:
        p.error("give --num-blocks, or --metrics-url to read num_gpu_blocks from the engine")
    spec = {"name": args.name or "engine", "strategy": "mirror", "num_blocks": args.num_blocks,
            "mirror": {"endpoint": args.endpoint, "topic": args.topic,
                       "replay_endpoint": args.replay_endpoint, "metrics_url": args.metrics_url}}
    err = _check(spec)
    if err:
        p.error(err)
    if args.record and args.record.endswith(HISTORY_SUFFIX):
        p.error(f"--record {args.record}: {HISTORY_SUFFIX} is the suffix of pool history recordings "
                f"(kvscope record / kvscope open); name a KV-event recording {SUFFIX}")
    spec["mirror"] = {k: v for k, v in spec["mirror"].items() if v is not None}
    if args.num_blocks is None:  # read it now: a bad URL is one line here, not a failed startup
        try:
            spec["num_blocks"] = num_gpu_blocks(args.metrics_url)
        except MetricsError as exc:
            print(f"kvscope mirror: {exc}", file=sys.stderr)
            return 2
        print(f"kvscope mirror: {spec['num_blocks']:,} GPU blocks (vllm:cache_config_info)", flush=True)
    return _serve("kvscope mirror", args, [(spec, {"record": args.record})])


def _check(spec: dict) -> str | None:
    """The REST schema's verdict on a CLI-built spec (one message), or None."""
    def pruned(d: dict) -> dict:
        return {k: pruned(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}

    try:
        PoolCreate.model_validate(pruned(spec))
    except ValidationError as exc:
        e = exc.errors()[0]
        return f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
    return None


def run_prefix_publish(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    """`kvscope prefix --trace FILE --publish ENDPOINT [--speed X]`: a GPU-free engine. The
    trace's requests run on a prefix-caching pool at X times real time and every request's
    stored / removed events go out in vLLM's wire format, for testing KV-aware routers."""
    if args.speed < 0 or args.capacity_tokens <= 0 or args.tokens_per_block <= 0:
        p.error("--speed must be >= 0, --capacity-tokens and --tokens-per-block positive")
    if load_mooncake is None:
        print("kvscope prefix --publish: this build has no Mooncake trace reader", file=sys.stderr)
        return 2
    tpb = args.tokens_per_block
    try:
        trace = load_mooncake(args.trace, limit=args.limit)
        pool = create_pool("paged", num_blocks=max(1, args.capacity_tokens // tpb), block_bytes=tpb,
                           tokens_per_block=tpb, device="cpu", prefix_caching={"policy": args.policy})
    except (InvalidRequest, TypeError) as exc:
        print(f"kvscope prefix --publish: {exc}", file=sys.stderr)
        return 2
    try:
        pub = PoolPublisher(pool, args.publish, topic=args.publish_topic,
                            replay_endpoint=args.publish_replay_endpoint)
    except zmq.ZMQError as exc:
        print(f"kvscope prefix --publish: cannot open {args.publish}: {exc}", file=sys.stderr)
        return 2

    def requests():
        for i in range(len(trace)):
            hashes = trace.block_hashes(i, tpb)
            yield float(trace.arrival_s[i]), hashes, len(hashes) * tpb

    def progress(n, counts):
        if n % 500 == 0:
            print(f"{n:,}/{len(trace):,} requests · {counts['events']:,} events in "
                  f"{counts['batches']:,} batches · next seq {pub.publisher.next_seq}", flush=True)

    print(f"kvscope prefix --publish: {len(trace):,} requests on {pool.num_blocks:,} blocks of "
          f"{tpb} tokens, publishing on {pub.publisher.endpoint}"
          + (f" (replay {pub.publisher.replay_endpoint})" if pub.publisher.replay_endpoint else ""),
          flush=True)
    try:
        counts = run_live_source(pool, requests(), pub, speed=args.speed or None, progress=progress)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        pub.close()
    hit = counts["cached_tokens"] / counts["prompt_tokens"] if counts["prompt_tokens"] else 0.0
    print(json.dumps({**counts, "hit_ratio": round(hit, 4), "published_seq": pub.publisher.next_seq}))
    return 0


def run_recording(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    if args.num_blocks <= 0 or (args.speed is not None and args.speed <= 0):
        p.error("--num-blocks and --speed must be positive")
    try:
        next(iter(read(args.file)), None)
    except (OSError, WireError) as exc:
        print(f"kvscope recording: {exc}", file=sys.stderr)
        return 2
    if args.serve:
        spec = {"name": args.name or "recording", "strategy": "mirror", "num_blocks": args.num_blocks}
        return _serve("kvscope recording", args,
                      [(spec, {"playback": args.file, "speed": args.speed})])
    try:
        pool = MirrorPool(args.num_blocks, name="recording", device="cpu")
        counts = replay_into(args.file, pool)
    except (InvalidRequest, WireError, OSError) as exc:
        print(f"kvscope recording: {exc}", file=sys.stderr)
        return 2
    forest = pool.forest()
    forest.pop("at", None)
    print(json.dumps({"file": args.file, **counts, "cached_blocks": len(pool.cached_hashes()),
                      "mirror": pool.mirror_counters, "forest": forest}, indent=2))
    return 0
