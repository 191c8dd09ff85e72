"""Run every `bench/bench_*.py` module's `run()` in turn:
`python -m bench [--quick] [name ...] [--json FILE]` (`--json` goes to the benches whose `run`
takes `json_path`).

`--quick` runs each at a smoke-test size (bench/quick.py): every path once, no figure judged, no
report written; `tests/bench/test_bench_quick.py` runs it so that no bench rots unseen."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import traceback
from pathlib import Path


def modules() -> list[str]:
    return sorted(p.stem for p in Path(__file__).resolve().parent.glob("bench_*.py"))


# Benches that also run when another is selected: the prefix-cache rows belong to the allocator's.
ALSO = {"allocator": ("prefix",)}


def main(argv: list[str]) -> int:
    if "--quick" in argv:
        os.environ["KVSCOPE_BENCH_QUICK"] = "1"  # before any bench module reads its sizes
        argv = [a for a in argv if a != "--quick"]
    json_path = None
    if "--json" in argv[:-1]:
        i = argv.index("--json")
        json_path, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    wanted = set(argv)
    if os.environ.get("KVSCOPE_BENCH_QUICK", "") not in ("", "0"):
        print("-- quick run: every bench at a smoke-test size; its figures measure nothing and no "
              "aim printed below is judged", flush=True)
    for name in list(wanted):
        wanted.update(ALSO.get(name.removeprefix("bench_"), ()))
    failed = 0
    for name in modules():
        if wanted and name not in wanted and name.removeprefix("bench_") not in wanted:
            print(f"-- {name}: not selected")
            continue
        print(f"-- {name}: running", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
            run = getattr(module, "run", None)
            if run is None:
                print(f"-- {name}: FAILED, no run() function")
                failed += 1
                continue
            if json_path and "json_path" in inspect.signature(run).parameters:
                run(json_path)
            else:
                run()
        except Exception:
            traceback.print_exc()
            print(f"-- {name}: FAILED after {time.perf_counter() - t0:.1f} s")
            failed += 1
            continue
        print(f"-- {name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
