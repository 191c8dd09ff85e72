"""Command line: `kvscope replay`, `scenario`, `policy-study`, `prefix`, `route`.

The server's `app/cli.py` delegates to `replay_main(argv)` and `scenario_main(argv)`; they are
also reachable as `python -m workloads replay|scenario|policy-study|prefix ...`. Each returns an exit
status: 0 ok, 2 bad input (the message names what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from allocator import MODEL_PRESETS, InvalidRequest
from allocator.vocab import POLICIES, STRATEGIES

from .cliutil import ProgressBar, out_dir
from .mooncake import load_mooncake, sub_blocks
from .policy_study import markdown as study_markdown
from .policy_study import run_study
from .prefix_curve import CURVE_POLICIES, DEFAULT_CAPACITIES, capacity_curve, check_capacities, check_policies
from .prefix_report import markdown as prefix_markdown
from .prefix_report import write_prefix_report
from .prefix_sim import compare, sim_config
from .report import build_report, markdown, write_report
from .routing.cli import route_main as routing_main
from .scenarios import (
    SCENARIOS,
    compare_prefix_caching,
    compare_scenario,
    comparison_text,
    run_scenario,
)
from .simulator import RESERVATIONS, SimConfig, Simulator
from .trace import load_trace


def _strategies(text: str) -> list[str]:
    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in names if s not in RESERVATIONS]
    if bad or not names:
        raise InvalidRequest(f"unknown strategies {bad}; choose from {','.join(RESERVATIONS)}")
    return names


def replay_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope replay", description=(
        "Replay an LLM request trace through the serving simulator with several KV allocation "
        "strategies; writes report.json, report.md and report.png."))
    p.add_argument("--trace", help=("CSV with TIMESTAMP,ContextTokens,GeneratedTokens "
                                    "(default: the bundled Azure conversation trace)"))
    p.add_argument("--strategies", default=",".join(RESERVATIONS), help=f"comma list of {','.join(RESERVATIONS)}")
    p.add_argument("--model", default="llama-3-8b", choices=sorted(MODEL_PRESETS))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--pool-tokens", type=int, help="KV pool size in tokens")
    size.add_argument("--pool-gib", type=float, help="KV pool size in GiB of the model's KV (default 20)")
    p.add_argument("--tokens-per-block", type=int, default=16)
    p.add_argument("--max-len", type=int, help="max sequence length (default: the model's)")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--limit", type=int, help="replay only the first N requests")
    p.add_argument("--out", default="reports/replay", help="output directory")
    p.add_argument("--seed", type=int, default=0, help="recorded in the report (the replay itself is deterministic)")
    p.add_argument("--no-png", action="store_true", help="skip the chart")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run_replay(args: argparse.Namespace, stream=None) -> dict:
    trace = load_trace(args.trace, limit=args.limit)
    sims = []
    for name in _strategies(args.strategies):
        cfg = SimConfig(strategy=name, model=args.model, pool_tokens=args.pool_tokens,
                        pool_gib=args.pool_gib if args.pool_gib is not None else 20.0,
                        tokens_per_block=args.tokens_per_block, max_len=args.max_len,
                        max_batch=args.max_batch)
        sim = Simulator(trace, cfg)
        sim.run(None if args.quiet else ProgressBar(name, stream))
        sims.append(sim)
    report = build_report(sims, trace.summary())
    report["seed"] = args.seed
    return report


FLAG_NAMES = ("pool_tokens", "pool_gib", "tokens_per_block", "max_len", "max_batch", "limit")


def _flag_message(exc: Exception) -> str:
    """An error message that names the command-line flag (`--pool-tokens`), not the field."""
    text = str(exc)
    for name in FLAG_NAMES:
        if text.startswith(name + " "):
            return "--" + name.replace("_", "-") + text[len(name):]
    return text


def _failed(exc: BaseException, describe=str) -> int:
    """Say why a command stopped; returns its exit code (130 when interrupted, else 2)."""
    if isinstance(exc, KeyboardInterrupt):
        print("\ninterrupted", file=sys.stderr)
        return 130
    print(f"error: {describe(exc)}", file=sys.stderr)
    return 2


def _mkdir(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    return out


def replay_main(argv: list[str] | None = None) -> int:
    args = replay_parser().parse_args(argv)
    try:
        out = out_dir(args.out)
        report = run_replay(args)
        paths = write_report(report, out, png=not args.no_png)
    except (InvalidRequest, KeyboardInterrupt) as exc:
        return _failed(exc, _flag_message)
    except OSError as exc:
        print(f"error: cannot write the report to {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(markdown(report))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def scenario_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope scenario", description=(
        "Run a scenario to completion on a fresh CPU pool. fragmentation: fill the pool with "
        "mixed sizes, free every other allocation, then ask for one large request (less than "
        "the free total, more than any hole); without --strategy it runs on a contiguous and a "
        "paged pool and prints them side by side. chat: multi-turn conversations on the pool's "
        "cache (hit rate, evictions). burst: waves of arrivals that overfill the pool. "
        "prefix-chat: multi-turn conversations whose prompts grow by reply + message over shared "
        "system prompts; without --strategy it runs with prefix caching on and off side by side. "
        "A single strategy's report is printed as JSON."))
    p.add_argument("name", choices=SCENARIOS, help="which scenario")
    p.add_argument("--strategy", choices=STRATEGIES, help=(
        "allocation strategy of the pool (default: fragmentation compares contiguous and paged; "
        "chat and burst run on paged)"))
    p.add_argument("--seed", type=int, default=0, help="random seed (>= 0); the same seed gives the same ops")
    p.add_argument("--blocks", type=int, default=1024, help="pool size in blocks (1 KiB each; default 1024)")
    p.add_argument("--policy", default="lru", help=(
        f"cache eviction policy, one of {','.join(POLICIES)} (chat only; default lru)"))
    p.add_argument("--json", action="store_true", help="print the comparison as JSON instead of text")
    p.add_argument("--out", help="directory to write scenario.json (and scenario.txt for a comparison) into")
    return p


def scenario_main(argv: list[str] | None = None) -> int:
    args = scenario_parser().parse_args(argv)
    compare = args.strategy is None and args.name in ("fragmentation", "prefix-chat")
    out = None
    try:
        if args.out:
            out = out_dir(args.out)
        if args.seed < 0:
            raise InvalidRequest(f"--seed must be >= 0, got {args.seed}")
        if args.blocks < 8:
            raise InvalidRequest(f"--blocks must be at least 8, got {args.blocks}")
        if compare and args.name == "prefix-chat":
            report = compare_prefix_caching(args.seed, args.blocks, args.policy)
        elif compare:
            report = compare_scenario(args.name, args.seed, args.blocks, args.policy)
        else:
            report = run_scenario(args.name, args.strategy or "paged", args.seed, args.blocks, args.policy)
    except (InvalidRequest, KeyboardInterrupt) as exc:
        return _failed(exc)
    text = json.dumps(report, indent=2)
    shown = comparison_text(report) if compare and not args.json else text + "\n"
    if out is not None:
        try:
            (_mkdir(out) / "scenario.json").write_text(text + "\n")
            if compare:
                (out / "scenario.txt").write_text(comparison_text(report))
        except OSError as exc:
            print(f"error: cannot write to {str(out)!r}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    sys.stdout.write(shown)
    return 0


def policy_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvscope policy-study", description=(
        "Hit rate of each eviction policy (real KVCache) next to Bélády's MIN, on the chat "
        "scenario and on a stream derived from the trace."))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="use only the first N trace rows")
    p.add_argument("--out", help="directory to write policy_study.json / .md into")
    args = p.parse_args(argv)
    out = None
    try:
        if args.seed < 0:
            raise InvalidRequest(f"--seed must be >= 0, got {args.seed}")
        out = out_dir(args.out) if args.out else None
        result = run_study(args.seed, load_trace(limit=args.limit))
    except (InvalidRequest, KeyboardInterrupt) as exc:
        return _failed(exc, _flag_message)
    text = study_markdown(result)
    if out is not None:
        (_mkdir(out) / "policy_study.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "policy_study.md").write_text(text)
    print(text)
    return 0


def _int_list(text: str) -> list[int]:
    """'100000,3e6,1_000_000' -> positive ints. Raises InvalidRequest naming the bad value."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part.replace("_", ""))
        except ValueError:
            raise InvalidRequest(f"{part!r} is not a number") from None
        if not value.is_integer() or value <= 0:
            raise InvalidRequest(f"{part!r} is not a positive whole number of tokens")
        out.append(int(value))
    if not out:
        raise InvalidRequest("give at least one value")
    return out


