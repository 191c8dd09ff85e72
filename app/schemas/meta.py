"""The vocabulary, as GET /api/meta answers it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class MetaOut(BaseModel):
    """The vocabulary (allocator/vocab.py `meta()`): every name a client may send or will see."""

    model_config = ConfigDict(extra="allow")

    strategies: dict[str, dict]
    fits: list[str]
    policies: dict[str, dict]
    block_states: dict[str, dict]
    events: dict[str, dict]
    event_groups: dict[str, dict]
    scenarios: dict[str, dict]
    workload_kinds: list[str]
    defaults: dict
