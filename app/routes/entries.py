"""Cache entries: put, get (touch), delete, evict, list in eviction order, and their raw data."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status

from .. import operations
from ..deps import CacheDep, EntryKey, UnlockedCacheDep, UnlockedPoolDep
from ..http.auth import check_token
from ..schemas import EntryList, EntryOut, EntryPut, PutOut

router = APIRouter(prefix="/api/pools/{pool}/entries", tags=["entries"])

OCTET = "application/octet-stream"


@router.get("", response_model=EntryList)
async def list_entries(
    cache: CacheDep, limit: Annotated[int, Query(ge=1, le=100_000)] = 1000
) -> dict:
    now = cache.clock()
    return {"entries": [e.to_dict(now, cache.pool) for e in cache.entries(limit)], "total": len(cache)}


@router.put(
    "/{key}",
    response_model=PutOut,
    responses={201: {"model": PutOut, "description": "a new entry"}},
    description="Insert or refresh an entry: 201 when new, 200 when it existed (touched, resized).",
)
async def put_entry(key: EntryKey, body: EntryPut, cache: CacheDep, response: Response) -> dict:
    result = operations.put(cache.pool, key, body.bytes, body.tokens, body.priority, body.ttl_s, body.pinned)
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return operations.put_result(cache.pool, result)


@router.get("/{key}", response_model=EntryOut, dependencies=[Depends(check_token)],
            description="A hit touches the entry; a miss is 404. Needs the token when one is set.")
async def get_entry(key: EntryKey, cache: CacheDep) -> dict:
    return operations.get_result(cache.pool, key)


@router.delete("/{key}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_entry(key: EntryKey, cache: CacheDep) -> Response:
    operations.delete(cache.pool, key)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{key}/evict", status_code=status.HTTP_204_NO_CONTENT,
             description="Evict the entry now (an `evict` event, reason `manual`); a pinned entry is 409.")
async def evict_entry(key: EntryKey, cache: CacheDep) -> Response:
    operations.evict(cache.pool, key)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put(
    "/{key}/data",
    status_code=status.HTTP_204_NO_CONTENT,
    openapi_extra={"requestBody": {"required": True, "content": {
        OCTET: {"schema": {"type": "string", "format": "binary"}}}}},
    description="Raw bytes written into the entry's device blocks (at most the entry's size).",
)
async def put_data(key: EntryKey, request: Request, handle: UnlockedPoolDep, cache: UnlockedCacheDep) -> Response:
    cache.peek(key)  # 404 before reading a body that has nowhere to go
    # Not under the lock while the body arrives: a slow uploader must not hold the pool.
    payload = await request.body()
    async with handle.lock:  # the body was awaited: re-resolve the entry under the lock
        cache.write(key, payload)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{key}/data",
    response_class=Response,
    responses={200: {"content": {OCTET: {"schema": {"type": "string", "format": "binary"}}}}},
)
async def get_data(key: EntryKey, cache: CacheDep) -> Response:
    return Response(cache.read(key), media_type=OCTET)
