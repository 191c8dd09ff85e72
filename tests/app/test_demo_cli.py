"""`kvscope demo` without an engine environment: one line saying how to build it, exit 2."""

from __future__ import annotations

import subprocess
import sys

from apputil import ROOT


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
