"""Sequences of a prefix-caching pool: open, inspect, append, close; prefix-cache reset and views."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from .. import operations
from ..deps import PrefixPoolDep
from ..schemas import (
    BlockInfoOut,
    EvictionOrderOut,
    PrefixResetOut,
    SequenceAppend,
    SequenceList,
    SequenceOpen,
    SequenceOut,
)

router = APIRouter(prefix="/api/pools/{pool}", tags=["sequences"])

SequenceId = Annotated[int, Path(ge=0, le=1 << 62, description="sequence id")]
BlockId = Annotated[int, Path(ge=0, le=1 << 32, description="block index")]


@router.post("/sequences", status_code=status.HTTP_201_CREATED, response_model=SequenceOut,
             description="Open a sequence: `tokens`, or `block_hashes` (one per full block) with "
                         "`num_tokens`, or `num_tokens` alone (nothing cached). The longest cached "
                         "prefix is reused; 507 when every block is held.")
async def open_sequence(body: SequenceOpen, pool: PrefixPoolDep) -> dict:
    return operations.sequence_result(operations.open_sequence(
        pool, body.tokens, body.block_hashes, body.num_tokens, body.salt, body.next_use))


@router.get("/sequences", response_model=SequenceList)
async def list_sequences(pool: PrefixPoolDep) -> dict:
    return {"ids": pool.sequence_ids()}


@router.get("/sequences/{id}", response_model=SequenceOut)
async def get_sequence(id: SequenceId, pool: PrefixPoolDep) -> dict:
    return pool.sequence(id).to_dict()


@router.post("/sequences/{id}/append", response_model=SequenceOut,
             description="Grow a sequence: `tokens` (opened with tokens) or `num_tokens` with "
                         "`block_hashes` for the blocks it fills (opened with hashes).")
async def append(id: SequenceId, body: SequenceAppend, pool: PrefixPoolDep) -> dict:
    return operations.sequence_result(operations.append(pool, id, body.tokens, body.num_tokens, body.block_hashes))


@router.delete("/sequences/{id}", status_code=status.HTTP_204_NO_CONTENT)
async def close_sequence(id: SequenceId, pool: PrefixPoolDep) -> Response:
    operations.close_sequence(pool, id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/prefix-cache/reset", response_model=PrefixResetOut,
             description="Drop every cached hash: idle cached blocks go free; held blocks stay "
                         "with their sequences, no longer shared with new ones.")
async def reset_prefix_cache(pool: PrefixPoolDep) -> dict:
    return {"cleared": pool.reset_prefix_cache()}


@router.get("/prefix-cache/order", response_model=EvictionOrderOut)
async def eviction_order(pool: PrefixPoolDep,
                         limit: Annotated[int, Query(ge=1, le=100_000)] = 5_000) -> dict:
    return {"blocks": pool.eviction_order(limit), "total": pool.core.n_evictable}


@router.get("/prefix-cache/blocks/{block}", response_model=BlockInfoOut)
async def block_info(block: BlockId, pool: PrefixPoolDep) -> dict:
    return pool.block_info(block)
