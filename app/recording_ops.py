"""Recording operations: what the recording routes (app/routes/recordings.py) do beyond one
call of the recordings service (app/recordings.py): the blocking file work off the event loop,
an opened or uploaded file made a pool of the registry and the stream hub, and an upload's bytes
streamed to disk under the size cap, keeping nothing of a refused one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from allocator.errors import Conflict, InvalidRequest

from .http.errors import ApiError
from .recordings import Recordings
from .registry import PoolHandle, Registry
from .stream import Hub

WRITE_CHUNK = 1 << 20  # upload bytes gathered before one write, off the event loop


def status(recs: Recordings, handle: PoolHandle) -> dict:
    """The pool's recording in progress (`recording` true, its file's name and progress), else
    `recording` false, with `error` when the last one stopped on its own."""
    active = recs.active.get(handle.name)
    if active is None:
        out = {"pool": handle.name, "recording": False}
        if handle.name in recs.failed:
            out["error"] = recs.failed[handle.name]
        return out
    return active[0].info() | {"name": active[0].path.stem}


async def listing(recs: Recordings) -> dict:
    """The recordings directory and every file in it (read in a worker thread)."""
    return {"directory": str(recs.directory), "recordings": await run_in_threadpool(recs.listing)}


async def download(recs: Recordings, name: str) -> Path:
    """The file of recording `name`, checked (in a worker thread) and flushed up to now when it
    is being written. Raises NotFound, InvalidRequest."""
    path = await run_in_threadpool(recs.download, name)
    recs.flush_all(only=path)  # what is downloaded is everything up to now
    return path


async def open_as_pool(recs: Recordings, registry: Registry, hub: Hub, name: str,
                       as_name: str | None = None) -> dict:
    """Serve recording `name` as the read-only pool `as_name` (default rec-<name>); the pool as
    GET /api/pools/{pool} shows it. Raises NotFound, InvalidRequest, Conflict."""
    pool = await run_in_threadpool(recs.open, name, as_name)
    handle = registry.adopt(pool.name, pool)
    hub.attach(handle)
    return handle.describe()


async def upload(recs: Recordings, registry: Registry, hub: Hub, chunks: AsyncIterator[bytes],
                 limit: int) -> dict:
    """Receive a recording file's bytes (at most `limit`), keep it under a name of the server's
    and serve it as a read-only pool: the pool as GET /api/pools/{pool} shows it, plus its
    `recording` name. Raises ApiError 413, InvalidRequest, Conflict; then nothing is kept."""
    registry.check_room()  # before receiving what could not be served anyway
    part = recs.incoming()
    try:
        size = await receive_to(chunks, part, limit)
        if size == 0:
            raise InvalidRequest("empty upload: send the recording file's bytes as the body")
        pool = await run_in_threadpool(recs.accept_upload, part)
    finally:
        for leftover in (part, part.with_name(part.name + "-wal"), part.with_name(part.name + "-shm")):
            leftover.unlink(missing_ok=True)
    try:
        handle = registry.adopt(pool.name, pool)
    except Conflict:
        Path(pool.path).unlink(missing_ok=True)  # a refused request keeps nothing
        raise
    try:
        out = handle.describe() | {"recording": Path(pool.path).stem}
    except BaseException:  # (open_untrusted built both once already): still, keep nothing
        registry.remove(pool.name)
        Path(pool.path).unlink(missing_ok=True)
        raise
    hub.attach(handle)
    return out


async def receive_to(chunks: AsyncIterator[bytes], path: Path, limit: int) -> int:
    """Write `chunks` (a request body's stream) to `path`, writes off the event loop. Raises
    ApiError 413 past `limit`."""
    size = 0
    buf: list[bytes] = []
    pending = 0
    with open(path, "wb") as f:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "too_large", f"recording upload exceeds {limit} bytes "
                               "(KVSCOPE_MAX_UPLOAD)", {"max_bytes": limit})
            buf.append(chunk)
            pending += len(chunk)
            if pending >= WRITE_CHUNK:
                await run_in_threadpool(f.write, b"".join(buf))
                buf.clear()
                pending = 0
        if buf:
            await run_in_threadpool(f.write, b"".join(buf))
    return size
