"""Server benchmark against a real uvicorn on loopback; prints ratios against baselines.

1. allocate+free requests/s and p50/p99 at concurrency 1, 16 and 64, next to GET /healthz
   measured the same way in the same run (ratio; aim >= 0.6).
2. blocks/s through the batch endpoint (aim >= 1M).
3. a 1,000,000-block pool, 10 websocket clients, ~5,000 ops/s: time from a REST op to the delta
   that shows it (median aim < 100 ms), delta bytes per changed run, the server's CPU share.
4. /healthz p99 while `check` and the JSON block map of a fragmented 1M-block pool run (in a
   worker thread under the pool's lock), against idle /healthz p99 in the same run (ratio).

Run: .venv/bin/python -m bench.bench_server   (or python bench/bench_server.py); < 2 minutes.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quick import sized

ROOT = Path(__file__).resolve().parents[1]
PHASE_S = sized(2.5, 0.3)
CONCURRENCY = (1, 16, 64)
WS_CLIENTS = 10
OPS_PER_S = 5_000
STREAM_S = sized(8.0, 1.0)
BIG_BLOCKS = sized(1_000_000, 65_536)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "KVSCOPE_DEFAULT_BLOCKS": "65536", "KVSCOPE_MAX_BATCH": "10000"}
    env.pop("KVSCOPE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a hang guard: a loaded host takes tens of seconds to import torch
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# -- 1. request rate and latency ---------------------------------------------------------------
class RawClient:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: httpx's own per-request cost
    (about 1 ms) would otherwise dominate what is measured on a 2-core machine."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
                f"Content-Type: application/json\r\n\r\n").encode()
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        self.writer.close()


async def _load(url: str, concurrency: int, kind: str) -> tuple[float, list[float]]:
    import json

    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    clients = [RawClient(host, int(port)) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in clients))
    stop = time.perf_counter() + PHASE_S
    body = b'{"bytes": 4096}'

    async def worker(client: RawClient) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            if kind == "healthz":
                await client.request("GET", "/healthz")
                latencies.append(time.perf_counter() - t0)
            else:
                status, out = await client.request("POST", "/api/pools/bench/allocations", body)
                latencies.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                await client.request("DELETE", f"/api/pools/bench/allocations/{json.loads(out)['id']}")
                latencies.append(time.perf_counter() - t1)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    elapsed = time.perf_counter() - t0
    for c in clients:
        c.close()
    return len(latencies) / elapsed, latencies


def bench_requests(url: str) -> list[dict]:
    httpx.post(url + "/api/pools", json={"name": "bench", "num_blocks": 65536, "block_bytes": 256})
    rows = []
    for c in CONCURRENCY:
        base_rps, base_lat = asyncio.run(_load(url, c, "healthz"))
        rps, lat = asyncio.run(_load(url, c, "alloc"))
        rows.append({"concurrency": c, "rps": rps, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                     "healthz_rps": base_rps, "healthz_p50_ms": pct(base_lat, 50) * 1e3,
                     "healthz_p99_ms": pct(base_lat, 99) * 1e3, "ratio": rps / base_rps})
    return rows


# -- 2. batch throughput -----------------------------------------------------------------------
def bench_batch(url: str) -> dict:
    blocks_per_op, ops_per_batch = 256, 2000
    with httpx.Client(base_url=url, timeout=60) as c:
        c.post("/api/pools", json={"name": "batch", "num_blocks": BIG_BLOCKS, "block_bytes": 16})
        moved, t_alloc, t_free, stop = 0, 0.0, 0.0, time.perf_counter() + sized(4.0, 0.5)
        while time.perf_counter() < stop:
            ops = [{"op": "allocate", "bytes": 16 * blocks_per_op}] * ops_per_batch
            t0 = time.perf_counter()
            res = c.post("/api/pools/batch/ops", json={"ops": ops}).json()["results"]
            t_alloc += time.perf_counter() - t0
            ids = [r["id"] for r in res if r["ok"]]
            t0 = time.perf_counter()
            c.post("/api/pools/batch/ops", json={"ops": [{"op": "free", "id": i} for i in ids]})
            t_free += time.perf_counter() - t0
            moved += len(ids) * blocks_per_op
        c.delete("/api/pools/batch")
    return {"alloc_blocks_per_s": moved / t_alloc, "free_blocks_per_s": moved / t_free,
            "round_trip_blocks_per_s": moved / (t_alloc + t_free)}


# -- 3. stream latency -------------------------------------------------------------------------
class Watcher(threading.Thread):
    """A websocket client that notes, per delta, when it arrived and the largest owner id in it."""

    def __init__(self, ws_url: str) -> None:
        super().__init__(daemon=True)
        from websockets.sync.client import connect

        self._conn = connect(ws_url, max_size=None, compression=None)
        self.ws = self._conn.__enter__()
        self.seen: list[tuple[float, int]] = []
        self.delta_bytes = self.delta_runs = self.delta_blocks = self.snapshots = 0
        self.running = True

    def run(self) -> None:
        import struct

        while self.running:
            try:
                msg = self.ws.recv(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:
                return
            if not isinstance(msg, bytes):
                continue
            now = time.perf_counter()
            kind, nruns = msg[2], struct.unpack_from("<I", msg, 12)[0]
            if kind == 1:
                self.snapshots += 1
            off, top = 16, -1
            for _ in range(nruns):
                start, count = struct.unpack_from("<II", msg, off)
                owners = np.frombuffer(msg, dtype=np.int32, count=count, offset=off + 8)
                top = max(top, int(owners.max()))
                off += 8 + 5 * count
                off += -off % 4
                if kind == 2:
                    self.delta_runs += 1
                    self.delta_blocks += count
            if kind == 2:
                self.delta_bytes += len(msg)
            self.seen.append((now, top))

    def stop(self) -> None:
        self.running = False
        self.join(timeout=2)
        self._conn.__exit__(None, None, None)


def bench_stream(url: str, pid: int) -> dict:
    ws_url = url.replace("http", "ws") + "/ws/pools/big"
    with httpx.Client(base_url=url, timeout=60) as c:
        c.post("/api/pools", json={"name": "big", "num_blocks": BIG_BLOCKS, "block_bytes": 16})
        watchers = [Watcher(ws_url) for _ in range(WS_CLIENTS)]
        for w in watchers:
            w.start()
        time.sleep(1.0)  # let every snapshot arrive
        rng = random.Random(0)
        live: list[int] = []
        marks: list[tuple[float, int]] = []  # (time the batch was sent, largest id it allocated)
        per_batch = 50
        interval = per_batch / OPS_PER_S
        ops_done = 0
        cpu0, t_start = cpu_seconds(pid), time.perf_counter()
        next_at = t_start
        while time.perf_counter() - t_start < STREAM_S:
            ops = []
            for _ in range(per_batch // 2):
                ops.append({"op": "allocate", "bytes": 16 * rng.randint(1, 64)})
            for _ in range(min(per_batch // 2, max(0, len(live) - 2000))):
                ops.append({"op": "free", "id": live.pop(rng.randrange(len(live)))})
            sent = time.perf_counter()
            res = c.post("/api/pools/big/ops", json={"ops": ops}).json()["results"]
            ids = [r["id"] for r in res if r.get("ok") and "id" in r and "allocated_bytes" in r]
            live.extend(ids)
            ops_done += len(ops)
            if ids:
                marks.append((sent, max(ids)))
            next_at += interval
            time.sleep(max(0.0, next_at - time.perf_counter()))
        elapsed = time.perf_counter() - t_start
        cpu = (cpu_seconds(pid) - cpu0) / elapsed
        time.sleep(0.5)
        for w in watchers:
            w.stop()
        c.delete("/api/pools/big")
    latencies = []
    for w in watchers:
        times = [t for t, _ in w.seen]
        tops = np.maximum.accumulate(np.array([m for _, m in w.seen] or [-1]))
        for sent, top in marks:
            i = int(np.searchsorted(tops, top))
            if i < len(times):
                latencies.append(times[i] - sent)
    runs = sum(w.delta_runs for w in watchers)
    return {"ops_per_s": ops_done / elapsed, "clients": WS_CLIENTS,
            "latency_p50_ms": pct(latencies, 50) * 1e3, "latency_p99_ms": pct(latencies, 99) * 1e3,
            "observed": len(latencies), "expected": len(marks) * WS_CLIENTS,
            "delta_bytes_per_run": sum(w.delta_bytes for w in watchers) / max(1, runs),
            "delta_bytes_per_block": (sum(w.delta_bytes for w in watchers)
                                      / max(1, sum(w.delta_blocks for w in watchers))),
            "resync_snapshots": sum(w.snapshots for w in watchers) - WS_CLIENTS,
            "server_cpu_share": cpu}


# -- 4. /healthz while an O(pool) call runs -------------------------------------------------------
CHECK_BLOCKS = sized(1_000_000, 40_000)


def _fragment(c: httpx.Client, name: str) -> None:
    """A 1M-block paged pool holding 500,000 one-block allocations, every other block free."""
    c.post("/api/pools", json={"name": name, "num_blocks": CHECK_BLOCKS, "block_bytes": 16})
    for _ in range(CHECK_BLOCKS // 10_000):
        res = c.post(f"/api/pools/{name}/ops", json={"ops": [{"op": "allocate", "bytes": 16}] * 10_000})
        ids = [r["id"] for r in res.json()["results"]]
        c.post(f"/api/pools/{name}/ops", json={"ops": [{"op": "free", "id": i} for i in ids[::2]]})


async def _healthz_latencies(url: str, seconds: float, busy: threading.Event | None = None) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    client = RawClient(host, int(port))
    await client.open()
    out: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        await client.request("GET", "/healthz")
        if busy is None or busy.is_set():
            out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.002)
    client.close()
    return out


def bench_long_calls(url: str) -> dict:
    """/healthz p99 while `check` (and the JSON block map) of a fragmented 1M-block pool run,
    against idle /healthz p99 in the same run."""
    with httpx.Client(base_url=url, timeout=120) as c:
        _fragment(c, "frag")
        idle = asyncio.run(_healthz_latencies(url, sized(2.0, 0.3)))
        busy, durations, stop = threading.Event(), {"check": [], "blockmap": []}, threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                for name, path in (("check", "/api/pools/frag/check"),
                                   ("blockmap", "/api/pools/frag/blockmap?format=json")):
                    busy.set()
                    t0 = time.perf_counter()
                    r = c.get(path)
                    durations[name].append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text[:200]
                    busy.clear()

        worker = threading.Thread(target=hammer)
        worker.start()
        during = asyncio.run(_healthz_latencies(url, sized(8.0, 1.0), busy))
        stop.set()
        worker.join()
        c.delete("/api/pools/frag")
    return {"idle_p99_ms": pct(idle, 99) * 1e3, "busy_p99_ms": pct(during, 99) * 1e3,
            "busy_max_ms": max(during) * 1e3 if during else float("nan"), "samples": len(during),
            "check_s": float(np.median(durations["check"])) if durations["check"] else float("nan"),
            "blockmap_s": float(np.median(durations["blockmap"])) if durations["blockmap"] else float("nan"),
            "ratio": pct(during, 99) / pct(idle, 99)}


def run() -> dict:
    proc, url = start_server()
    try:
        t0 = time.perf_counter()
        requests = bench_requests(url)
        print("allocate+free vs /healthz (same server, same run)")
        print(f"{'conc':>5} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} | "
              f"{'healthz/s':>9} {'p50 ms':>7} {'p99 ms':>7} | ratio")
        for r in requests:
            print(f"{r['concurrency']:>5} {r['rps']:>8.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} | "
                  f"{r['healthz_rps']:>9.0f} {r['healthz_p50_ms']:>7.2f} {r['healthz_p99_ms']:>7.2f} | "
                  f"{r['ratio']:.2f} (aim >= 0.6)")
        batch = bench_batch(url)
        print(f"batch endpoint: allocate {batch['alloc_blocks_per_s'] / 1e6:.2f} M blocks/s, free "
              f"{batch['free_blocks_per_s'] / 1e6:.2f} M blocks/s, allocate+free round trip "
              f"{batch['round_trip_blocks_per_s'] / 1e6:.2f} M blocks/s "
              f"({batch['round_trip_blocks_per_s'] / 1e6:.2f}x the 1M target)")
        stream = bench_stream(url, proc.pid)
        print(f"stream, {BIG_BLOCKS:,} blocks, {stream['clients']} websocket clients, "
              f"{stream['ops_per_s']:.0f} ops/s: REST op -> delta p50 {stream['latency_p50_ms']:.1f} ms "
              f"(aim < 100; {stream['latency_p50_ms'] / 100:.2f}x), p99 {stream['latency_p99_ms']:.1f} ms; "
              f"{stream['observed']}/{stream['expected']} ops seen")
        print(f"  delta bytes per changed run {stream['delta_bytes_per_run']:.0f} "
              f"({stream['delta_bytes_per_block']:.2f} bytes per changed block, snapshot = 5); "
              f"slow-client resyncs {stream['resync_snapshots']}; "
              f"server CPU {stream['server_cpu_share'] * 100:.0f}% of one core")
        long_calls = bench_long_calls(url)
        print(f"/healthz during a {CHECK_BLOCKS:,}-block check + JSON block map (fragmented, "
              f"{CHECK_BLOCKS // 2:,} allocations; check "
              f"{long_calls['check_s']:.2f} s, blockmap {long_calls['blockmap_s']:.2f} s median): p99 "
              f"{long_calls['busy_p99_ms']:.1f} ms (max {long_calls['busy_max_ms']:.1f}, {long_calls['samples']} "
              f"samples) vs idle p99 {long_calls['idle_p99_ms']:.1f} ms: {long_calls['ratio']:.1f}x")
        print(f"total {time.perf_counter() - t0:.0f} s")
        return {"requests": requests, "batch": batch, "stream": stream, "long_calls": long_calls}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    run()
