"""What the workloads' command lines share: a progress bar and the output directory check."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from allocator import InvalidRequest


class ProgressBar:
    """A one-line stderr progress bar (tqdm is not a dependency). Redraws at most 10 times/s."""

    def __init__(self, label: str, stream=None, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._last = 0.0
        self._t0 = time.perf_counter()
        self._closed = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self._closed or (done < total and now - self._last < 0.1):
            return
        self._closed = done >= total
        self._last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label:<18} [{bar}] {frac:4.0%} {done}/{total} "
                          f"{now - self._t0:5.1f}s{end}")
        self.stream.flush()


def out_dir(path: str) -> Path:
    """Check the output directory up front (without creating it), so a bad --out fails before
    a long run: it, or the nearest part of it that exists, must be a writable directory."""
    out = Path(path)
    probe = out
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        why = "is not a directory" if probe.exists() and not probe.is_dir() else "is not writable"
        raise InvalidRequest(f"cannot write to output directory {str(out)!r}: {str(probe)!r} {why}")
    return out
