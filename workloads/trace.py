"""Trace loading: the Azure LLM inference trace (`TIMESTAMP,ContextTokens,GeneratedTokens`).

A trace is three aligned numpy arrays: arrival time in seconds from the first request, context
(prompt) tokens and generated tokens. Parsing is strict: a malformed line raises
`allocator.InvalidRequest` naming the file, the line number and what is wrong, because a
silently skipped row would skew every figure derived from the trace.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocator import InvalidRequest, positive_int

TRACES_DIR = Path(__file__).resolve().parent / "traces"
DEFAULT_TRACE = TRACES_DIR / "azure_conv_2023.csv"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
ATTRIBUTION = (
    "Trace: Azure LLM inference trace 2023 (conversation), Azure Public Dataset, CC-BY 4.0; "
    'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.'
)


@dataclass(frozen=True, slots=True)
class Trace:
    """Requests in arrival order. `arrival_s[0] == 0`; arrays are int64/float64 of equal length."""

    arrival_s: np.ndarray
    context: np.ndarray
    generated: np.ndarray
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, n: int) -> Trace:
        return Trace(self.arrival_s[:n], self.context[:n], self.generated[:n], self.source)

    def summary(self) -> dict:
        n = len(self)
        return {
            "source": self.source,
            "requests": n,
            "duration_s": float(self.arrival_s[-1]) if n else 0.0,
            "context_tokens_mean": float(self.context.mean()) if n else 0.0,
            "context_tokens_max": int(self.context.max()) if n else 0,
            "generated_tokens_mean": float(self.generated.mean()) if n else 0.0,
            "generated_tokens_max": int(self.generated.max()) if n else 0,
        }


_day_cache: dict[str, int] = {}


def parse_timestamp(text: str) -> float:
    """Seconds since an epoch: 'YYYY-MM-DD HH:MM:SS[.fraction]' (any number of fraction digits,
    the trace has seven, more than `datetime` accepts) or a plain number of seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"timestamp {text!r} is not a finite number of seconds")
        return seconds
    date, sep, clock = text.replace("T", " ").partition(" ")
    if not sep:
        raise ValueError(f"timestamp {text!r} is neither 'YYYY-MM-DD HH:MM:SS' nor seconds")
    day = _day_cache.get(date)
    if day is None:
        day = _day_cache[date] = dt.date.fromisoformat(date).toordinal()
    parts = clock.split(":")
    if len(parts) != 3:
        raise ValueError(f"timestamp {text!r} has no HH:MM:SS time")
    h, m, s = int(parts[0]), int(parts[1]), float(parts[2])
    if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 61):
        raise ValueError(f"timestamp {text!r} has an out-of-range time")
    return day * 86400.0 + h * 3600 + m * 60 + s


def _count(value: str, column: str, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{column} {value.strip()!r} is not an integer") from None
    if n < minimum:
        raise ValueError(f"{column} {n} is below {minimum}")
    return n


def parse_trace(lines, source: str = "<trace>", limit: int | None = None) -> Trace:
    """Parse CSV text lines (header required, columns in any order). Raises InvalidRequest."""
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise InvalidRequest(f"{source}: empty file, expected the header {','.join(COLUMNS)}") from None
    names = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise InvalidRequest(
            f"{source}: line 1: header lacks column(s) {', '.join(missing)} "
            f"(expected {','.join(COLUMNS)}, got {','.join(names)})"
        )
    ti, ci, gi = (names.index(c) for c in COLUMNS)
    width = len(names)
    stamps: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    for row in reader:
        if limit is not None and len(stamps) >= limit:
            break
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != width:
            raise InvalidRequest(f"{source}: line {line}: expected {width} columns, found {len(row)}")
        try:
            stamps.append(parse_timestamp(row[ti]))
            ctx.append(_count(row[ci], "ContextTokens", 1))
            gen.append(_count(row[gi], "GeneratedTokens", 1))
        except ValueError as exc:
            raise InvalidRequest(f"{source}: line {line}: {exc}") from None
    if not stamps:
        raise InvalidRequest(f"{source}: no requests after the header")
    t = np.asarray(stamps, dtype=np.float64)
    order = np.argsort(t, kind="stable")  # the trace is sorted; a hand-made one may not be
    t = t[order] - t[order[0]]
    return Trace(t, np.asarray(ctx, np.int64)[order], np.asarray(gen, np.int64)[order], source)


def load_trace(path: str | Path | None = None, limit: int | None = None) -> Trace:
    """Load a trace file (default: the bundled Azure conversation trace). Raises InvalidRequest."""
    path = Path(path) if path is not None else DEFAULT_TRACE
    if limit is not None:
        positive_int(limit, "limit")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return parse_trace(f, source=path.name, limit=limit)
    except OSError as exc:
        raise InvalidRequest(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path.name}: not a UTF-8 text file") from None
