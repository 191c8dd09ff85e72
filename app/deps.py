"""Dependencies shared by the routers, as `Annotated` aliases (`PoolDep`, `CacheDep`, ...).

NOTE: they are `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool,
which costs more than the allocator call it guards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Request
from starlette.requests import HTTPConnection

from allocator import KVCache, PrefixPool
from allocator.errors import NotFound

from .fleets import FleetHandle, Fleets
from .operations import cache_of, prefix_pool_of
from .recordings import NAME_PATTERN, Recordings
from .registry import PoolHandle, Registry
from .routing_jobs import RoutingRuns
from .schemas import POOL_NAME_PATTERN, Key
from .services import Services
from .settings import Settings
from .stream import Hub

T = TypeVar("T")


def services_of(conn: HTTPConnection) -> Services:
    """The server's services (app/services.py), from a request or a websocket."""
    return conn.app.state.services


async def get_services(request: Request) -> Services:
    return services_of(request)


async def get_registry(request: Request) -> Registry:
    return services_of(request).registry


async def get_hub(request: Request) -> Hub:
    return services_of(request).hub


async def get_app_settings(request: Request) -> Settings:
    return services_of(request).settings


async def get_fleets(request: Request) -> Fleets:
    return services_of(request).fleets


async def get_recordings(request: Request) -> Recordings:
    return services_of(request).recordings


async def get_routing_runs(request: Request) -> RoutingRuns:
    return services_of(request).routing_runs


ServicesDep = Annotated[Services, Depends(get_services)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
HubDep = Annotated[Hub, Depends(get_hub)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
FleetsDep = Annotated[Fleets, Depends(get_fleets)]
RecordingsDep = Annotated[Recordings, Depends(get_recordings)]
RoutingRunsDep = Annotated[RoutingRuns, Depends(get_routing_runs)]
PoolName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, description="pool name", examples=["default"])]
EntryKey = Annotated[Key, Path(description="cache key", examples=["session-1"])]
FleetName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, description="fleet name")]
RecordingName = Annotated[str, Path(pattern=NAME_PATTERN, description="recording name (file without .kvrec)")]


async def find_pool(pool: PoolName, registry: RegistryDep) -> PoolHandle:
    """The pool named in the path, without its lock. Raises NotFound (404)."""
    return registry.get(pool)


async def get_pool(pool: PoolName, registry: RegistryDep) -> AsyncIterator[PoolHandle]:
    """The pool named in the path, its lock held while the route runs. Raises NotFound (404).

    NOTE: holding the lock is what lets O(pool) calls (check, defragment, the JSON block map)
    run in a worker thread (`run_locked`): no other route of this pool, workload tick or
    stream tick touches the pool meanwhile. Uncontended, taking it never yields to the loop.
    `scope="function"` releases it when the route returns, before the answer is written, so
    a slow reader of a response cannot hold the pool.
    """
    handle = registry.get(pool)
    async with handle.lock:
        if registry.find(pool) is not handle:  # deleted (or replaced) while we waited
            raise NotFound("pool", pool)
        yield handle


PoolDep = Annotated[PoolHandle, Depends(get_pool, scope="function")]
UnlockedPoolDep = Annotated[PoolHandle, Depends(find_pool)]


async def get_fleet(fleet: FleetName, fleets: FleetsDep) -> FleetHandle:
    """The fleet named in the path, without its lock (what reads the fleet takes it). Raises NotFound."""
    return fleets.get(fleet)


FleetDep = Annotated[FleetHandle, Depends(get_fleet)]


async def run_locked(fn: Callable[[], T]) -> T:
    """Run `fn` (O(pool) work) in a worker thread; the caller holds the pool's lock (PoolDep),
    so the event loop keeps serving /healthz, other pools and the streams meanwhile."""
    return await asyncio.to_thread(fn)


async def get_prefix_pool(handle: PoolDep) -> PrefixPool:
    """The prefix-caching pool named in the path. Raises NotFound, Conflict."""
    return prefix_pool_of(handle.pool)


PrefixPoolDep = Annotated[PrefixPool, Depends(get_prefix_pool)]


async def get_cache(handle: PoolDep) -> KVCache:
    """The cache of the pool named in the path. Raises NotFound, Conflict (no cache)."""
    return cache_of(handle.pool)


CacheDep = Annotated[KVCache, Depends(get_cache)]


async def get_cache_unlocked(handle: UnlockedPoolDep) -> KVCache:
    """As `get_cache`, without the pool's lock (a route that awaits a body takes it itself)."""
    return cache_of(handle.pool)


UnlockedCacheDep = Annotated[KVCache, Depends(get_cache_unlocked)]

