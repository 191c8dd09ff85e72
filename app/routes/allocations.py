"""Raw allocations: allocate, inspect, extend, free."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from .. import operations
from ..deps import PoolDep
from ..schemas import AllocationOut, SizeIn

router = APIRouter(prefix="/api/pools/{pool}/allocations", tags=["allocations"])

AllocationId = Annotated[int, Path(ge=0, le=1 << 62, description="allocation id")]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=AllocationOut,
             response_model_exclude_unset=True)
async def allocate(body: SizeIn, handle: PoolDep) -> dict:
    return operations.allocation_result(handle.pool, operations.allocate(handle.pool, body.bytes, body.tokens))


@router.get("/{id}", response_model=AllocationOut)
async def get_allocation(id: AllocationId, handle: PoolDep) -> dict:
    return operations.allocation_view(handle.pool, id)


@router.post("/{id}/extend", response_model=AllocationOut, response_model_exclude_unset=True)
async def extend(id: AllocationId, body: SizeIn, handle: PoolDep) -> dict:
    return operations.extend_result(handle.pool, id, operations.extend(handle.pool, id, body.bytes, body.tokens))


@router.delete("/{id}", status_code=status.HTTP_204_NO_CONTENT)
async def free(id: AllocationId, handle: PoolDep) -> Response:
    operations.free(handle.pool, id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
