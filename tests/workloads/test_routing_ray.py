"""The Ray executor: each grid point one Ray task on a local instance, rows equal to the local
process pool's, and the instance gone afterwards."""

import os
import shutil
import time
from pathlib import Path

import ray  # the `test` extra installs it: `make test` covers this path
from routing_util import random_rows, trace_of

from workloads.routing.grid import Settings, grid, run_grid


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_ray_executor_equals_the_local_one_and_leaves_no_processes(monkeypatch):
    temp = f"/tmp/kvr-{os.getpid()}"  # short: Ray's unix sockets live under it
    monkeypatch.setenv("RAY_TMPDIR", temp)
    trace = trace_of(random_rows(9, requests=120))
    points = (grid(["round_robin", "dynamo_kv", "sglang_cache_aware"], [2, 3], [8 * 512], "sequence")
              + grid(["llmd_precise"], [2], [40 * 512], "serving"))
    seen = []
    rows = run_grid(trace, points, Settings(), "ray", progress=lambda done, total: seen.append(done))
    local = run_grid(trace, points, Settings(), "local", workers=1)
    assert rows == local
    assert seen[-1] == len(points)
    assert not ray.is_initialized()
    deadline = time.monotonic() + 30
    while _processes_mentioning(temp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(temp) == []
    shutil.rmtree(temp, ignore_errors=True)
