"""The prefix capacity curve of the bundled Mooncake trace."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CurvePoint(BaseModel):
    """One point of the capacity curve: the hit ratio one policy reaches at one capacity."""

    capacity_tokens: int
    policy: str = Field(description="an eviction policy of the prefix cache, or `belady` (MIN)")
    hit_ratio: float = Field(ge=0, le=1)


class PrefixCurveOut(BaseModel):
    """The bundled Mooncake trace's hit ratio vs cache capacity, per policy (workloads/prefix_curve_data.py)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "trace": {"source": "mooncake_conversation.jsonl", "requests": 12031, "input_tokens_total": 144793823},
        "tokens_per_block": 512, "capacities_tokens": [100000, 3000000], "policies": ["lru"],
        "max_hit_ratio": 0.374, "definition": "arrival order, no concurrency; ...",
        "curve": [{"capacity_tokens": 100000, "policy": "lru", "hit_ratio": 0.043},
                  {"capacity_tokens": 3000000, "policy": "lru", "hit_ratio": 0.139}]}]})

    trace: dict
    tokens_per_block: int
    definition: str
    capacities_tokens: list[int]
    policies: list[str]
    max_hit_ratio: float = Field(ge=0, le=1, description="hit ratio with infinite capacity")
    attribution: str = ""
    curve: list[CurvePoint]
