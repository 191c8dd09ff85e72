"""Browser benchmark: is the dashboard smooth on a 1,000,000-block pool under ~5,000 ops/s?

Starts a real server (or uses `base_url`), creates a paged pool of 1,000,000 blocks, opens the
page in Debian's Chromium, and measures in the page, from requestAnimationFrame timestamps:
frames per second and p95 frame time, plus `performance.memory.usedJSHeapSize`. It does so
first on the idle page (the baseline) and then while a driver thread sends REST batches
(`POST /api/pools/{pool}/ops`) at the target rate, and prints load/idle ratios.

    .venv/bin/python -m bench.bench_dashboard [duration_s]

The page runs under its own Content-Security-Policy (`script-src 'self'`, no bypass): what the
bench evaluates in it is always a function (Playwright calls a function through the DevTools
protocol; a string expression would need `eval`, which that policy refuses).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quick import sized

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-precise-memory-info",
]
POOL = "bench-1m"
NUM_BLOCKS = sized(1_000_000, 65_536)
DURATION_S = sized(10.0, 1.0)
# Small blocks keep the pool's tensor at 64 MiB: the benchmark is about the page, not storage.
BLOCK_BYTES = 64
TARGET_OPS_PER_S = 5_000
BATCH_EVERY_S = 0.1  # 10 batches/s of 500 ops
TARGET_LIVE = 20_000  # live allocations around which the driver hovers (about half the pool)

# Collects rAF timestamps for `ms` milliseconds; resolves to the frame intervals and the heap.
MEASURE_JS = """
(ms) => new Promise((resolve) => {
  const stamps = [];
  const t0 = performance.now();
  const f0 = window.kvscope.lastFrame();
  function tick(t) {
    stamps.push(t);
    if (t - t0 < ms) requestAnimationFrame(tick);
    else {
      const dts = [];
      for (let i = 1; i < stamps.length; i++) dts.push(stamps[i] - stamps[i - 1]);
      resolve({ dts, elapsed: stamps[stamps.length - 1] - stamps[0],
                heap: performance.memory ? performance.memory.usedJSHeapSize : null,
                framesReceived: window.kvscope.lastFrame() - f0 });
    }
  }
  requestAnimationFrame(tick);
})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "KVSCOPE_TOKEN"}
    env.setdefault("KVSCOPE_DEVICE", "cpu")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a hang guard: a loaded host takes tens of seconds to import torch
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become healthy")


class Driver(threading.Thread):
    """Sends allocate/free batches at TARGET_OPS_PER_S until stopped; counts what it sent."""

    def __init__(self, base: str, ops_per_s: int = TARGET_OPS_PER_S) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base, timeout=10)
        self.batch = max(1, int(ops_per_s * BATCH_EVERY_S))
        self.stop_event = threading.Event()
        self.live: list[int] = []
        self.ops_sent = 0
        self.seconds = 0.0
        self.errors = 0
        self.rng = random.Random(1)

    def _ops(self) -> list[dict]:
        ops: list[dict] = []
        for _ in range(self.batch):
            if self.live and (len(self.live) > TARGET_LIVE or self.rng.random() < 0.5):
                i = self.rng.randrange(len(self.live))
                self.live[i], self.live[-1] = self.live[-1], self.live[i]
                ops.append({"op": "free", "id": self.live.pop()})
            else:
                ops.append({"op": "allocate", "bytes": BLOCK_BYTES * self.rng.randint(1, 48)})
        return ops

    def run(self) -> None:
        t0 = time.monotonic()
        next_at = t0
        while not self.stop_event.is_set():
            ops = self._ops()
            r = self.client.post(f"/api/pools/{POOL}/ops", json={"ops": ops})
            self.ops_sent += len(ops)
            if r.status_code == 200:
                for op, res in zip(ops, r.json().get("results", [])):
                    if op["op"] == "allocate" and res.get("ok") and res.get("id") is not None:
                        self.live.append(res["id"])
            else:
                self.errors += 1
            next_at += BATCH_EVERY_S
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
            else:
                next_at = time.monotonic()  # behind: do not build a backlog
        self.seconds = time.monotonic() - t0


