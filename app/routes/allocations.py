"""Raw allocations: allocate, inspect, extend, free."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from ..deps import PoolDep, refuse_cache_entry
from ..schemas import AllocationOut, SizeIn

router = APIRouter(prefix="/api/pools/{pool}/allocations", tags=["allocations"])

AllocationId = Annotated[int, Path(ge=0, le=1 << 62, description="allocation id")]


def allocation_view(handle, aid: int) -> dict:
    """The allocation, plus its cache `key`, `age_s` and `idle_s` when it is a cache entry."""
    pool = handle.pool
    out = pool.allocation(aid).to_dict()
    cache = pool.cache
    key = cache.key_of(aid) if cache is not None else None
    if key is not None:
        entry = cache.peek(key)
        now = cache.clock()
        out.update(key=key, age_s=now - entry.created_at, idle_s=now - entry.last_access)
    return out


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AllocationOut)
async def allocate(body: SizeIn, handle: PoolDep) -> dict:
    pool = handle.pool
    aid = pool.allocate(pool.to_bytes(body.bytes, body.tokens))
    return pool.allocation(aid).to_dict()


@router.get("/{id}", response_model=AllocationOut)
async def get_allocation(id: AllocationId, handle: PoolDep) -> dict:
    return allocation_view(handle, id)


@router.post("/{id}/extend", response_model=AllocationOut)
async def extend(id: AllocationId, body: SizeIn, handle: PoolDep) -> dict:
    pool = handle.pool
    nbytes = pool.to_bytes(body.bytes, body.tokens)
    refuse_cache_entry(pool, id)
    pool.extend(id, nbytes)
    return pool.allocation(id).to_dict()


@router.delete("/{id}", status_code=status.HTTP_204_NO_CONTENT)
async def free(id: AllocationId, handle: PoolDep) -> Response:
    refuse_cache_entry(handle.pool, id)
    handle.pool.free(id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
