"""`kvscope demo` without an engine environment: one line saying how to build it, exit 2; the
links it prints open the fleet and the pools it sets up."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
from support.apputil import ROOT, SMALL, LiveApp, free_port

from app.engines.demo import engine_specs, fleet_link, startup_for
from app.main import create_app
from app.settings import Settings


def test_demo_without_engine_environment_says_how_to_build_it(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "KVSCOPE_ENGINE_VENV": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--engines", "2"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "`kvscope engines-env` builds it" in lines[0], r.stderr
    assert r.stdout == ""


def test_demo_refuses_a_bad_engine_count():
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--engines", "9"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--engines must be 1..4" in r.stderr, r


def test_the_links_the_demo_prints_open_its_fleet_and_its_pools(tmp_path):
    """`kvscope demo` prints a fleet-view link and one link per engine's mirror pool; on a real
    server set up as the demo sets it up, each names a fleet or pool that server serves."""
    specs = engine_specs(2, free_port(), tmp_path)  # nothing listens there: the engines are down
    app = create_app(Settings(**SMALL), startup_for(specs))
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


def test_the_demo_probes_each_engine_port_and_names_a_taken_one(tmp_path):
    """Before starting any engine the demo binds every port it would give one (P+101+3i ..
    P+103+3i of --port P): the exact port held here is named, with its engine."""
    import socket

    from app.engines.demo import taken_ports

    with socket.socket() as blocker:
        for _ in range(20):  # a P whose engine-1 events port this test can hold
            specs = engine_specs(2, free_port(), tmp_path)
            try:
                blocker.bind(("127.0.0.1", specs[1].events_port))
                break
            except OSError:
                continue
        else:
            raise AssertionError("no port to hold")
        blocker.listen()
        lines = taken_ports(specs)
        assert f"engine engine-1: events port {specs[1].events_port} already in use" in lines, lines
        assert not [line for line in lines if f"port {specs[1].events_port}" in line
                    and not line.startswith("engine engine-1:")], lines


def test_the_demo_refuses_ports_past_65535(tmp_path):
    from app.engines.demo import taken_ports

    lines = taken_ports(engine_specs(2, 65_430, tmp_path))  # engine-1: 65534 .. 65536
    past = [line for line in lines if "past 65535" in line]
    assert len(past) == 1 and past[0].startswith("engine engine-1: ") and past[0].endswith(
        "replay port 65536 is past 65535"), lines
    lines = taken_ports(engine_specs(1, 65_500, tmp_path))
    assert lines == ["engine engine-0: http port 65601 is past 65535, events port 65602 is past "
                     "65535, replay port 65603 is past 65535"], lines
    r = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--port", "70000"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--port must be 1..65535" in r.stderr, r
