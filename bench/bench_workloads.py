"""Offline trace replay: how fast does the serving simulator replay the full Azure trace?

Measures, in one run: the full trace (19,366 requests) through `paged` on the real allocator,
and the same replay with the allocator replaced by its accounting alone (a free-block counter:
same admissions, growths, preemptions and completions, no pool calls). Prints wall times,
simulated requests per wall second and the allocator/baseline ratio. Then replays all four
strategies and writes the full-trace report (report.json, report.md, report.png) to
`docs/report/`, plus the cache policy study, and prints the headline table.

The files in `docs/report/` are committed, so they hold no run timings: re-running the bench on
the same code rewrites them byte for byte. Timings are printed only.

    .venv/bin/python -m bench.bench_workloads [--no-report]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator import OutOfMemory
from bench.quick import QUICK
from workloads.policy_study import markdown as study_md
from workloads.policy_study import run_study
from workloads.report import build_report, markdown, write_report
from workloads.simulator import RESERVATIONS, PagedStrategy, Request, SimConfig, Simulator
from workloads.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
REPORT_DIR = ROOT / "docs" / "report"


class CountingPaged(PagedStrategy):
    """Paged accounting without the allocator: a free-block counter stands in for the pool."""

    def __init__(self, sim_pool, token_bytes: int, max_len: int, tpb: int) -> None:
        super().__init__(sim_pool, token_bytes, max_len, tpb)
        self.free_blocks = sim_pool.num_blocks
        self._next = 1

    def admit(self, r: Request) -> None:
        need = -(-r.context // self.tpb)
        self.calls += 1
        if need > self.free_blocks:
            raise OutOfMemory(need, self.free_blocks, self.free_blocks, "capacity")
        self.free_blocks -= need
        r.aid, self._next = self._next, self._next + 1
        r.cap = need * self.tpb
        r.recorded = r.context

    def grow(self, r: Request, length: int) -> None:
        need = -(-length // self.tpb) - r.cap // self.tpb
        self.calls += 1
        if need > self.free_blocks:
            raise OutOfMemory(need, self.free_blocks, self.free_blocks, "capacity")
        self.free_blocks -= need
        r.recorded = length
        r.cap += need * self.tpb

    def release(self, r: Request) -> None:
        self.calls += 1
        self.free_blocks += r.cap // self.tpb


def _replay(trace, cfg: SimConfig, baseline: bool) -> tuple[Simulator, float]:
    sim = Simulator(trace, cfg)
    if baseline:
        strategy = CountingPaged(sim.pool, cfg.sim_bytes_per_token, cfg.max_length(), cfg.tokens_per_block)
        sim.strategy = strategy
    t0 = time.perf_counter()
    sim.run()
    return sim, time.perf_counter() - t0


def run(write: bool = True, limit: int | None = None) -> dict:
    if QUICK:  # the first requests; the report is written where nothing keeps it
        with tempfile.TemporaryDirectory() as tmp:
            return _run(write, limit or 300, Path(tmp))
    return _run(write, limit, REPORT_DIR if limit is None else None)


def _run(write: bool, limit: int | None, report_dir: Path | None) -> dict:
    """`report_dir` None: a partial trace's report is not written."""
    write = write and report_dir is not None
    trace = load_trace(limit=limit)
    cfg = SimConfig(strategy="paged", pool_gib=20.0)
    base_sim, base_s = _replay(trace, cfg, baseline=True)
    sim, wall_s = _replay(trace, cfg, baseline=False)
    assert sim.counters.completed == base_sim.counters.completed, "baseline diverged"
    assert sim.pool.used_blocks == 0 and sim.pool.check() == [], "the replay leaked memory"
    result = {
        "requests": len(trace),
        "completed": sim.counters.completed,
        "paged_wall_s": wall_s,
        "baseline_wall_s": base_s,
        "ratio_vs_baseline": wall_s / base_s,
        "requests_per_wall_s": sim.counters.completed / wall_s,
        "simulated_s": sim.now,
        "speedup_vs_real_time": sim.now / wall_s,
    }
    print(f"{len(trace):,} requests, paged, 20 GiB llama-3-8b pool: {result['completed']:,} completed")
    print(f"  allocator replay   {wall_s:6.2f} s wall  ({result['requests_per_wall_s']:,.0f} requests/s, "
          f"{result['speedup_vs_real_time']:,.0f}x real time)")
    print(f"  accounting only    {base_s:6.2f} s wall  (baseline, same run)")
    print(f"  ratio              {result['ratio_vs_baseline']:6.2f}x  (real allocator / accounting alone)")
    if write:
        t0 = time.perf_counter()
        sims = []
        for name in RESERVATIONS:
            s = Simulator(trace, SimConfig(strategy=name, pool_gib=20.0))
            s.run()
            sims.append(s)
            print(f"  {name:<18} {s.wall_s:6.2f} s wall")
        report = build_report(sims, trace.summary())
        paths = write_report(report, report_dir)
        study = study_md(run_study(0, trace))
        (report_dir / "policy_study.md").write_text(study)
        print(f"\nall four strategies in {time.perf_counter() - t0:.1f} s; wrote "
              + ", ".join(p.name for p in paths) + f", policy_study.md in {report_dir}\n")
        print(markdown(report))
        result["report"] = report
    return result


if __name__ == "__main__":
    run(write="--no-report" not in sys.argv[1:])
