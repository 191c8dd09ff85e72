"""Dependencies shared by the routers, as `Annotated` aliases (`PoolDep`, `CacheDep`, ...).

NOTE: they are `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool,
which costs more than the allocator call it guards.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from allocator import KVCache, Pool, PrefixPool
from allocator.errors import Conflict

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


def cache_of(pool: Pool) -> KVCache:
    """The pool's cache. Raises Conflict when it has none."""
    if pool.cache is None:
        raise Conflict(f"pool {pool.name!r} has no cache; create it with 'cache': {{...}}")
    return pool.cache


def refuse_cache_entry(pool: Pool, aid: int) -> None:
    """Raises Conflict when allocation `aid` holds a cache entry: entries change through the
    cache (/entries, or the put/delete ops), else the cache's books would go wrong."""
    key = pool.cache.key_of(aid) if pool.cache is not None else None
    if key is not None:
        raise Conflict(f"allocation {aid} holds cache entry {key!r}; change it through /entries/{{key}} "
                       "or the put/delete ops")


def prefix_pool_of(pool: Pool) -> PrefixPool:
    """The pool as a prefix-caching pool. Raises Conflict when it was created without."""
    if not isinstance(pool, PrefixPool):
        raise Conflict(f"pool {pool.name!r} has no prefix caching; create it with "
                       "'prefix_caching': {\"policy\": \"lru\"} and 'tokens_per_block'")
    return pool


async def get_prefix_pool(handle: PoolDep) -> PrefixPool:
    """The prefix-caching pool named in the path. Raises NotFound, Conflict."""
    return prefix_pool_of(handle.pool)


PrefixPoolDep = Annotated[PrefixPool, Depends(get_prefix_pool)]


async def get_cache(handle: PoolDep) -> KVCache:
    """The cache of the pool named in the path. Raises NotFound, Conflict (no cache)."""
    return cache_of(handle.pool)


CacheDep = Annotated[KVCache, Depends(get_cache)]

