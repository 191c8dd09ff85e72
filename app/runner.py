"""Runs a live workload (workloads/live.py) against one pool in an asyncio task.

Every TICK_S the runner takes the pool's lock and calls `advance(TICK_S)`, which does what should
happen in that much wall time at the workload's speed; progress goes to the stream as a
`progress` message. The workload logs its own lifecycle (`workload` events: running, finished,
stopped); the runner adds one progress event about once a second while it runs, and the
failure event when `advance` raises. Stopping, and failing, call the workload's `stop()`, which
frees what it still holds; a failure is remembered on the handle (`workload_error`) so that
`workload_progress` says `failed`, with the error, until the next workload starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from allocator.errors import Conflict, InvalidRequest, KVScopeError

TICK_S = 0.05
EVENT_EVERY_S = 1.0

log = logging.getLogger("kvscope.workload")


def build(pool, spec: dict):
    """A LiveWorkload for `spec`. Raises InvalidRequest (bad spec, or no workload engine)."""
    try:
        from workloads.live import build_live_workload  # optional: a build without it refuses workloads (422)
    except ImportError as exc:
        raise InvalidRequest(f"the workload engine is not available: {exc}") from None
    try:
        return build_live_workload(pool, spec)
    except KVScopeError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequest(f"bad workload: {exc}") from None


def _record(handle, progress: dict) -> None:
    handle.pool.events.record("workload", progress.get("name"), progress.get("state"),
                              progress.get("done"), progress.get("total"))


async def start_workload(handle, hub, spec: dict) -> dict:
    """Start `spec` on the pool. Raises Conflict (one is running), InvalidRequest."""
    if handle.workload_task is not None and not handle.workload_task.done():
        raise Conflict(f"a workload is already running on pool {handle.name!r}; DELETE it first")
    workload = build(handle.pool, spec)
    handle.workload = workload
    handle.workload_error = None
    progress = dict(workload.progress())
    hub.progress(handle, progress)
    handle.workload_task = asyncio.get_running_loop().create_task(
        _drive(handle, hub, workload), name=f"workload:{handle.name}")
    return progress


async def _drive(handle, hub, workload) -> None:
    loop = asyncio.get_running_loop()
    last_event = loop.time()
    running = True
    try:
        while running:
            started = loop.time()
            async with handle.lock:
                try:
                    running = bool(workload.advance(TICK_S))
                except KVScopeError as exc:  # the pool cannot serve it (a request past its size)
                    log.warning("workload on pool %s failed: %s", handle.name, exc)
                    _fail(handle, hub, workload, exc)
                    return
                except Exception as exc:  # a bug; the workload stops, the server keeps serving
                    log.exception("workload on pool %s failed", handle.name)
                    _fail(handle, hub, workload, exc)
                    return
            progress = dict(workload.progress())
            if not running and progress.get("state") == "running":
                progress["state"] = "finished"
            hub.progress(handle, progress)
            now = loop.time()
            if running and now - last_event >= EVENT_EVERY_S:
                _record(handle, progress)
                last_event = now
            if running:  # a finished workload's task ends now: a stop cannot land after "finished"
                await asyncio.sleep(max(0.0, TICK_S - (loop.time() - started)))
    except asyncio.CancelledError:
        workload.stop()  # frees what it holds and logs "stopped"; no await: nothing interleaves
        progress = {**workload.progress(), "state": "stopped"}
        hub.progress(handle, progress)
        raise


def _fail(handle, hub, workload, exc: Exception) -> None:
    """Free what the failed workload holds, remember why it failed, and say so."""
    handle.workload_error = str(exc) or type(exc).__name__
    try:
        workload.stop()  # logs its own "stopped"; the "failed" event below follows it
    except Exception:
        log.exception("stopping the failed workload on pool %s failed too", handle.name)
    progress = {**workload.progress(), "state": "failed", "error": handle.workload_error}
    _record(handle, progress)
    hub.progress(handle, progress)


def workload_progress(handle) -> dict | None:
    """The latest workload's progress (`failed` with its `error` if it raised), or None."""
    if handle.workload is None:
        return None
    progress = dict(handle.workload.progress())
    task = handle.workload_task
    if handle.workload_error is not None:
        progress.update(state="failed", error=handle.workload_error)
    elif task is not None and task.cancelled():
        progress["state"] = "stopped"
    elif task is not None and task.done() and progress.get("state") == "running":
        progress["state"] = "finished"
    return progress


async def stop_workload(handle) -> bool:
    """Stop the pool's workload; False when none was running."""
    task = handle.workload_task
    if task is None or task.done():
        return False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return True
