"""Engine links of a pool: a mirror's subscriber (feeding it on the event loop, under the pool's
lock) and a publisher of a pool's prefix-cache events. Routes and the CLI call `resolve` and
`attach`; `Hub.detach` closes what `attach` started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque

import zmq

from allocator.errors import Conflict, InvalidRequest
from kvevents.engine_metrics import MetricsError, num_gpu_blocks
from kvevents.link import MirrorLink
from kvevents.pool_publisher import PoolPublisher
from kvevents.recording import read, replay_into

log = logging.getLogger("kvscope.mirror")
PUBLISH_EVERY_S = 0.02


class LoopApplier:
    """Hands changes from the subscribers' threads to the event loop, applied in order under the
    pool's asyncio lock. Changes queue in a deque; one drain task per burst applies them, in
    slices of at most SLICE_S: between slices it lets go of the lock and the loop, so a burst
    of batches never holds up other requests (or readers of the pool) for longer than a slice.
    `close()` drops what is queued and refuses what comes after (a deleted fleet's batches).

    No lock between the threads and the loop: `deque.append` / `popleft` are atomic, and the
    `_scheduled` flag is cleared by the drain before its last look at the queue, so a change
    appended after that look finds the flag down and schedules a drain itself (two drains at
    once are harmless: the loop runs one at a time, the second finds the queue empty). A mutex
    here made a fleet's hundreds of subscriber threads queue on it behind the GIL."""

    SLICE_S = 0.01
    # A drain starts this long after the change that scheduled it, so the changes handed over
    # meanwhile share one wake-up of the loop (a fleet's many engines hand over thousands a
    # second), for at most this much more lag.
    COALESCE_S = 0.002

    def __init__(self, loop: asyncio.AbstractEventLoop, lock: asyncio.Lock) -> None:
        self.loop, self.lock = loop, lock
        self._q: deque = deque()
        self._scheduled = False
        self._closed = False
        self.failures = 0
        self.slices = 0
        self.longest_slice_s = 0.0  # CPU time of the loop's thread: what other requests waited

    def __call__(self, change) -> None:
        if self._closed:
            return
        self._q.append(change)
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._kick)
        except RuntimeError:  # the loop is closed: the server is stopping
            self._q.clear()
            self._scheduled = False

    def close(self) -> None:
        self._closed = True
        self._q.clear()

    def figures(self) -> dict:
        """Changes waiting, failed changes, and the longest the loop ran changes in one go (CPU
        time of its thread, so a busy machine does not inflate it: what the loop itself spent)."""
        return {"queued": len(self._q), "failures": self.failures, "slices": self.slices,
                "longest_slice_ms": round(self.longest_slice_s * 1000, 2)}

    def _kick(self) -> None:
        self.loop.call_later(self.COALESCE_S, self._start_drain)

    def _start_drain(self) -> None:
        self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        q = self._q
        while True:
            async with self.lock:
                end = time.monotonic() + self.SLICE_S
                cpu0 = time.thread_time()
                try:
                    while True:
                        try:
                            change = q.popleft()
                        except IndexError:
                            self._scheduled = False
                            if not q:  # the last look, after the flag went down
                                return
                            self._scheduled = True
                            continue
                        if self._closed:
                            q.clear()
                            return
                        try:
                            change()
                        except Exception:  # a bad change must not stop the ones after it
                            self.failures += 1
                            log.exception("mirror change failed")
                        if time.monotonic() >= end:
                            break
                finally:
                    self.slices += 1
                    self.longest_slice_s = max(self.longest_slice_s, time.thread_time() - cpu0)
            await asyncio.sleep(0)  # the slice is spent: let the loop (and the lock's waiters) in


