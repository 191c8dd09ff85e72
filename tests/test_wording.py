"""Code, tests and docs describe the product, not how it was built: no task numbers, no "not in
this tree" (a feature is either here, and tested, or not mentioned), and no test that skips
itself when an import fails."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHERE = ("allocator", "app", "workloads", "kvevents", "static/js", "templates", "docs", "tests", "bench")
SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".js", ".mjs", ".html", ".css", ".md"}
# Spelled in pieces so that this file does not match itself.
HISTORY = re.compile(r"\b[Ii]ssues? #?[0-9]+|\bnot in this " + "tree")


def test_no_development_history_words():
    files = [ROOT / "README.md", ROOT / "Makefile"]
    for top in WHERE:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in files for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if HISTORY.search(line)]
    assert len(files) > 100 and not found, found


def test_tests_never_skip_on_an_import():
    """Every module a test needs is the project's own or a declared dependency: a failed import
    is a failure, never a skip (the only skips are hardware and a missing browser or wheel)."""
    found = [f"{p.relative_to(ROOT)}:{n}"
             for p in (ROOT / "tests").rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if "importorskip" + "(" in line]
    assert not found, found
