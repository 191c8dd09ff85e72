"""Recordings: start recording a pool to a file, open a file as a read-only pool."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..recordings import NAME_PATTERN
from .common import POOL_NAME_PATTERN


class RecordingStart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=NAME_PATTERN,
                             description="file name without .kvrec (default: <pool>-<date>-<time>)")


class RecordingOpen(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: str | None = Field(None, pattern=POOL_NAME_PATTERN,
                             description="pool name to serve it as (default rec-<name>)")
