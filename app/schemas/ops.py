"""The batch endpoint: one op model per operation (app/operations.py `BATCH_OPS`), `BatchIn`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import Bytes, Key, Priority, Strict, Tokens, TtlSeconds
from .sequences import BlockHashes, NextUse, Salt, TokenIds


class OpAllocate(Strict):
    op: Literal["allocate"]
    bytes: Bytes | None = None
    tokens: Tokens | None = None


class OpExtend(Strict):
    op: Literal["extend"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]
    bytes: Bytes | None = None
    tokens: Tokens | None = None


class OpFree(Strict):
    op: Literal["free"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]


class OpPut(Strict):
    op: Literal["put"]
    key: Key
    bytes: Bytes | None = None
    tokens: Tokens | None = None
    priority: Priority | None = None  # omitted: keep the entry's (0 when new), as for PUT
    ttl_s: TtlSeconds | None = None
    pinned: bool | None = None


class OpGet(Strict):
    op: Literal["get"]
    key: Key


class OpDelete(Strict):
    op: Literal["delete"]
    key: Key


class OpEvict(Strict):
    op: Literal["evict"]
    key: Key


class OpDefragment(Strict):
    op: Literal["defragment"]


class OpOpen(Strict):
    op: Literal["open"]
    tokens: TokenIds | None = None
    block_hashes: BlockHashes | None = None
    num_tokens: Tokens | None = None
    salt: Salt | None = None
    next_use: NextUse | None = None


class OpAppend(Strict):
    op: Literal["append"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]
    tokens: TokenIds | None = None
    num_tokens: Tokens | None = None
    block_hashes: BlockHashes | None = None


class OpClose(Strict):
    op: Literal["close"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]


Op = Annotated[OpAllocate | OpExtend | OpFree | OpPut | OpGet | OpDelete | OpEvict | OpDefragment
               | OpOpen | OpAppend | OpClose,
               Field(discriminator="op")]


class BatchIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"ops": [{"op": "allocate", "bytes": 65536}, {"op": "free", "id": 1},
                 {"op": "put", "key": "a", "bytes": 4096}, {"op": "get", "key": "a"}],
         "stop_on_error": False}]})

    ops: list[Op]
    stop_on_error: bool = False


class BatchOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"results": [{"ok": True, "id": 1, "requested_bytes": 65536, "allocated_bytes": 65536,
                      "blocks": [[0, 16]], "state": "used", "tier": None},
                     {"ok": False, "error": {"code": "not_found", "message": "allocation 9 not found",
                                             "details": {"kind": "allocation", "id": 9}}}]}]})

    results: list[dict]
