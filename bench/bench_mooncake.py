"""Prefix-cache capacity curve on the full Mooncake trace: how long, and does it hold its targets?

Measures, in one run: the whole curve (lru, fifo, lfu, s3fifo and Bélády's MIN at 7 capacities,
10^5..10^8 tokens, plus the infinite-capacity maximum) on the allocator's prefix cache, against the
aim of 60 s; and, as a same-run baseline, one LRU point replayed by a plain `OrderedDict` of block
ids (hit accounting alone, no pool, no block map, no events), next to the same point on the pool.
Then the serving simulation of the full trace with prefix caching on and off (aim 120 s for both;
the off run is the same-run baseline). Checks the targets on the measured points (MIN >= every
policy at every capacity, LRU non-decreasing, max 0.374 and LRU at 3M 0.139 within 0.005 of the
independent computation) and writes the report to `docs/report/prefix_report.*` (no timings in it:
the same code rewrites it byte for byte) and its drawable part to
`workloads/reports/mooncake_prefix_curve.json`, which the server ships as `GET /api/prefix/curve`.

    .venv/bin/python -m bench.bench_mooncake [--no-report] [--requests N]

`--requests N` (KVSCOPE_BENCH_REQUESTS) replays only the trace's first N requests: minutes
become seconds, the checks against the independent figures (which hold for the full trace) are
skipped, and the report goes to a temporary folder, never into the tree. A quick run
(`python -m bench --quick`) takes the first 300.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quick import sized
from workloads.mooncake import TRACE_BLOCK_TOKENS, load_mooncake
from workloads.prefix_curve import capacity_curve, prepare, ratio_at, run_point
from workloads.prefix_curve_data import write_bundled_curve
from workloads.prefix_report import write_prefix_report
from workloads.prefix_sim import compare, sim_config

ROOT = Path(__file__).resolve().parents[1]
REPORT_DIR = ROOT / "docs" / "report"
AIM_S = 60.0
SIM_AIM_S = 120.0
LOCAL = 3_000_000
REQUESTS = int(os.environ.get("KVSCOPE_BENCH_REQUESTS", 0)) or sized(None, 300)  # None: the whole trace


def dict_lru(trace, capacity_tokens: int) -> tuple[float, float]:
    """(hit ratio, seconds) of LRU over block ids in an OrderedDict, the pool's semantics."""
    t0 = time.perf_counter()
    cap = capacity_tokens // TRACE_BLOCK_TOKENS
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for i in range(len(trace)):
        nodes = trace.block_nodes(i).tolist()[:cap]
        m = 0
        while m < len(nodes) and nodes[m] in cache:
            m += 1
        hits += min(m * TRACE_BLOCK_TOKENS, int(trace.input_length[i]))
        for node in reversed(nodes):
            if node in cache:
                cache.move_to_end(node)
            else:
                cache[node] = None
        while len(cache) > cap:
            cache.popitem(last=False)
    return hits / int(trace.input_length.sum()), time.perf_counter() - t0


def run(write: bool = True, requests: int | None = REQUESTS) -> dict:
    trace = load_mooncake(limit=requests)
    full = requests is None
    base_ratio, base_s = dict_lru(trace, LOCAL)
    point = run_point(prepare(trace), LOCAL, "lru")
    t0 = time.perf_counter()
    report = capacity_curve(trace)
    curve_s = time.perf_counter() - t0
    points = len(report["curve"]) + 1
    lru3 = ratio_at(report, LOCAL, "lru")
    checks = report["checks"]
    print(f"full curve: {points} points ({len(trace):,} requests each) in {curve_s:.1f} s "
          f"({curve_s / AIM_S:.2f}x the {AIM_S:.0f} s aim: {'met' if curve_s <= AIM_S else 'MISSED'})")
    print(f"one LRU point at {LOCAL:,} tokens: prefix cache {point.wall_s:.2f} s, OrderedDict of "
          f"block ids {base_s:.2f} s (pool/baseline {point.wall_s / base_s:.2f}x); hit ratios "
          f"{point.hit_ratio:.4f} vs {base_ratio:.4f} "
          f"({'equal' if abs(point.hit_ratio - base_ratio) < 1e-12 else 'DIFFERENT'})")
    agree = abs(report["max_hit_ratio"] - 0.374) <= 0.005 and abs(lru3 - 0.139) <= 0.005
    print(f"max hit ratio {report['max_hit_ratio']:.4f} (independent: 0.374), LRU at 3M {lru3:.4f} "
          f"(independent: 0.139): " + (f"{'agree' if agree else 'DISAGREE'} within 0.005" if full else
                                       f"not compared (those hold for the full trace, not its first {requests:,})"))
    print(f"Bélády >= every policy at every capacity: {checks['belady_bounds_policies']}; "
          f"LRU non-decreasing: {checks['lru_non_decreasing']}")
    caps = report["capacities_tokens"]
    print("capacity    " + "  ".join(f"{p:>7}" for p in report["policies"]))
    for c in caps:
        print(f"{c:>11,} " + "  ".join(f"{ratio_at(report, c, p):7.3f}" for p in report["policies"]))
    walls: dict = {}
    t0 = time.perf_counter()
    report["serving"] = compare(trace, sim_config(), wall=walls)
    sim_s = time.perf_counter() - t0
    on, off = report["serving"]["modes"]["prefix"], report["serving"]["modes"]["no-prefix"]
    print(f"serving simulation, {len(trace):,} requests, prefix caching on and off: {sim_s:.1f} s "
          f"({sim_s / SIM_AIM_S:.2f}x the {SIM_AIM_S:.0f} s aim: {'met' if sim_s <= SIM_AIM_S else 'MISSED'}); "
          f"on {walls['prefix']:.1f} s vs off {walls['no-prefix']:.1f} s "
          f"({walls['prefix'] / walls['no-prefix']:.2f}x)")
    print(f"  hit ratio {on['hit_ratio']:.3f}; prefill tokens saved {report['serving']['prefill_saved']:.1%}; "
          f"queue p50 {on['queueing_delay_p50_s']:.0f} s vs {off['queueing_delay_p50_s']:.0f} s; "
          f"req/s {on['throughput_rps']:.2f} vs {off['throughput_rps']:.2f}")
    if write and full:
        write_prefix_report(report, REPORT_DIR)
        print(f"wrote {REPORT_DIR / 'prefix_report.md'} and {write_bundled_curve(report)}")
    elif write:  # a partial trace's report: written (so the writers run) where nothing reads it
        with tempfile.TemporaryDirectory() as tmp:
            write_prefix_report(report, tmp)
            write_bundled_curve(report, Path(tmp) / "curve.json")
            print(f"report of the first {requests:,} requests written to a temporary folder (not kept)")
    return {"curve_s": curve_s, "baseline_s": base_s, "point_s": point.wall_s, "sim_s": sim_s,
            "report": report}


if __name__ == "__main__":
    args = sys.argv[1:]
    run(write="--no-report" not in args,
        requests=int(args[args.index("--requests") + 1]) if "--requests" in args else REQUESTS)