class PublishLink:
    """A PoolPublisher flushed by a task on the event loop every PUBLISH_EVERY_S."""

    def __init__(self, pool, spec: dict) -> None:
        try:
            self.publisher = PoolPublisher(pool, spec["endpoint"], topic=spec.get("topic") or "",
                                           replay_endpoint=spec.get("replay_endpoint"))
        except zmq.ZMQError as exc:
            where = spec["endpoint"] + (f" / {spec['replay_endpoint']}" if spec.get("replay_endpoint") else "")
            if exc.errno == zmq.EADDRINUSE:
                raise Conflict(f"publish endpoint {where} is already in use") from None
            raise InvalidRequest(f"cannot open publish endpoint {where}: {exc}") from None
        self.task = asyncio.get_running_loop().create_task(self._run(), name="kvevents-publish")

    async def _run(self) -> None:
        while True:
            try:
                self.publisher.flush()
            except Exception:
                log.exception("publishing failed")
            await asyncio.sleep(PUBLISH_EVERY_S)

    async def aclose(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        with contextlib.suppress(Exception):
            self.publisher.flush()
        await asyncio.to_thread(self.publisher.close)


class MirrorLinkHandle:
    def __init__(self, link) -> None:
        self.link = link

    async def aclose(self) -> None:
        await asyncio.to_thread(self.link.close)


class PlaybackLink:
    """Feeds a mirror pool from a recording (kvevents/recording.py) in a daemon thread, at
    `speed` times real time (None: as fast as it goes), through the loop applier."""

    def __init__(self, handle, path: str, speed: float | None) -> None:
        next(iter(read(path)), None)  # a file that is not a recording fails here, in one line
        self.path, self.speed = path, speed
        self.progress: dict = {}
        self.state = "playing"
        self.error: str | None = None
        self._stop = threading.Event()
        applier = LoopApplier(asyncio.get_running_loop(), handle.lock)
        handle.pool.source = self
        self._thread = threading.Thread(target=self._run, args=(handle.pool, applier),
                                        daemon=True, name="kvevents-playback")
        self._thread.start()

    def _run(self, pool, applier) -> None:
        try:
            replay_into(self.path, pool, self.speed, apply=applier, stop=self._stop,
                        progress=self.progress)
            self.state = "done"
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def status(self) -> dict:
        return {"state": self.state, "recording": self.path, "speed": self.speed,
                "last_error": self.error, "lost_batches": 0, "error_count": 0,
                "errors": {}, **self.progress}

    def describe(self) -> dict:
        return {"endpoint": f"recording {self.path}", "topic": "", "replay_endpoint": None}

    async def aclose(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 5)


async def start_pool(registry, hub, spec: dict, record: str | None = None,
                     playback: str | None = None, speed: float | None = None):
    """Create a pool with its links, as POST /api/pools does (the CLI's startup pools)."""
    spec = await resolve(spec)
    handle = registry.create(spec)
    try:
        attach(handle, spec, record=record)
        if playback:
            handle.links.append(PlaybackLink(handle, playback, speed))
    except Exception:
        registry.remove(handle.name)
        await detach(handle)
        raise
    hub.attach(handle)
    return handle


async def resolve(spec: dict) -> dict:
    """A mirror spec with `num_blocks` filled from the engine's metrics when not given. Raises
    InvalidRequest naming the URL when it cannot be read."""
    if spec.get("strategy") != "mirror" or spec.get("num_blocks") is not None:
        return spec

    url = (spec.get("mirror") or {}).get("metrics_url")
    if not url:
        raise InvalidRequest("give 'num_blocks', or 'mirror.metrics_url' (an engine /metrics "
                             "with vllm:cache_config_info) to take it from")
    try:
        n = await asyncio.to_thread(num_gpu_blocks, url)
    except MetricsError as exc:
        raise InvalidRequest(f"{exc}; give 'num_blocks'") from None
    return {**spec, "num_blocks": n}


def attach(handle, spec: dict, record: str | None = None) -> None:
    """Start the pool's links (mirror subscriber, publisher). Raises Conflict / InvalidRequest;
    then nothing was started."""
    pool = handle.pool
    links = []
    try:
        if spec.get("publish"):
            links.append(PublishLink(pool, spec["publish"]))
        if spec.get("strategy") == "mirror" and spec.get("mirror"):
            m = spec["mirror"]
            applier = LoopApplier(asyncio.get_running_loop(), handle.lock)
            try:
                links.append(MirrorLinkHandle(MirrorLink(
                    pool, m["endpoint"], topic=m.get("topic") or "",
                    replay_endpoint=m.get("replay_endpoint"), metrics_url=m.get("metrics_url"),
                    record=record, apply=applier)))
            except zmq.ZMQError as exc:
                raise InvalidRequest(f"cannot connect to {m['endpoint']}: {exc}") from None
            except OSError as exc:  # the recording file
                raise InvalidRequest(f"cannot record to {record!r}: {exc}") from None
    except Exception:
        for link in links:
            if isinstance(link, PublishLink):
                link.task.cancel()
                link.publisher.close()
            else:
                link.link.close()
        raise
    handle.links.extend(links)


async def detach(handle) -> None:
    """Stop every link of the pool (sockets closed, threads joined off the loop)."""
    links, handle.links = list(handle.links), []
    for link in links:
        try:
            await link.aclose()
        except Exception:
            log.exception("closing a link of pool %s failed", handle.name)
