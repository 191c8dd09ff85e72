"""History benchmark: what keeping every event costs the allocator, and how fast the past reads.

1. blocks/s of single-block and 16-block allocate+free and of cache puts that evict on every
   put, with the pool's history ON (as the server keeps it) and OFF (a pool made from Python
   keeps none unless asked), measured in
   alternating windows of the same run; ratio on/off (aim: >= 0.5, i.e. never halved).
2. A 1,000,000-event history (churn of 1-32-block requests on a 65,536-block paged pool, the
   same on a contiguous pool, and on a 1,000,000-block paged pool): time to rebuild the block
   map and stats at 200 random points (median and worst CPU ms of the reading thread; aim: worst <= 100 ms), the
   history's bytes per event, and the charts' series (`GET .../history/series`) over the whole
   history at 300 and 2000 points.

Run: .venv/bin/python -m bench history   (or python bench/bench_history.py); ~60 s.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator import KVCache, create_pool
from allocator.history.series import history_series
from bench.quick import sized

BLOCK = 256
POOL_BLOCKS = 65_536
WINDOW_S = sized(0.25, 0.01)
EVENTS = sized(1_000_000, 5_000)
POINTS = sized(200, 3)
BIG_BLOCKS = sized(1_000_000, 131_072)


def single(history: bool):
    pool = create_pool("paged", num_blocks=POOL_BLOCKS, block_bytes=BLOCK, device="cpu",
                       history_bytes=None if not history else 256 << 20)
    alloc, free = pool.allocate, pool.free

    def step():
        free(alloc(BLOCK))
    return step, 1


def batch16(history: bool):
    pool = create_pool("paged", num_blocks=POOL_BLOCKS, block_bytes=BLOCK, device="cpu",
                       history_bytes=None if not history else 256 << 20)
    alloc, free = pool.allocate, pool.free

    def step():
        free(alloc(16 * BLOCK))
    return step, 16


def cache_evict(history: bool):
    pool = create_pool("paged", num_blocks=POOL_BLOCKS, block_bytes=BLOCK, device="cpu",
                       history_bytes=None if not history else 256 << 20)
    cache = KVCache(pool, 1024 * BLOCK, "lru")
    state = {"i": 0}

    def step():
        state["i"] += 1
        cache.put(f"k{state['i']}", BLOCK)
    for _ in range(1100):
        step()
    return step, 1


def window(step, per_step: int) -> float:
    """Blocks per second of this thread's CPU time (the spills run in it too): on a shared host
    wall time mostly measures the neighbours' load."""
    n, t0 = 0, time.thread_time()
    while True:
        for _ in range(200):
            step()
        n += 200
        elapsed = time.thread_time() - t0
        if elapsed >= WINDOW_S:
            return n * per_step / elapsed


def on_off(make) -> tuple[float, float]:
    """Best blocks/s with history on and off, over 4 alternating windows each."""
    on, per = make(True)
    off, _ = make(False)
    for _ in range(500):
        on()
        off()
    best_on = best_off = 0.0
    for _ in range(sized(4, 1)):
        best_on = max(best_on, window(on, per))
        best_off = max(best_off, window(off, per))
    return best_on, best_off


def build(strategy: str, events: int, num_blocks: int = POOL_BLOCKS):
    pool = create_pool(strategy, num_blocks=num_blocks, block_bytes=BLOCK, device="cpu",
                       history_bytes=1 << 30)
    rng = random.Random(1)
    live = []
    t0 = time.perf_counter()
    while pool.events.last_seq < events:
        if live and (len(live) > 1500 or rng.random() < 0.45):
            pool.free(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(pool.allocate(rng.randint(1, 32) * BLOCK))
            except Exception:  # an OOM is an event too
                pass
    return pool, time.perf_counter() - t0


def read_points(pool) -> list[float]:
    view = pool.history.view()
    rng = random.Random(2)
    times = []
    for _ in range(POINTS):
        seq = rng.randint(view.first_seq, view.last_seq)
        t0 = time.thread_time()
        view.stats_at(seq)  # replays the map too
        times.append((time.thread_time() - t0) * 1e3)
    return times


def run() -> None:
    print("== history: cost on the allocator (same run, alternating windows, CPU time of the thread) ==")
    for name, make in (("single-block allocate+free", single), ("16-block allocate+free", batch16),
                       ("cache put evicting on every put", cache_evict)):
        on, off = on_off(make)
        print(f"{name:34s} history on {on / 1e6:6.2f} M blocks/s   off {off / 1e6:6.2f} M blocks/s   "
              f"ratio {on / off:5.2f}x  (aim >= 0.5)")
    print(f"== history: any point of a {EVENTS:,}-event history ==")
    for strategy, blocks in (("paged", POOL_BLOCKS), ("contiguous", POOL_BLOCKS), ("paged", BIG_BLOCKS)):
        pool, secs = build(strategy, EVENTS, blocks)
        h = pool.history
        times = read_points(pool)
        view = h.view()
        series_ms = []
        for points in (300, 2000):
            t0 = time.thread_time()
            history_series(view, view.first_seq, view.last_seq, points)
            series_ms.append((time.thread_time() - t0) * 1e3)
        print(f"{strategy:10s} {blocks:>9,} blocks, {pool.events.last_seq:,} events built in {secs:.1f} s; "
              f"{len(h.keyframes)} keyframes, "
              f"{h.nbytes / pool.events.last_seq:.1f} B/event ({h.nbytes / 2**20:.1f} MiB); "
              f"map+stats at {POINTS} random points: median {statistics.median(times):.1f} ms, "
              f"worst {max(times):.1f} ms  (aim <= 100 ms); the charts' series over the whole "
              f"history, 300 / 2000 points: {series_ms[0]:.0f} / {series_ms[1]:.0f} ms")


if __name__ == "__main__":
    run()
