"""Exports: the memory snapshot read by torch's own _memory_viz, and the CSV of events.

The pools run seeded random operations; the snapshot is then fed to torch.cuda._memory_viz
(`trace`, `segsum`, `trace_plot`, and the `trace_plot` command line) and what it reports is
checked against the pool's own figures: allocations, final and peak allocated bytes, reserved
and requested totals.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import pickle
import random
import re
import subprocess
import sys

import pytest
from torch.cuda import _memory_viz as mv

from allocator import KVCache, OutOfMemory, create_pool
from allocator.history.exports import CSV_COLUMNS, events_csv, memory_snapshot, memory_snapshot_dict

BLOCK = 64


def run_ops(strategy: str, seed: int, steps: int = 300):
    pool = create_pool(strategy, num_blocks=256, block_bytes=BLOCK, device="cpu", history=True, event_capacity=32)
    rng = random.Random(seed)
    ids: list[int] = []
    allocated = [0]  # pool allocated_bytes after every op (the pool's own figure)
    for _ in range(steps):
        r = rng.random()
        try:
            if r < 0.45 or not ids:
                ids.append(pool.allocate(rng.randint(1, 12 * BLOCK)))
            elif r < 0.75:
                pool.free(ids.pop(rng.randrange(len(ids))))
            elif r < 0.85:
                pool.extend(ids[rng.randrange(len(ids))], rng.randint(1, 4 * BLOCK))
            elif r < 0.93:
                aid = ids[rng.randrange(len(ids))]
                pool.truncate(aid, max(1, pool._allocs[aid][0] // 2))
            elif r < 0.97:
                pool.defragment()
            else:
                pool.reset()
                ids.clear()
        except OutOfMemory:
            pass
        allocated.append(pool.stats()["allocated_bytes"])
    return pool, allocated


def trace_peak(data: dict) -> tuple[int, int]:
    """(final, peak) bytes of the trace, summed as memory_viz's timeline does."""
    cur = peak = 0
    for e in data["device_traces"][0]:
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_completed":
            cur -= e["size"]
        peak = max(peak, cur)
    return cur, peak


@pytest.mark.parametrize("strategy,seed", [("paged", 1), ("contiguous", 2), ("tiered", 3), ("paged", 4)])
def test_memory_viz_reports_the_pools_own_figures(strategy: str, seed: int) -> None:
    pool, allocated = run_ops(strategy, seed)
    view = pool.history.view()
    data = pickle.loads(memory_snapshot(view, "p"))
    stats = pool.stats()
    # torch's text trace: one line per entry and one "name = segment[offset:size]" per alloc.
    text = mv.trace(data)
    entries = data["device_traces"][0]
    assert text.startswith(f"Device 0 ----------------\n{len(entries)} entries\n")
    allocs = [e for e in entries if e["action"] == "alloc"]
    # (trace() names an address outside the segment's allocated_size "MEM", a torch quirk)
    assert len(re.findall(r"^\w+ = (?:seg_0|MEM)\[", text, re.M)) == len(allocs)
    # (its closing "TOTAL MEM" is not a total: the loop's enumerate reuses its counter variable)
    final, peak = trace_peak(data)
    assert final == stats["allocated_bytes"]
    # The peak over the replayed history equals the trace's; the live per-op figure bounds it.
    replayed_peak = max(view.stats_at(s)["allocated_bytes"] for s in range(view.first_seq, view.last_seq + 1))
    assert peak == replayed_peak >= max(allocated)
    # Every free names an earlier alloc's address and size.
    live: dict[int, int] = {}
    for e in entries:
        if e["action"] == "alloc":
            assert e["addr"] not in live
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            assert live.pop(e["addr"]) == e["size"]
    # torch's segment summary: the one segment covers the pool; allocated = requested bytes.
    summary = mv.segsum(data)
    assert f"total_reserved: {mv.Bytes(stats['capacity_bytes'])}\n" in summary
    assert f"total_allocated: {mv.Bytes(stats['requested_bytes'])}\n" in summary
    seg = data["segments"][0]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"] == stats["capacity_bytes"]
    assert sum(b["requested_size"] for b in seg["blocks"]) == stats["requested_bytes"]
    # trace_plot embeds the very snapshot in its page.
    html = mv.trace_plot(data)
    blob = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))[0]["base64"]
    assert pickle.loads(base64.b64decode(blob)) == data


def test_trace_plot_command_line_renders_the_file(tmp_path) -> None:
    pool, _ = run_ops("contiguous", 5, steps=120)
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(memory_snapshot(pool.history.view()))
    out = tmp_path / "out.html"
    proc = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(snap), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "snapshot.pickle" in out.read_text()


def test_oom_is_traced_and_window_starts_with_live_allocations() -> None:
    pool = create_pool("paged", num_blocks=16, block_bytes=BLOCK, device="cpu", history=True)
    keep = pool.allocate(4 * BLOCK)
    for _ in range(50):
        pool.free(pool.allocate(BLOCK))
    with pytest.raises(OutOfMemory):
        pool.allocate(13 * BLOCK)  # fits the pool, not what is free
    data = memory_snapshot_dict(pool.history.view(), max_events=10)
    entries = data["device_traces"][0]
    assert entries[0]["action"] == "alloc" and entries[0]["size"] == 4 * BLOCK  # `keep`, live at the start
    assert entries[-1]["action"] == "oom" and entries[-1]["size"] == 13 * BLOCK
    assert trace_peak(data)[0] == pool.held_bytes(keep)


def test_csv_has_one_row_per_event_with_block_ids() -> None:
    pool = create_pool("paged", num_blocks=32, block_bytes=BLOCK, device="cpu", history=True)
    cache = KVCache(pool, 8 * BLOCK, "lru")
    a = pool.allocate(3 * BLOCK)
    cache.put("k", 2 * BLOCK)
    cache.pin("k")
    pool.free(a)
    rows = list(csv.DictReader(io.StringIO(events_csv(pool.history.view()))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["type"] for r in rows] == ["allocate", "allocate", "put", "state", "free"]
    assert rows[0]["block_ids"] == "0 1 2" and rows[-1]["block_ids"] == "0 1 2"
    assert rows[3]["state"] == "3" and rows[3]["block_ids"] == "3 4"
    assert [int(r["seq"]) for r in rows] == list(range(1, 6))
