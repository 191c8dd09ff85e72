"""WorkloadSpec: a live-workload request parsed once into typed, validated values.

The server's request model (app/schemas/workload.py `WorkloadIn`) takes its bounds from here, and
`build_live_workload` accepts the plain dict it always took by parsing it here, so the keys,
the speed limit and the defaults are checked in one place.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from allocator import InvalidRequest
from allocator.vocab import SCENARIOS, WORKLOAD_KINDS

MAX_SPEED = 1000.0
MAX_SEED = (1 << 32) - 1
DEFAULT_TRACE_LIMIT = 500
MAX_TRACE_LIMIT = 100_000
SPEC_KEYS = frozenset({"kind", "name", "seed", "speed", "limit"})


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A validated workload request. Invariants: `kind` is in the vocabulary; a scenario has a
    `name` from the vocabulary and a `seed` in [0, MAX_SEED]; a trace has `name` "trace" and a
    `limit` in [1, MAX_TRACE_LIMIT]; 0 < `speed` <= MAX_SPEED."""

    kind: str
    name: str
    speed: float = 1.0
    seed: int = 0
    limit: int | None = None

    @classmethod
    def parse(cls, spec: dict) -> WorkloadSpec:
        """From a request's fields (`kind`, `name`, `seed`, `speed`, `limit`). Raises InvalidRequest."""
        if not isinstance(spec, dict):
            raise InvalidRequest("a workload spec must be an object")
        extra = set(spec) - SPEC_KEYS
        if extra:
            raise InvalidRequest(f"unknown workload field(s): {sorted(map(str, extra))}")
        speed = _number(spec, "speed", 1.0, float)
        if not math.isfinite(speed) or speed <= 0 or speed > MAX_SPEED:
            raise InvalidRequest(f"'speed' must be > 0 and <= {MAX_SPEED:g}, got {speed!r}")
        kind = spec.get("kind")
        if kind == "scenario":
            name = spec.get("name")
            if name not in SCENARIOS:
                raise InvalidRequest(f"unknown scenario {name!r}; choose one of {list(SCENARIOS)}")
            seed = _number(spec, "seed", 0, int)
            if not 0 <= seed <= MAX_SEED:
                raise InvalidRequest(f"'seed' must be in [0, {MAX_SEED}], got {seed}")
            return cls("scenario", name, speed, seed=seed)
        if kind in ("trace", "mooncake"):
            if spec.get("name") not in (None, kind):
                raise InvalidRequest(f"a {kind} workload takes no 'name'")
            limit = _number(spec, "limit", DEFAULT_TRACE_LIMIT, int)
            if not 0 < limit <= MAX_TRACE_LIMIT:
                raise InvalidRequest(f"'limit' must be a positive integer of at most {MAX_TRACE_LIMIT}, got {limit}")
            return cls(kind, kind, speed, limit=limit)
        raise InvalidRequest(f"unknown workload kind {kind!r}; choose one of {list(WORKLOAD_KINDS)}")

    def to_dict(self) -> dict:
        return asdict(self)


def _number(spec: dict, key: str, default, kind: type):
    value = spec.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise InvalidRequest(f"'{key}' must be {'a number' if kind is float else 'an integer'}, got {value!r}")
    return kind(value)


__all__ = ["DEFAULT_TRACE_LIMIT", "MAX_SEED", "MAX_SPEED", "MAX_TRACE_LIMIT", "WorkloadSpec"]