def _summary(m: dict) -> dict:
    dts = sorted(m["dts"]) or [float("nan")]
    p95 = dts[min(len(dts) - 1, int(0.95 * len(dts)))]
    fps = len(m["dts"]) / (m["elapsed"] / 1000) if m["elapsed"] else float("nan")
    return {"fps": fps, "p95_ms": p95, "heap_mb": (m["heap"] or 0) / 2**20, "frames_received": m["framesReceived"]}


def run(duration_s: float = DURATION_S, base_url: str | None = None) -> dict:
    """Measure idle and loaded page for `duration_s` each; print and return the figures."""
    from playwright.sync_api import TimeoutError as PageTimeout
    from playwright.sync_api import sync_playwright

    proc = None
    if base_url is None:
        proc, base_url = _start_server()
    client = httpx.Client(base_url=base_url, timeout=30)
    try:
        client.delete(f"/api/pools/{POOL}")
        r = client.post("/api/pools", json={"name": POOL, "strategy": "paged", "num_blocks": NUM_BLOCKS,
                                            "block_bytes": BLOCK_BYTES})
        r.raise_for_status()
        # start half full so the map has something to draw
        for _ in range(sized(20, 2)):
            client.post(f"/api/pools/{POOL}/ops", json={"ops": [
                {"op": "allocate", "bytes": BLOCK_BYTES * random.randint(1, 48)} for _ in range(1000)]})
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(f"{base_url}/?pool={POOL}")
            page.wait_for_function(
                "() => window.kvscope && window.kvscope.connection === 'open' && window.kvscope.lastFrame() >= 0",
                timeout=30_000)
            page.wait_for_timeout(1500)
            idle = _summary(page.evaluate(MEASURE_JS, int(duration_s * 1000)))
            driver = Driver(base_url)
            driver.start()
            page.wait_for_timeout(500)
            loaded = _summary(page.evaluate(MEASURE_JS, int(duration_s * 1000)))
            driver.stop_event.set()
            driver.join(timeout=10)
            paint = page.evaluate("() => window.kvscope.paintStats()")
            # after the load stops, the painted map must equal the server's block counts
            used = client.get(f"/api/pools/{POOL}/stats").json()["used_blocks"]
            try:
                page.wait_for_function("(used) => window.kvscope.paintedCounts().occupied === used",
                                       arg=used, timeout=10_000)
                consistent = True
            except PageTimeout:
                consistent = False
            browser.close()
        ops_per_s = driver.ops_sent / driver.seconds if driver.seconds else 0.0
    finally:
        client.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
    result = {"idle": idle, "load": loaded, "ops_per_s": ops_per_s, "driver_errors": driver.errors,
              "paint_ms": paint, "map_matches_server": consistent}
    print(f"dashboard on a {NUM_BLOCKS:,}-block pool, {duration_s:.0f} s each, same run:")
    print(f"  {'':<22}{'idle':>10}{'under load':>14}{'ratio':>9}")
    for key, label in (("fps", "frames/s"), ("p95_ms", "p95 frame time (ms)"), ("heap_mb", "JS heap (MiB)")):
        a, b = idle[key], loaded[key]
        print(f"  {label:<22}{a:>10.1f}{b:>14.1f}{(b / a if a else float('nan')):>8.2f}x")
    print(f"  load: {ops_per_s:,.0f} ops/s achieved (target {TARGET_OPS_PER_S:,}), "
          f"{loaded['frames_received']} delta frames received, {driver.errors} failed batches")
    print(f"  map repaint per painted frame: p50 {paint['p50']:.2f} ms, p95 {paint['p95']:.2f} ms, "
          f"max {paint['max']:.2f} ms over {paint['frames']} frames "
          f"({paint['p95'] / 16.7:.2f}x of a 60 Hz frame budget at p95)")
    print(f"  painted map equals the server's used blocks after the load: {consistent}")
    return result


if __name__ == "__main__":
    run(float(sys.argv[1]) if len(sys.argv) > 1 else DURATION_S, os.environ.get("KVSCOPE_URL") or None)
