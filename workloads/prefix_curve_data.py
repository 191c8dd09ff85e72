"""The bundled trace's capacity curve as data, shipped with the package for the dashboard.

`bench/bench_mooncake.py` (and `kvscope prefix` on the bundled trace) compute the hit ratio vs
capacity curve of the Mooncake trace on the allocator's prefix cache and write
`docs/report/prefix_report.json`; the part a client needs to draw the curve (capacities, one hit
ratio per policy and capacity, the infinite-capacity maximum, the definition and the trace's
attribution) is also written here, to `workloads/reports/mooncake_prefix_curve.json`, so the
server answers `GET /api/prefix/curve` from a file instead of a minute of replay.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

BUNDLED_CURVE = Path(__file__).resolve().parent / "reports" / "mooncake_prefix_curve.json"

# What the compact file keeps of a full prefix report (workloads/prefix_report.py).
_KEPT = ("tokens_per_block", "definition", "capacities_tokens", "policies", "max_hit_ratio", "attribution")
_POINT = ("capacity_tokens", "policy", "hit_ratio")


class CurveDataError(ValueError):
    """The shipped curve file is missing or does not have the shape `curve_payload` writes."""


def curve_payload(report: dict) -> dict:
    """The drawable part of a prefix report: the trace's name and size, capacities, policies,
    `max_hit_ratio` and `curve` points of (capacity_tokens, policy, hit_ratio) only."""
    trace = report.get("trace", {})
    out = {"trace": {k: trace[k] for k in ("source", "requests", "input_tokens_total") if k in trace}}
    out.update({k: report[k] for k in _KEPT if k in report})
    out["curve"] = [{k: p[k] for k in _POINT} for p in report["curve"]]
    validate(out)
    return out


def validate(data: dict) -> dict:
    """Raise CurveDataError unless every policy has one point per capacity, ratios lie in
    [0, max_hit_ratio] (within rounding) and capacities ascend."""
    try:
        caps, policies, top = data["capacities_tokens"], data["policies"], float(data["max_hit_ratio"])
        points = {(p["policy"], p["capacity_tokens"]): float(p["hit_ratio"]) for p in data["curve"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise CurveDataError(f"curve data lacks a field or has a bad value: {exc!r}") from exc
    if not caps or caps != sorted(set(caps)) or caps[0] <= 0:
        raise CurveDataError(f"capacities_tokens must ascend and be positive, got {caps}")
    if not 0.0 <= top <= 1.0:
        raise CurveDataError(f"max_hit_ratio must lie in [0, 1], got {top}")
    missing = [(p, c) for p in policies for c in caps if (p, c) not in points]
    if missing or len(points) != len(policies) * len(caps):
        raise CurveDataError(f"curve must hold one point per policy and capacity; missing {missing[:3]}")
    bad = [k for k, r in points.items() if not -1e-9 <= r <= top + 1e-9]
    if bad:
        raise CurveDataError(f"hit ratios must lie in [0, max_hit_ratio]; out of range at {bad[:3]}")
    return data


def write_bundled_curve(report: dict, path: str | Path = BUNDLED_CURVE) -> Path:
    """Write the drawable part of `report` where the server reads it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve_payload(report), indent=2) + "\n")
    load_bundled_curve.cache_clear()
    return path


@lru_cache(maxsize=1)
def load_bundled_curve() -> dict:
    """The shipped curve, read and validated once per process."""
    try:
        data = json.loads(BUNDLED_CURVE.read_text())
    except (OSError, ValueError) as exc:
        raise CurveDataError(f"cannot read {BUNDLED_CURVE.name}: {exc}; regenerate it with "
                             "`python -m bench.bench_mooncake`") from exc
    return validate(data)