def prefix_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope prefix", description=(
        "Prefix-cache hit ratio vs cache capacity for each eviction policy and Bélády's MIN, "
        "replaying a Mooncake-format trace (JSONL with hash_ids) in arrival order on the "
        "allocator's prefix cache; writes prefix_report.json, .md and .png."))
    p.add_argument("--trace", help="Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--out", default="reports/prefix", help="output directory")
    p.add_argument("--capacity-tokens", default=",".join(str(c) for c in DEFAULT_CAPACITIES),
                   help="comma list of cache capacities in tokens (1e6 style accepted)")
    p.add_argument("--policies", default=",".join(CURVE_POLICIES),
                   help=f"comma list of {','.join(CURVE_POLICIES)} (belady = Bélády's MIN)")
    p.add_argument("--tokens-per-block", type=int, default=512,
                   help="pool block size in tokens, a divisor of 512 (default 512: the trace's blocks)")
    p.add_argument("--limit", type=int, help="replay only the first N requests")
    p.add_argument("--simulate", action="store_true", help=(
        "also run the serving simulation with prefix caching on and off (16-token blocks)"))
    p.add_argument("--sim-pool-tokens", type=int, default=1_000_000,
                   help="KV pool of the serving simulation, in tokens (default 1,000,000)")
    p.add_argument("--sim-prefill-tokens-per-s", type=float, default=20_000.0,
                   help="prefill speed of the simulated accelerator (default 20,000 tokens/s)")
    p.add_argument("--no-png", action="store_true", help="skip the chart")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def prefix_main(argv: list[str] | None = None) -> int:

    args = prefix_parser().parse_args(argv)
    try:
        out = out_dir(args.out)
        sub_blocks(args.tokens_per_block)
        try:
            capacities = check_capacities(_int_list(args.capacity_tokens),
                                          args.tokens_per_block)
        except InvalidRequest as exc:
            raise InvalidRequest(f"--capacity-tokens: {exc}") from None
        try:
            policies = check_policies([p.strip() for p in args.policies.split(",") if p.strip()])
        except InvalidRequest as exc:
            raise InvalidRequest(f"--policies: {exc}") from None
        sim_cfg = None
        if args.simulate:
            speed = args.sim_prefill_tokens_per_s
            if not speed > 0 or speed == float("inf"):
                raise InvalidRequest(f"--sim-prefill-tokens-per-s must be a positive number, got {speed}")
            try:
                sim_cfg = sim_config(pool_tokens=args.sim_pool_tokens, prefill_token_s=1 / speed)
            except InvalidRequest as exc:
                raise InvalidRequest(f"--sim-pool-tokens: {exc}") from None
        trace = load_mooncake(args.trace, limit=args.limit)
        t0 = time.perf_counter()
        report = capacity_curve(trace, capacities, policies, args.tokens_per_block,
                                progress=None if args.quiet else ProgressBar("prefix curve"))
        wall = time.perf_counter() - t0
        walls: dict = {}
        if sim_cfg is not None:
            report["serving"] = compare(
                trace, sim_cfg,
                progress=None if args.quiet else (lambda mode: ProgressBar(f"serving {mode}")),
                wall=walls)
        paths = write_prefix_report(report, out, png=not args.no_png)
    except InvalidRequest as exc:
        print(f"error: {_flag_message(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write the report to {args.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print(prefix_markdown(report, png=not args.no_png))
    print(f"curve computed in {wall:.1f} s"
          + "".join(f"; serving {m} simulated in {s:.1f} s" for m, s in walls.items()))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def route_main(argv: list[str] | None = None) -> int:
    return routing_main(argv)


COMMANDS = {"replay": replay_main, "scenario": scenario_main, "policy-study": policy_main,
            "prefix": prefix_main, "route": route_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (f"usage: python -m workloads {{{','.join(COMMANDS)}}} [options]\n"
             "  replay        replay an LLM request trace through the serving simulator\n"
             "  scenario      run a fragmentation / chat / burst / prefix-chat scenario on a fresh pool\n"
             "  policy-study  hit rate of each cache eviction policy next to Belady's MIN\n"
             "  prefix        prefix-cache hit ratio vs capacity per policy on a Mooncake trace\n"
             "  route         routing policies over N replicas: hit ratio vs load vs TTFT\n"
             "(python -m workloads COMMAND -h for a command's options)")
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"unknown command {argv[0]!r}", file=sys.stderr)
        print(usage, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
