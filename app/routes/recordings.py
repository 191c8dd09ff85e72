"""Recordings: start / stop recording a pool to disk, list the files, download one, open one."""

from __future__ import annotations

from pathlib import Path as Pathlib
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from allocator.errors import Conflict, InvalidRequest

from ..auth import check_token
from ..deps import HubDep, PoolDep, RegistryDep, services_of
from ..errors import ApiError
from ..recordings import NAME_PATTERN, Recordings
from ..schemas import POOL_NAME_PATTERN

router = APIRouter(tags=["recordings"])

UPLOAD_PATH = "/api/recordings/upload"
OCTET = "application/octet-stream"
WRITE_CHUNK = 1 << 20  # upload bytes gathered before one write, off the event loop

RecordingName = Annotated[str, Path(pattern=NAME_PATTERN, description="recording name (file without .kvrec)")]


class RecordingStart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=NAME_PATTERN,
                             description="file name without .kvrec (default: <pool>-<date>-<time>)")


class RecordingOpen(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: str | None = Field(None, pattern=POOL_NAME_PATTERN,
                             description="pool name to serve it as (default rec-<name>)")


def recordings_of(request: Request) -> Recordings:
    return services_of(request).recordings


@router.post("/api/pools/{pool}/recording", status_code=status.HTTP_201_CREATED,
             summary="Start recording the pool to a file")
async def start_recording(handle: PoolDep, request: Request, body: RecordingStart | None = None) -> dict:
    """From now on the pool's config, events and keyframes go to `<name>.kvrec` (SQLite, WAL)
    in the server's recordings directory, committed every 0.5 s: a killed server loses at most
    the last second. 409 when already recording."""
    return recordings_of(request).start(handle, body.name if body else None)


@router.get("/api/pools/{pool}/recording", summary="The pool's recording in progress")
async def get_recording(handle: PoolDep, request: Request) -> dict:
    """`recording` true with the file's name and progress while one runs; false (with `error`
    when the last one stopped on its own, e.g. a full disk) otherwise."""
    recs = recordings_of(request)
    active = recs.active.get(handle.name)
    if active is None:
        out = {"pool": handle.name, "recording": False}
        if handle.name in recs.failed:
            out["error"] = recs.failed[handle.name]
        return out
    return active[0].info() | {"name": active[0].path.stem}


@router.delete("/api/pools/{pool}/recording", summary="Stop recording the pool")
async def stop_recording(handle: PoolDep, request: Request) -> dict:
    return recordings_of(request).stop(handle.name)


@router.get("/api/recordings", summary="Recording files on the server")
async def list_recordings(request: Request) -> dict:
    """Every `.kvrec` file in the directory; one that is not a sound recording (put there by
    hand, cut short, damaged) is listed with `error` saying what is wrong with it."""
    recs = recordings_of(request)
    return {"directory": str(recs.directory), "recordings": await run_in_threadpool(recs.listing)}


@router.get("/api/recordings/{name}/file", summary="Download a recording file",
            dependencies=[Depends(check_token)], response_class=FileResponse)
async def download_recording(name: RecordingName, request: Request) -> FileResponse:
    """The file as it is (one in progress: up to now). A file that is not a sound recording is
    422 saying what is wrong with it."""
    recs = recordings_of(request)
    path = await run_in_threadpool(recs.download, name)
    recs.flush_all(only=path)  # what is downloaded is everything up to now
    return FileResponse(path, media_type="application/vnd.sqlite3", filename=path.name)


@router.post("/api/recordings/{name}/open", status_code=status.HTTP_201_CREATED,
             summary="Serve a recording as a read-only pool")
async def open_recording(name: RecordingName, request: Request, registry: RegistryDep, hub: HubDep,
                         body: RecordingOpen | None = None) -> dict:
    """The recording becomes a pool (default name `rec-<name>`) whose map, stats and events are
    those at its last event; `at_seq` and /history reach any point of it. Anything that would
    change it is 409. A file the server did not write (or that changed since) is checked whole
    first, as an upload is: one that is not a sound recording is 422 saying what is wrong."""
    pool = await run_in_threadpool(recordings_of(request).open, name, body.pool if body else None)
    handle = registry.adopt(pool.name, pool)
    hub.attach(handle)
    return handle.describe()


@router.post(UPLOAD_PATH, status_code=status.HTTP_201_CREATED,
             summary="Upload a recording file and serve it as a read-only pool",
             openapi_extra={"requestBody": {"required": True, "content": {
                 OCTET: {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_recording(request: Request, registry: RegistryDep, hub: HubDep) -> dict:
    """The body is the file's bytes (`Content-Type: application/octet-stream`; the one mutation
    that is not JSON: a file is bytes, and this type is no more CORS-safelisted than JSON, so a
    cross-site form cannot send it either). At most KVSCOPE_MAX_UPLOAD bytes (413 says the cap).
    It must be a pool history recording (`kvscope record`, Record on the page): anything else is
    422 saying what the file is and which command reads it (a KV-event recording: `kvscope
    recording FILE`). Kept in the recordings directory as `upload-<date>-<time>-<random>` (a
    name the server chooses), then opened like POST /api/recordings/{name}/open: the answer
    is the pool it is served as (`rec-upload-...`)."""
    registry.check_room()  # before receiving what could not be served anyway
    recs = recordings_of(request)
    limit = services_of(request).settings.max_upload
    part = recs.incoming()
    try:
        size = await receive_to(request, part, limit)
        if size == 0:
            raise InvalidRequest("empty upload: send the recording file's bytes as the body")
        pool = await run_in_threadpool(recs.accept_upload, part)
    finally:
        for leftover in (part, part.with_name(part.name + "-wal"), part.with_name(part.name + "-shm")):
            leftover.unlink(missing_ok=True)
    try:
        handle = registry.adopt(pool.name, pool)
    except Conflict:
        Pathlib(pool.path).unlink(missing_ok=True)  # a refused request keeps nothing
        raise
    try:
        out = handle.describe() | {"recording": Pathlib(pool.path).stem}
    except BaseException:  # (open_untrusted built both once already): still, keep nothing
        registry.remove(pool.name)
        Pathlib(pool.path).unlink(missing_ok=True)
        raise
    hub.attach(handle)
    return out


async def receive_to(request: Request, path: Pathlib, limit: int) -> int:
    """Stream the body to `path`, writes off the event loop. Raises ApiError 413 past `limit`."""
    size = 0
    buf: list[bytes] = []
    pending = 0
    with open(path, "wb") as f:
        async for chunk in request.stream():
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
