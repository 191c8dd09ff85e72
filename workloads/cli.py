"""Command line: `kvscope replay`, `kvscope scenario`, `kvscope policy-study`.

The server's `app/cli.py` delegates to `replay_main(argv)` and `scenario_main(argv)`; they are
also reachable as `python -m workloads replay|scenario|policy-study ...`. Each returns an exit
status: 0 ok, 2 bad input (the message names what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from allocator import MODEL_PRESETS, InvalidRequest

from .report import build_report, markdown, write_report
from .scenarios import SCENARIOS, run_scenario
from .simulator import STRATEGIES, SimConfig, Simulator
from .trace import load_trace


class ProgressBar:
    """A one-line stderr progress bar (tqdm is not a dependency). Redraws at most 10 times/s."""

    def __init__(self, label: str, stream=None, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._last = 0.0
        self._t0 = time.perf_counter()
        self._closed = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self._closed or (done < total and now - self._last < 0.1):
            return
        self._closed = done >= total
        self._last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label:<18} [{bar}] {frac:4.0%} {done}/{total} "
                          f"{now - self._t0:5.1f}s{end}")
        self.stream.flush()


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise InvalidRequest(f"unknown strategies {bad}; choose from {','.join(STRATEGIES)}")
    return names


def replay_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvscope replay", description=(
        "Replay an LLM request trace through the serving simulator with several KV allocation "
        "strategies; writes report.json, report.md and report.png."))
    p.add_argument("--trace", help="CSV with TIMESTAMP,ContextTokens,GeneratedTokens (default: the bundled Azure conversation trace)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma list of {','.join(STRATEGIES)}")
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


def replay_main(argv: list[str] | None = None) -> int:
    args = replay_parser().parse_args(argv)
    try:
        report = run_replay(args)
        paths = write_report(report, args.out, png=not args.no_png)
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(report))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def scenario_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvscope scenario", description=(
        "Run a scenario to completion on a fresh CPU pool and print its report as JSON."))
    p.add_argument("name", choices=SCENARIOS)
    p.add_argument("--strategy", default="paged", choices=("paged", "contiguous", "tiered"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocks", type=int, default=1024, help="pool size in blocks")
    p.add_argument("--policy", default="lru", help="cache policy (chat)")
    p.add_argument("--out", help="directory to write scenario.json into")
    args = p.parse_args(argv)
    try:
        report = run_scenario(args.name, args.strategy, args.seed, args.blocks, args.policy)
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "scenario.json").write_text(text + "\n")
    print(text)
    return 0


def policy_main(argv: list[str] | None = None) -> int:
    from .policy_study import markdown as study_markdown
    from .policy_study import run_study

    p = argparse.ArgumentParser(prog="kvscope policy-study", description=(
        "Hit rate of each eviction policy (real KVCache) next to Bélády's MIN, on the chat "
        "scenario and on a stream derived from the trace."))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, help="use only the first N trace rows")
    p.add_argument("--out", help="directory to write policy_study.json / .md into")
    args = p.parse_args(argv)
    try:
        result = run_study(args.seed, load_trace(limit=args.limit))
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = study_markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "policy_study.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "policy_study.md").write_text(text)
    print(text)
    return 0


COMMANDS = {"replay": replay_main, "scenario": scenario_main, "policy-study": policy_main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m workloads {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
