"""Housekeeping: the one task that does what no request asks for (today: TTL expiry).

Every `interval_s` it asks each pool's cache to reap its expired entries, listeners or not;
cheap, since `KVCache.expire` pops only the TTL heap's expired top. It runs on the event loop
between handlers, so it is serialized with them like any handler is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .registry import Registry

HOUSEKEEPING_S = 0.05  # as often as the stream ticks: an expired entry leaves the map promptly

log = logging.getLogger("kvscope.housekeeping")


def sweep(registry: Registry) -> int:
    """Reap expired entries in every pool's cache now; returns how many were reaped."""
    reaped = 0
    for handle in registry:
        cache = handle.cache
        if cache is None or handle.lock.locked():  # a worker thread may hold it (app/deps.py)
            continue
        try:
            reaped += len(cache.expire())
        except Exception:  # one broken pool must not stop the others' expiry
            log.exception("TTL expiry failed for pool %s", handle.name)
    return reaped


class Housekeeper:
    """Owns the housekeeping task: `start()` in the app's lifespan, `stop()` at shutdown."""

    def __init__(self, registry: Registry, interval_s: float = HOUSEKEEPING_S) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="housekeeping")

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        # A test harness may end the lifespan on another loop than it began on: the task's own
        # loop then finishes the cancellation, and there is nothing here to wait for.
        if task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            sweep(self.registry)
            await asyncio.sleep(self.interval_s)
