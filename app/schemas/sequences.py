"""Sequences of a prefix-caching pool: token ids, block hashes, open / append, and what the
prefix cache shows (eviction order, one block)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from .common import Strict, Tokens

MAX_SEQUENCE_TOKENS = 1 << 20
TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=1 << 63)]],
                     Field(max_length=MAX_SEQUENCE_TOKENS, description="token ids")]
BlockHashes = Annotated[list[Annotated[int, Field(ge=0, lt=1 << 64)]],
                        Field(max_length=MAX_SEQUENCE_TOKENS, description="one hash per full block, "
                              "64-bit unsigned")]
Salt = Annotated[str, Field(max_length=256, description="separates caches (e.g. per tenant)")]
NextUse = Annotated[list[Annotated[float, Field(ge=0)]], Field(
    max_length=MAX_SEQUENCE_TOKENS, description="belady: when each block is next needed "
    "(larger = later; a huge number for never)")]


class SequenceOpen(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9]},
        {"block_hashes": [17, 42], "num_tokens": 40},
        {"tokens": [1, 2, 3], "salt": "tenant-a"}]})

    tokens: TokenIds | None = None
    block_hashes: BlockHashes | None = None
    num_tokens: Tokens | None = None
    salt: Salt | None = None
    next_use: NextUse | None = None


class SequenceAppend(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"tokens": [10, 11]}, {"num_tokens": 16, "block_hashes": [99]}]})

    tokens: TokenIds | None = None
    num_tokens: Tokens | None = None
    block_hashes: BlockHashes | None = None


class SequenceOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"id": 3, "num_tokens": 9, "cached_tokens": 8, "blocks": [0, 1, 5]}]})

    id: int
    num_tokens: int
    cached_tokens: int = Field(description="tokens served from the prefix cache at open")
    blocks: list[int] = Field(description="block ids in data order")


class SequenceList(BaseModel):
    ids: list[int]


class PrefixResetOut(BaseModel):
    cleared: int = Field(description="cached hashes dropped")


class EvictionOrderOut(BaseModel):
    blocks: list[int] = Field(description="idle cached blocks, next victim first")
    total: int


class BlockInfoOut(BaseModel):
    block: int
    state: str
    refcount: int
    hash: str | None = Field(description="16 hex digits, none when the block is not cached")
    depth: int | None = Field(description="position in its prefix chain (0 = first block)")
    hits: int
    owner: int
