"""The one size knob every bench reads: full size, or quick (`python -m bench --quick`, or
KVSCOPE_BENCH_QUICK=1), a smoke test that runs each bench's every path once at a small size, so
that a bench cannot stop running unseen. Quick figures mean nothing and are never judged; a
quick run writes no report into the tree."""

from __future__ import annotations

import os

QUICK = os.environ.get("KVSCOPE_BENCH_QUICK", "") not in ("", "0")


def sized(full, quick):
    """`quick` in a quick run, else `full`."""
    return quick if QUICK else full
