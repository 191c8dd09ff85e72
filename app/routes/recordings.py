"""Recordings: start / stop recording a pool to disk, list the files, download one, open one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from allocator.errors import NotFound

from ..auth import check_token
from ..deps import HubDep, PoolDep, RegistryDep
from ..recordings import NAME_PATTERN, Recordings
from ..schemas import POOL_NAME_PATTERN

router = APIRouter(tags=["recordings"])

RecordingName = Annotated[str, Path(pattern=NAME_PATTERN, description="recording name (file without .kvrec)")]


class RecordingStart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=NAME_PATTERN,
                             description="file name without .kvrec (default: <pool>-<date>-<time>)")


class RecordingOpen(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: str | None = Field(None, pattern=POOL_NAME_PATTERN, description="pool name to serve it as (default rec-<name>)")


def recordings_of(request: Request) -> Recordings:
    return request.app.state.recordings


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
    recs = recordings_of(request)
    return {"directory": str(recs.directory), "recordings": recs.listing()}


@router.get("/api/recordings/{name}/file", summary="Download a recording file",
            dependencies=[Depends(check_token)], response_class=FileResponse)
async def download_recording(name: RecordingName, request: Request) -> FileResponse:
    recs = recordings_of(request)
    path = recs.file_of(name)
    if not path.is_file():
        raise NotFound("recording", name)
    for recorder, _ in recs.active.values():
        if recorder.path.resolve() == path.resolve():
            recorder.flush()  # what is downloaded is everything up to now
    return FileResponse(path, media_type="application/vnd.sqlite3", filename=path.name)


@router.post("/api/recordings/{name}/open", status_code=status.HTTP_201_CREATED,
             summary="Serve a recording as a read-only pool")
async def open_recording(name: RecordingName, request: Request, registry: RegistryDep, hub: HubDep,
                         body: RecordingOpen | None = None) -> dict:
    """The recording becomes a pool (default name `rec-<name>`) whose map, stats and events are
    those at its last event; `at_seq` and /history reach any point of it. Anything that would
    change it is 409."""
    pool = recordings_of(request).open(name, body.pool if body else None)
    handle = registry.adopt(pool.name, pool)
    hub.attach(handle)
    return handle.describe()
