"""`kvscope record`: run a scenario or a trace replay headless on one pool, recording it."""

from __future__ import annotations

import argparse
import sys
import time

from allocator import KVCache, create_pool
from allocator.errors import KVScopeError
from allocator.history.recording import Recorder
from allocator.vocab import DEFAULT_TOKENS_PER_BLOCK, SCENARIO_INFO, SCENARIOS, STRATEGIES

from .live import build_live_workload
from .spec import MAX_SPEED

FLUSH_S = 0.5
STEP_S = 0.05  # wall seconds of workload per advance, at MAX_SPEED


def record_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvscope record",
        description="Run a scenario or the bundled trace headless on one pool and record its whole "
                    "history (config, events, keyframes) to a SQLite file that `kvscope open` serves.")
    p.add_argument("workload", choices=(*SCENARIOS, "trace"), help="a scenario name, or 'trace' for the trace replay")
    p.add_argument("-o", "--out", required=True, help="recording file to create (e.g. run.kvrec)")
    p.add_argument("--strategy", choices=STRATEGIES, default="paged")
    p.add_argument("--blocks", type=int, default=4096, help="pool size in blocks (default 4096)")
    p.add_argument("--block-bytes", type=int, default=4096, help="block size in bytes (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="scenario seed")
    p.add_argument("--limit", type=int, default=500, help="trace: replay the first N requests")
    p.add_argument("--policy", default="lru", help="cache policy for workloads that use the cache "
                   "(or the prefix cache's, for scenarios that open sequences)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="a scenario that opens sequences (prefix-chat) runs on a prefix-caching "
                        "paged pool of 16-token blocks (default); --no-prefix-caching: a plain pool")
    p.add_argument("--quiet", action="store_true")
    return p


def record(args: argparse.Namespace, out=sys.stdout) -> dict:
    """Build the pool, record the workload to completion, return the recorder's summary.
    Raises KVScopeError (bad sizes, existing file, unknown policy)."""
    prefix = (args.prefix_caching and args.strategy == "paged" and args.workload != "trace"
              and SCENARIO_INFO[args.workload].uses_prefix)
    extra = {"tokens_per_block": DEFAULT_TOKENS_PER_BLOCK, "prefix_caching": {"policy": args.policy}} if prefix else {}
    pool = create_pool(args.strategy, num_blocks=args.blocks, block_bytes=args.block_bytes, device="cpu",
                       name=args.workload, history=True, **extra)
    uses_cache = args.workload == "trace" or SCENARIO_INFO[args.workload].uses_cache
    if uses_cache:
        KVCache(pool, pool.capacity_bytes, args.policy)
    recorder = Recorder(pool, args.out, meta={"workload": args.workload, "seed": args.seed})
    spec = ({"kind": "trace", "name": "trace", "limit": args.limit, "speed": MAX_SPEED} if args.workload == "trace"
            else {"kind": "scenario", "name": args.workload, "seed": args.seed, "speed": MAX_SPEED})
    workload = build_live_workload(pool, spec)
    last_flush = time.monotonic()
    try:
        while workload.advance(STEP_S):
            if time.monotonic() - last_flush >= FLUSH_S:
                recorder.flush()
                last_flush = time.monotonic()
    finally:
        info = recorder.stop()
    if out is not None and not args.quiet:
        kind = f"prefix-caching {args.strategy}" if prefix else args.strategy
        print(f"recorded {info['events']} events (seq {info['start_seq']}..{info['last_seq']}) of "
              f"{args.workload} on a {kind} pool to {info['path']}", file=out)
    return info


def record_main(argv: list[str] | None = None) -> int:
    args = record_parser().parse_args(argv)
    try:
        record(args)
    except KVScopeError as exc:
        print(f"kvscope record: {exc}", file=sys.stderr)
        return 2
    return 0
