"""Live workloads: start a scenario or a trace replay on a pool, watch it, stop it."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from allocator.errors import NotFound

from ..deps import HubDep, PoolDep
from ..schemas import WorkloadIn, WorkloadOut

router = APIRouter(prefix="/api/pools/{pool}/workload", tags=["workload"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=WorkloadOut,
             description="Start a workload; 409 while one is running. Progress streams on the websocket.")
async def start(body: WorkloadIn, handle: PoolDep, hub: HubDep) -> dict:
    return {"workload": await handle.start_workload(hub, body.model_dump(exclude_none=True))}


@router.get("", response_model=WorkloadOut)
async def progress(handle: PoolDep) -> dict:
    current = handle.workload_progress()
    if current is None:
        raise NotFound("workload", handle.name)
    return {"workload": current}


@router.delete("", status_code=status.HTTP_204_NO_CONTENT,
               description="Stop the pool's workload: 204 once none runs, whether it was running "
                           "or had already ended (a stop that races the end is not an error); "
                           "404 when the pool never ran one.")
async def stop(handle: PoolDep) -> Response:
    if not await handle.stop_workload() and handle.workload_progress() is None:
        raise NotFound("workload", handle.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
