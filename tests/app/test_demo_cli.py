"""`kvscope demo` without an engine environment: one line saying how to build it, exit 2; the
links it prints open the fleet and the pools it sets up."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
from apputil import ROOT, SMALL, LiveApp, free_port

from app.engines.demo import engine_specs, fleet_link, register
from app.main import create_app
from app.settings import Settings


def test_demo_without_engine_environment_says_how_to_build_it(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "KVSCOPE_ENGINE_VENV": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--engines", "2"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "`make engines-env` builds it" in lines[0], r.stderr
    assert r.stdout == ""


def test_demo_refuses_a_bad_engine_count():
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--engines", "9"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--engines must be 1..4" in r.stderr, r


def test_the_links_the_demo_prints_open_its_fleet_and_its_pools(tmp_path):
    """`kvscope demo` prints a fleet-view link and one link per engine's mirror pool; on a real
    server set up as the demo sets it up, each names a fleet or pool that server serves."""
    specs = engine_specs(2, free_port(), tmp_path)  # nothing listens there: the engines are down
    app = create_app(Settings(**SMALL))
    register(app, specs)
    with LiveApp(app) as live:
        line = fleet_link("127.0.0.1", live.port, [s.name for s in specs])
        fleet = re.search(rf"{re.escape(live.url)}/\?fleet=([\w-]+)#fleet\b", line)
        assert fleet, line
        r = httpx.get(f"{live.url}/api/fleets/{fleet.group(1)}", timeout=10)
        assert r.status_code == 200, r.text
        assert [e["name"] for e in r.json()["engines"]] == ["engine-0", "engine-1"]
        pools = re.findall(rf"{re.escape(live.url)}/\?pool=([\w-]+)", line)
        assert pools == ["engine-0", "engine-1"], line
        served = {p["name"] for p in httpx.get(f"{live.url}/api/pools", timeout=10).json()["pools"]}
        assert served == set(pools)
        for p in pools:
            assert httpx.get(f"{live.url}/api/pools/{p}/stats", timeout=10).status_code == 200
