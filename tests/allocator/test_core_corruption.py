"""Corrupted compiled structures never crash the process: check() names the damage.

Each structure (the paged core's links, free chain, records and id table; the prefix core's
reference counts, hash index, eviction lists or heap and free stack; the cache's policy slots
and entry slots; the event ring) gets seeded cases from corruption_cases.py. A child process
runs them, each case in a process of its own (forked), so a crash fails that case by name,
not the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Cases per structure: hundreds in all, a few seconds each on two cores.
CASES = {"paged": 400, "prefix": 400, "cache": 300, "ring": 300, "links": 200}


def run_cases(structure: str, count: int) -> list[str]:
    """Every case's line (OK / FAIL / CRASH), in order."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    each = ["--each"] if structure == "links" else []  # the chain-link cases: a process each
    proc = subprocess.run([sys.executable, str(HERE / "corruption_cases.py"), structure, "0", str(count), *each],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK", "FAIL", "CRASH"))]
    assert [int(line.split()[1]) for line in lines] == list(range(count)), proc.stdout[-2000:]
    return lines


@pytest.mark.parametrize("structure", sorted(CASES))
def test_corrupting_a_compiled_structure_is_named_by_check_never_a_crash(structure):
    lines = run_cases(structure, CASES[structure])
    bad = [line for line in lines if not line.startswith("OK")]
    assert not bad, bad[:10]
    # The cases are not all harmless: most writes must have been reported.
    reported = sum(int(line.split()[2]) > 0 for line in lines)
    assert reported > len(lines) // 3, f"{reported} of {len(lines)} writes reported"
