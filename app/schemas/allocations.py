"""Raw allocations: a size in bytes or tokens, and an allocation as the API shows it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import Bytes, Strict, Tokens, exactly_one


class SizeIn(Strict):
    """A size in bytes or in tokens (token-sized pools only)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"bytes": 65536}, {"tokens": 128}]})

    bytes: Bytes | None = None
    tokens: Tokens | None = None

    @model_validator(mode="after")
    def _one(self) -> SizeIn:
        exactly_one(self, "bytes", "tokens")
        return self


class AllocationOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"id": 7, "requested_bytes": 10000, "allocated_bytes": 12288, "blocks": [[0, 3]],
         "state": "used", "tier": None}]})

    id: int
    requested_bytes: int
    allocated_bytes: int
    blocks: list[list[int]]
    state: str
    tier: str | None = None
    moved: bool | None = Field(None, description="extend only: whether the data had to move")
    key: str | None = None
    age_s: float | None = None
    idle_s: float | None = None
