"""Dependencies shared by the routers, as `Annotated` aliases (`PoolDep`, `CacheDep`, ...).

NOTE: they are `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool,
which costs more than the allocator call it guards.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from allocator import KVCache

from .operations import cache_of, refuse_cache_entry  # noqa: F401 - their old home; kept importable
from .registry import PoolHandle, Registry
from .schemas import POOL_NAME_PATTERN, Key
from .settings import Settings
from .stream import Hub


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


async def get_hub(request: Request) -> Hub:
    return request.app.state.hub


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


RegistryDep = Annotated[Registry, Depends(get_registry)]
HubDep = Annotated[Hub, Depends(get_hub)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PoolName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, description="pool name", examples=["default"])]
EntryKey = Annotated[Key, Path(description="cache key", examples=["session-1"])]


async def get_pool(pool: PoolName, registry: RegistryDep) -> PoolHandle:
    """The pool named in the path. Raises NotFound (404)."""
    return registry.get(pool)


PoolDep = Annotated[PoolHandle, Depends(get_pool)]


async def get_cache(handle: PoolDep) -> KVCache:
    """The cache of the pool named in the path. Raises NotFound, Conflict (no cache)."""
    return cache_of(handle.pool)


CacheDep = Annotated[KVCache, Depends(get_cache)]

