"""`kvscope demo --sim N`: simulated engines in seconds, no vLLM environment: the fleet `demo`
fills with their blocks read from their own KV events, their /metrics count hits, and SIGTERM
stops everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
from support.apputil import ROOT, free_port

DEADLINE = 60.0


def start_demo(tmp_path, n: int, *extra: str):
    """The demo on a free port; a port another process took meanwhile is tried again."""
    for _ in range(3):
        port = free_port()
        out = open(tmp_path / f"demo-{port}.out", "w+")  # noqa: SIM115 (read after it exits)
        env = {**os.environ, "KVSCOPE_ENGINE_VENV": str(tmp_path / "no-engine-env")}
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--sim", str(n),
                                 "--port", str(port), "--speed", "10", *extra], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return proc, port, out
            except httpx.HTTPError:
                time.sleep(0.2)
        out.seek(0)
        text = out.read()
        kill(proc)
        assert "already in use" in text.lower(), text
    raise AssertionError("no free port for the demo")


def kill(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_demo_sim_fills_the_fleet_from_simulated_engines_without_an_engine_env(tmp_path):
    t0 = time.monotonic()
    proc, port, out = start_demo(tmp_path, 2)
    try:
        base = f"http://127.0.0.1:{port}"
        end = time.monotonic() + DEADLINE
        while True:
            rows = httpx.get(f"{base}/api/fleets/demo", timeout=10).json()["engines"]
            ready = [r for r in rows if r["cached_blocks"] > 0 and r["stream"]["state"] == "live"
                     and ((r.get("metrics") or {}).get("prefix_cache_queries") or 0) > 0]
            if len(ready) == 2:
                break
            assert time.monotonic() < end, rows
            time.sleep(0.5)
        up_s = time.monotonic() - t0
        assert sorted(r["name"] for r in rows) == ["engine-0", "engine-1"]
        assert all(r["block_size"] == 32 and r["errors"] == [] for r in rows), rows
        pools = {p["name"] for p in httpx.get(f"{base}/api/pools", timeout=10).json()["pools"]}
        assert {"engine-0", "engine-1"} <= pools
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out.seek(0)
        text = out.read()
        assert "stopped 2 simulated engine(s)" in text, text
        assert "(simulated) at http://127.0.0.1:" in text
        assert up_s < DEADLINE
    finally:
        kill(proc)


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def test_demo_sim_behind_a_real_router_fills_every_engine_lists_its_run_and_stops_the_router(
        tmp_path):
    t0 = time.monotonic()
    proc, port, out = start_demo(tmp_path, 4, "--router", "sglang")
    try:
        base = f"http://127.0.0.1:{port}"
        routers = _children_of(proc.pid)  # the router is the demo's one child process
        assert len(routers) == 1, routers
        end = t0 + DEADLINE
        while True:
            rows = httpx.get(f"{base}/api/fleets/demo", timeout=10).json()["engines"]
            if len(rows) == 4 and all(r["cached_blocks"] > 0 for r in rows):
                break
            assert time.monotonic() < end, rows
            time.sleep(0.5)
        assert all(r["block_size"] == 512 for r in rows), rows
        # the router run is listed, its decisions recorded at the engines
        runs = httpx.get(f"{base}/api/routing", timeout=10).json()["runs"]
        assert [(r["mode"], r["router"], r["state"], r["fleet"]) for r in runs] == \
            [("router", "sglang", "running", "demo")], runs
        run = runs[0]
        assert run["done"] > 0 and len(run["replica_figures"]) == 4
        page = httpx.get(f"{base}/api/routing/{run['id']}/decisions", params={"limit": 1000},
                         timeout=10).json()
        assert page["total"] > 0 and page["policy"] == "router:sglang"
        served = {d["replica"] for d in page["decisions"]}
        assert served <= {0, 1, 2, 3} and all(d["rule"] == "router" for d in page["decisions"])
        assert sum(page["logs"][0]["by_replica"]) == page["total"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out.seek(0)
        text = out.read()
        assert "the real sglang router at http://127.0.0.1:" in text, text
        assert "stopped the sglang router" in text, text
        assert not os.path.exists(f"/proc/{routers[0]}") or \
            open(f"/proc/{routers[0]}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        kill(proc)


def test_demo_router_needs_sim_and_a_known_router(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--router", "sglang"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--router needs --sim" in r.stderr, r
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--sim", "1", "--router", "nginx",
                        "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "unknown router 'nginx'" in r.stderr, r
