"""Cache entries: put one, and an entry as the API shows it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import Bytes, Priority, Strict, Tokens, TtlSeconds, exactly_one


class EntryPut(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"bytes": 65536}, {"tokens": 512, "priority": 1, "ttl_s": 60, "pinned": False}]})

    bytes: Bytes | None = None
    tokens: Tokens | None = None
    priority: Priority | None = Field(
        None, description="eviction priority (lower goes first); omitted: keep the entry's, 0 when new")
    ttl_s: TtlSeconds | None = Field(None, description="seconds to live; omitted: keep the entry's, none when new")
    pinned: bool | None = Field(None, description="never evicted while true; omitted: keep, false when new")

    @model_validator(mode="after")
    def _one(self) -> EntryPut:
        exactly_one(self, "bytes", "tokens")
        return self


class EntryOut(BaseModel):
    key: str
    id: int
    bytes: int
    allocated_bytes: int
    priority: int
    pinned: bool
    ttl_s: float | None
    expires_in_s: float | None
    age_s: float
    idle_s: float
    hits: int
    data_bytes: int = Field(description="bytes written into the entry's blocks with PUT .../data")
    blocks: list[list[int]] | None = None


class PutOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"entry": {"key": "session-1", "id": 3, "bytes": 65536, "allocated_bytes": 65536,
                   "priority": 0, "pinned": False, "ttl_s": None, "expires_in_s": None,
                   "age_s": 0.0, "idle_s": 0.0, "hits": 0, "data_bytes": 0, "blocks": [[0, 16]]},
         "evicted": ["session-0"], "created": True}]})

    entry: EntryOut
    evicted: list[str]
    created: bool = Field(description="a new entry (REST: 201), else an existing one refreshed (200)")


class EntryList(BaseModel):
    entries: list[EntryOut]
    total: int
