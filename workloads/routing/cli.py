"""`kvscope route`: sweep routing policies over N replicas and cache capacities on a Mooncake
trace; writes route_report.json, .md and .png. Exit status 0 ok, 2 bad input (the message names
what is wrong), 130 interrupted."""

from __future__ import annotations

import argparse
import math
import sys
import time

from allocator import InvalidRequest

from ..cliutil import ProgressBar, out_dir
from ..mooncake import load_mooncake
from .decisions import DecisionLog
from .grid import MODES, Settings, grid, parse_executor, run_grid
from .policies import BLOCK_TOKENS
from .registry import check_policies, policy_names
from .report import markdown, write_route_report
from .serving import add_cost_flags, costs_from_args

DEFAULT_POLICIES = ("round_robin", "least_loaded", "session", "longest_prefix",
                    "sglang_cache_aware", "dynamo_kv", "llmd_precise")


def route_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope route", description=(
        "Replay a Mooncake-format trace (JSONL with hash_ids) through N replicas behind each "
        "routing policy, for each capacity: hit ratio against load imbalance (sequence mode), "
        "and against TTFT on the serving simulator (serving mode)."))
    p.add_argument("--trace", help="Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--replicas", default="4", help="comma list of replica counts N (default 4)")
    p.add_argument("--capacity-tokens", default="1000000",
                   help="comma list of KV capacities per replica, in tokens (1e6 style accepted; "
                        "default 1,000,000)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="comma list of policies (kvscope route --list-policies shows them all)")
    p.add_argument("--mode", default="sequence", choices=MODES)
    p.add_argument("--out", default="reports/route", help="output directory")
    p.add_argument("--executor", default="local",
                   help="local (a process pool, the default), ray (a local Ray instance) or "
                        "ray:ADDRESS (a running Ray cluster)")
    p.add_argument("--limit", type=int, help="route only the first N requests")
    p.add_argument("--decisions", metavar="FILE.jsonl", help=(
        "write every decision, one JSON object per routed request and policy: the replica "
        "chosen, the rule that decided, each replica's cached blocks, load and score, the tokens "
        "captured and available (docs/ROUTING.md#decisions)"))
    p.add_argument("--seed", type=int, default=0, help="seed of the random policies (>= 0)")
    p.add_argument("--dynamo-temperature", type=float, default=0.0,
                   help="softmax temperature of dynamo_kv* (default 0: the lowest cost)")
    add_cost_flags(p)
    p.add_argument("--workers", type=int, help="local executor: processes (default: one per CPU)")
    p.add_argument("--list-policies", action="store_true", help="print the policy names and exit")
    p.add_argument("--no-png", action="store_true", help="skip the chart")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _numbers(text: str, flag: str, minimum: int, what: str) -> list[int]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part.replace("_", ""))
        except ValueError:
            raise InvalidRequest(f"{flag}: {part!r} is not a number") from None
        if not math.isfinite(value) or not value.is_integer():
            raise InvalidRequest(f"{flag}: {part!r} is not a whole number")
        if value < minimum:
            raise InvalidRequest(f"{flag}: {part} is below {what}")
        out.append(int(value))
    if not out:
        raise InvalidRequest(f"{flag}: give at least one value")
    return list(dict.fromkeys(out))


def settings_from(args: argparse.Namespace) -> Settings:
    if args.seed < 0:
        raise InvalidRequest(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.dynamo_temperature) and args.dynamo_temperature >= 0):
        raise InvalidRequest(f"--dynamo-temperature must be a number >= 0, got {args.dynamo_temperature}")
    costs = costs_from_args(args)
    return Settings(mode=args.mode, seed=args.seed, dynamo_temperature=args.dynamo_temperature,
                    costs=costs)


def write_decisions(rows: list[dict], f) -> int:
    """Every row's decisions as JSON lines, in grid order (the rows lose their `decision_rows`)."""
    n = 0
    for row in rows:
        raw = row.pop("decision_rows", None)
        if raw is not None:
            log = DecisionLog.from_rows(row["policy"], row["replicas"], row["capacity_tokens"],
                                        raw["rows"], raw["dropped"])
            n += log.write_jsonl(f)
            row["decisions"] = log.summary()
    return n


def route_main(argv: list[str] | None = None, stream=None) -> int:

    args = route_parser().parse_args(argv)
    if args.list_policies:
        print("\n".join(policy_names()))
        return 0
    try:
        out = out_dir(args.out)
        policies = check_policies([p.strip() for p in args.policies.split(",") if p.strip()])
        replicas = _numbers(args.replicas, "--replicas", 1, "1 replica")
        capacities = _numbers(args.capacity_tokens, "--capacity-tokens", BLOCK_TOKENS,
                              f"one {BLOCK_TOKENS}-token block")
        settings = settings_from(args)
        parse_executor(args.executor)
        points = grid(policies, replicas, capacities, args.mode)
        if args.limit is not None and args.limit < 1:
            raise InvalidRequest(f"--limit must be at least 1, got {args.limit}")
        if args.workers is not None and args.workers < 1:
            raise InvalidRequest(f"--workers must be at least 1, got {args.workers}")
        trace = load_mooncake(args.trace, limit=args.limit)
        if args.decisions:
            settings.decisions = True
            try:
                decisions_file = open(args.decisions, "w")  # noqa: SIM115 (closed below)
            except OSError as exc:
                raise InvalidRequest(f"--decisions {args.decisions}: cannot write it: "
                                     f"{exc.strerror or exc}") from None
        t0 = time.perf_counter()
        bar = None if args.quiet else ProgressBar(f"route {args.mode}", stream)
        try:
            rows = run_grid(trace, points, settings, args.executor, args.workers, bar)
            if args.decisions:
                written = write_decisions(rows, decisions_file)
        finally:
            if args.decisions:
                decisions_file.close()
        wall = time.perf_counter() - t0
        paths = write_route_report(rows, trace.summary(), out, png=not args.no_png)
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the report to {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print(markdown(rows, trace.summary(), png=not args.no_png))
    print(f"{len(points)} points routed in {wall:.1f} s ({args.executor})")
    if args.decisions:
        print(f"wrote {written:,} decisions to {args.decisions}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
