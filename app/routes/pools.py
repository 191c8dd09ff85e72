"""Pools: create, list, inspect, reset, defragment, stats, block map, events, check, policy."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse

from allocator import STATE_NAMES
from allocator.errors import InvalidRequest
from allocator.prefix.mirror import forest_of

from .. import mirrors, operations
from ..deps import CacheDep, HubDep, PoolDep, RegistryDep, run_locked, services_of
from ..http.errors import ApiError
from ..schemas import (
    BlockMapOut,
    CheckOut,
    DefragOut,
    EventList,
    PolicyIn,
    PolicyOut,
    PoolCreate,
    PoolList,
    PoolOut,
    ResetOut,
    StatsOut,
)
from ..stream import blockmap_runs_array, json_runs_chunks, snapshot_frame
from .history import AtSeq, blockmap_at, stats_at

router = APIRouter(prefix="/api/pools", tags=["pools"])


@router.get("", response_model=PoolList)
async def list_pools(registry: RegistryDep) -> dict:
    return {"pools": [h.summary() for h in registry]}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=PoolOut)
async def create_pool(body: PoolCreate, registry: RegistryDep, hub: HubDep) -> dict:
    spec = await mirrors.resolve(body.model_dump(exclude_none=True, mode="python"))
    handle = registry.create(spec)
    try:
        mirrors.attach(handle, spec)
    except Exception:
        registry.remove(handle.name)
        raise
    hub.attach(handle)
    return handle.describe()


@router.get("/{pool}", response_model=PoolOut)
async def get_pool(handle: PoolDep) -> dict:
    return handle.describe()


@router.delete("/{pool}", status_code=status.HTTP_204_NO_CONTENT, description=(
    "Remove the pool; 409 while it is a replica of a running live routing run (stop the run "
    "first)."))
async def delete_pool(request: Request, handle: PoolDep, registry: RegistryDep, hub: HubDep) -> Response:
    services_of(request).routing_runs.check_pool_deletable(handle)
    await registry.delete(handle.name, hub)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{pool}/reset", response_model=ResetOut)
async def reset_pool(handle: PoolDep) -> dict:
    return {"freed": await run_locked(handle.reset)}


@router.post("/{pool}/defragment", response_model=DefragOut)
async def defragment(handle: PoolDep) -> dict:
    return await run_locked(lambda: operations.defragment(handle.pool))


@router.get("/{pool}/stats", response_model=StatsOut, response_model_exclude_unset=True)
async def pool_stats(handle: PoolDep, at_seq: AtSeq = None) -> dict:
    """The pool's numbers now, or right after event `at_seq` (see /history; the cache's own
    figures are not kept for past points)."""
    if at_seq is not None:
        return await stats_at(handle, at_seq)
    return handle.pool.stats()


@router.get("/{pool}/check", response_model=CheckOut)
async def check_pool(handle: PoolDep) -> dict:
    problems = await run_locked(handle.check)
    return {"ok": not problems, "problems": problems}


def check_all(pool) -> list[str]:
    """The pool's and its cache's invariant problems (O(pool): run off the loop)."""
    problems = pool.check()
    if pool.cache is not None:
        problems += pool.cache.check()
    return problems


@router.get("/{pool}/events", response_model=EventList, description=(
    "Events with seq > `after`, oldest first. An `after` beyond `last_seq` is 409: that seq came "
    "from an earlier server process (see `instance_id`) or an earlier pool of this name; the "
    "history is volatile, so start again from `after=0`."))
async def pool_events(
    request: Request,
    handle: PoolDep,
    after: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict:
    events = handle.pool.events
    instance = services_of(request).instance.describe()
    if after > events.last_seq:
        raise ApiError(409, "history_reset",
                       f"after={after} is beyond the last event seq {events.last_seq} of pool {handle.name!r}: "
                       "the server restarted or the pool was recreated since; start again from after=0",
                       {"after": after, "last_seq": events.last_seq, **instance})
    return {"events": events.after(after, limit), "last_seq": events.last_seq, **instance}


@router.get(
    "/{pool}/blockmap",
    response_model=BlockMapOut,
    responses={200: {"content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"},
        "description": "a snapshot frame (docs/STREAM.md)"}}}},
    description="JSON runs, or a binary snapshot frame with `format=binary` (or, without `format`, "
                "`Accept: application/octet-stream`). `format` is `json` or `binary`; anything else is 422. "
                "With `at_seq`, the runs as they were right after that event (JSON only; 404 outside "
                "the kept history, see /history).",
)
async def blockmap(
    handle: PoolDep,
    format: Annotated[Literal["json", "binary"] | None, Query(description="json or binary")] = None,
    accept: Annotated[str | None, Header()] = None,
    at_seq: AtSeq = None,
) -> Response:
    bm = handle.pool.blockmap
    if format is None:
        format = "binary" if accept and "application/octet-stream" in accept and at_seq is None else "json"
    if at_seq is not None:
        if format != "json":
            raise InvalidRequest("at_seq answers in JSON only; use format=json")
        return JSONResponse(await blockmap_at(handle, at_seq))
    if format == "binary":
        return Response(await run_locked(lambda: snapshot_frame(bm, 0)), media_type="application/octet-stream")
    runs = await run_locked(lambda: blockmap_runs_array(bm))
    head = {"num_blocks": bm.num_blocks, "states": {str(k): v for k, v in STATE_NAMES.items()}}
    # Streamed in chunks by a worker thread (Starlette iterates a plain generator there).
    return StreamingResponse(json_runs_chunks(head, runs), media_type="application/json")


@router.get("/{pool}/forest", description="A mirror pool's prefix forest: roots, orphans, "
            "depth and the most shared prefixes (computed off the event loop).")
async def forest(handle: PoolDep) -> dict:
    pool = handle.pool
    if not hasattr(pool, "forest_snapshot"):
        raise InvalidRequest(f"pool {handle.name!r} is not a mirror (strategy {pool.strategy!r})")
    snapshot = pool.forest_snapshot()
    return await asyncio.to_thread(forest_of, snapshot)


@router.put("/{pool}/cache/policy", response_model=PolicyOut, tags=["entries"])
async def set_policy(body: PolicyIn, cache: CacheDep) -> dict:
    cache.policy = body.policy
    return {"policy": cache.policy}
