"""Stalled stream clients: server RSS with clients that complete the websocket handshake and
never read, on a 1M-block pool under churn; with the stall rule (dropped after
KVSCOPE_STREAM_STALL_MS) against the same run with the rule effectively off (a stall limit of
10 minutes, what the server did before it had one).

Printed: RSS before, with the clients stalled, and some seconds after the stall limit, per
server; the extra RSS per stalled client; how many of the stalled sockets the server closed.

Run: .venv/bin/python -m bench stalled   (about a minute)
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quick import sized

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = sized(12, 3)
BLOCKS = sized(1 << 20, 1 << 16)
CHURN_S = sized(6.0, 0.5)
STALL_MS = sized(2000, 200)
AFTER_S = sized(3.0, 0.5)  # waited past the stall limit before RSS is read again
ALLOC_BLOCKS = sized(512, 32)  # per allocation: 1,000 of them take about half the pool


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(stall_ms: int) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "KVSCOPE_STREAM_STALL_MS": str(stall_ms), "KVSCOPE_DEFAULT_BLOCKS": "1024",
           "KVSCOPE_MAX_STREAM_CLIENTS_PER_POOL": str(CLIENTS + 4)}
    env.pop("KVSCOPE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120  # a hang guard: a loaded host takes tens of seconds to import torch
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def stalled_client(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws/pools/big HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server ended the connection (drain what is buffered; EOF or reset = closed)."""
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, OSError):
        return True


def churn(c: httpx.Client, seconds: float) -> None:
    """Allocate and free across the whole map, so every tick has deltas for every client."""
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        res = c.post("/api/pools/big/ops", json={"ops": [{"op": "allocate", "bytes": 16 * ALLOC_BLOCKS}] * 1000}).json()
        c.post("/api/pools/big/ops", json={"ops": [{"op": "free", "id": r["id"]} for r in res["results"] if r["ok"]]})


def measure(stall_ms: int, clients_n: int = CLIENTS) -> dict:
    proc, port = start(stall_ms)
    clients: list[socket.socket] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            c.post("/api/pools", json={"name": "big", "num_blocks": BLOCKS, "block_bytes": 16}).raise_for_status()
            time.sleep(0.5)
            before = rss_mb(proc.pid)
            clients = [stalled_client(port) for _ in range(clients_n)]
            churn(c, CHURN_S)
            stalled = rss_mb(proc.pid)
            time.sleep(STALL_MS / 1000 + AFTER_S)  # the stall limit, and a little more
            after = rss_mb(proc.pid)
        dropped = sum(closed_by_server(s) for s in clients)
        return {"before_mb": before, "stalled_mb": stalled, "after_mb": after, "dropped": dropped,
                "clients": clients_n}
    finally:
        for s in clients:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run() -> dict:
    rows = {"no clients": measure(STALL_MS, 0), "stall rule on": measure(STALL_MS),
            "stall rule off": measure(600_000)}
    print(f"{CLIENTS} never-reading websocket clients on a {BLOCKS:,}-block pool under churn ({CHURN_S:.0f} s)")
    print(f"{'server':>15} {'RSS before':>11} {'stalled':>9} {'after':>9} | {'per client':>10} | closed by server")
    base = rows["no clients"]["stalled_mb"] - rows["no clients"]["before_mb"]  # churn alone
    for name, r in rows.items():
        per = (r["stalled_mb"] - r["before_mb"] - base) / CLIENTS
        print(f"{name:>15} {r['before_mb']:>8.0f} MB {r['stalled_mb']:>6.0f} MB {r['after_mb']:>6.0f} MB | "
              f"{per:>7.1f} MB | {r['dropped']}/{r['clients']}")
    on, off = rows["stall rule on"], rows["stall rule off"]
    quiet = rows["no clients"]["after_mb"] - rows["no clients"]["before_mb"]
    held_on, held_off = on["after_mb"] - on["before_mb"] - quiet, off["after_mb"] - off["before_mb"] - quiet
    print(f"RSS held because of the clients (less the no-client run) {STALL_MS / 1000 + AFTER_S:.0f} s "
          f"after the churn (stall limit {STALL_MS / 1000:g} s): {held_on:.0f} MB with the rule vs "
          f"{held_off:.0f} MB without ({held_on / held_off if held_off > 0 else float('nan'):.2f}x)")
    return rows


if __name__ == "__main__":
    run()
