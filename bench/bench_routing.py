"""Routing lab on the full Mooncake conversation trace: the sequence-mode grid and one serving
point, against their aims (grid <= 60 s on two cores, serving point <= 30 s).

Measures, in one run: a same-run baseline (the trace through one LRU of 1M tokens, round robin
over one replica: the per-request work every grid point repeats at least once); the whole grid
(`kvscope route`'s 7 default policies x N in {2, 4, 8} x 4 capacities, sequence mode) on the
local process pool, with the CPU seconds per policy measured in this process too; and one
serving point (dynamo_kv, N=4, 1M tokens per replica). Prints each time as a ratio to the
baseline and against its aim.

Then Dynamo's own offline replay of the same trace, DynoSim (`dynamo._core.run_mocker_trace_replay`
from ai-dynamo-runtime: Dynamo's mocker engines behind its round-robin or KV router, no NATS,
etcd or GPU), at the same N and capacity, beside the lab's serving mode for round robin and
`dynamo_kv` in the same run, at the lab's default costs (DynoSim's own, `--costs dynosim`) and
with its linear costs: requests simulated per second, hit ratio (DynoSim's
`prefix_cache_reused_ratio`) and TTFT p50. DynoSim's per-request choices are not seeded (ties are
random), so only its aggregates are compared.

    .venv/bin/python -m bench routing          (python -m bench --quick routing: a smoke test)
"""

from __future__ import annotations

import os
import resource
import time

from bench.quick import sized
from workloads.mooncake import load_mooncake
from workloads.routing import make_policy, run_sequence
from workloads.routing.cli import DEFAULT_POLICIES
from workloads.routing.dynosim import run_dynosim
from workloads.routing.grid import Settings, grid, run_grid, run_point
from workloads.routing.serving import ServingCosts, run_serving

GRID_AIM_S = 60.0
SERVING_AIM_S = 30.0
REPLICAS = sized([2, 4, 8], [2])
CAPACITIES = sized([250_000, 500_000, 1_000_000, 2_000_000], [250_000])
REQUESTS = sized(None, 300)  # a quick run (`python -m bench --quick`) routes the first 300


def run() -> dict:
    trace = load_mooncake(limit=REQUESTS)
    t0 = time.perf_counter()
    run_sequence(trace, 1, 1_000_000, make_policy("round_robin", 1))
    base = time.perf_counter() - t0
    print(f"baseline: one LRU replica, {len(trace):,} requests: {base:.2f} s")

    points = grid(list(DEFAULT_POLICIES), REPLICAS, CAPACITIES, "sequence")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rows = run_grid(trace, points, Settings(), "local")
    grid_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    grid_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cores = os.cpu_count() or 1
    verdict = "meets" if grid_s <= GRID_AIM_S else "MISSES"
    print(f"sequence grid: {len(points)} points ({len(DEFAULT_POLICIES)} policies x N {REPLICAS} "
          f"x {len(CAPACITIES)} capacities) on the local pool: {grid_s:.1f} s = "
          f"{grid_s / base:.0f}x baseline; {verdict} the {GRID_AIM_S:.0f} s aim")
    print(f"  the pool's workers used {grid_cpu:.1f} CPU s = {grid_cpu / base:.0f}x baseline, "
          f"{grid_cpu / cores:.1f} s of wall on {cores} idle cores (load average now "
          f"{os.getloadavg()[0]:.1f}: other work shares the cores)")

    cpu: dict[str, float] = {}
    for p in grid(list(DEFAULT_POLICIES), [4], [1_000_000], "sequence"):
        c0 = time.process_time()
        run_point(trace, p, Settings())
        cpu[p.policy] = time.process_time() - c0
    print("one point (N=4, 1M) in CPU s, ratio to baseline: " + ", ".join(
        f"{k} {v:.2f} ({v / base:.1f}x)" for k, v in cpu.items()))

    t0 = time.perf_counter()
    serving = run_serving(trace, 4, 1_000_000, make_policy("dynamo_kv", 4))
    serving_s = time.perf_counter() - t0
    verdict = "meets" if serving_s <= SERVING_AIM_S else "MISSES"
    print(f"serving point (dynamo_kv, N=4, 1M tokens): {serving_s:.1f} s = "
          f"{serving_s / base:.0f}x baseline; {verdict} the {SERVING_AIM_S:.0f} s aim "
          f"(hit {serving['hit_ratio']:.3f}, TTFT p50 {serving['ttft_p50_s']:.2f} s)")
    dynosim = dynosim_side_by_side(len(trace), 4, 1_000_000)
    return {"baseline_s": base, "grid_s": grid_s, "serving_s": serving_s, "points": len(rows),
            "dynosim": dynosim}


def dynosim_side_by_side(requests: int, n: int, capacity_tokens: int) -> list[dict]:
    """DynoSim and the lab's serving mode on the first `requests` of the bundled trace."""
    trace = load_mooncake(limit=requests)
    rows = []
    print(f"DynoSim beside the lab's serving mode: first {requests:,} requests, N={n}, "
          f"{capacity_tokens:,} tokens per replica")
    for lab_policy, mode in (("round_robin", "round_robin"), ("dynamo_kv", "kv_router")):
        d = run_dynosim(trace, n, capacity_tokens, mode)
        d_rps = len(trace) / d["wall_s"]
        print(f"  {mode:<12} DynoSim: {d_rps:,.0f} requests/s simulated, hit {d['hit_ratio']:.3f}, "
              f"TTFT p50 {d['ttft_p50_s']:.2f} s")
        row = {"router": mode, "policy": lab_policy, "dynosim": d}
        for costs in ("dynosim", "linear"):  # the default first
            t0 = time.perf_counter()
            lab = run_serving(trace, n, capacity_tokens, make_policy(lab_policy, n),
                              ServingCosts(model=costs))
            lab_s = time.perf_counter() - t0
            lab_rps = len(trace) / lab_s
            print(f"    lab {lab_policy}, {costs} costs: {lab_rps:,.0f} requests/s "
                  f"({lab_rps / d_rps:.1f}x DynoSim), hit {lab['hit_ratio']:.3f} "
                  f"({(lab['hit_ratio'] - d['hit_ratio']) * 100:+.1f} points), "
                  f"TTFT p50 {lab['ttft_p50_s']:.2f} s ({lab['ttft_p50_s'] / d['ttft_p50_s']:.1f}x)")
            row[f"lab_{costs}"] = {"hit_ratio": lab["hit_ratio"], "ttft_p50_s": lab["ttft_p50_s"],
                                   "wall_s": lab_s}
        rows.append(row)
    return rows


if __name__ == "__main__":
    run()
