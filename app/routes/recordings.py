"""Recordings: start / stop recording a pool to disk, list the files, download one, open one."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import FileResponse

from .. import recording_ops
from ..deps import HubDep, PoolDep, RecordingName, RecordingsDep, RegistryDep, SettingsDep
from ..http.auth import check_token
from ..schemas import RecordingOpen, RecordingStart

router = APIRouter(tags=["recordings"])

UPLOAD_PATH = "/api/recordings/upload"
OCTET = "application/octet-stream"


@router.post("/api/pools/{pool}/recording", status_code=status.HTTP_201_CREATED,
             summary="Start recording the pool to a file")
async def start_recording(handle: PoolDep, recs: RecordingsDep, body: RecordingStart | None = None) -> dict:
    """From now on the pool's config, events and keyframes go to `<name>.kvrec` (SQLite, WAL)
    in the server's recordings directory, committed every 0.5 s: a killed server loses at most
    the last second. 409 when already recording."""
    return recs.start(handle, body.name if body else None)


@router.get("/api/pools/{pool}/recording", summary="The pool's recording in progress")
async def get_recording(handle: PoolDep, recs: RecordingsDep) -> dict:
    """`recording` true with the file's name and progress while one runs; false (with `error`
    when the last one stopped on its own, e.g. a full disk) otherwise."""
    return recording_ops.status(recs, handle)


@router.delete("/api/pools/{pool}/recording", summary="Stop recording the pool")
async def stop_recording(handle: PoolDep, recs: RecordingsDep) -> dict:
    return recs.stop(handle.name)


@router.get("/api/recordings", summary="Recording files on the server")
async def list_recordings(recs: RecordingsDep) -> dict:
    """Every `.kvrec` file in the directory; one that is not a sound recording (put there by
    hand, cut short, damaged) is listed with `error` saying what is wrong with it."""
    return await recording_ops.listing(recs)


@router.get("/api/recordings/{name}/file", summary="Download a recording file",
            dependencies=[Depends(check_token)], response_class=FileResponse)
async def download_recording(name: RecordingName, recs: RecordingsDep) -> FileResponse:
    """The file as it is (one in progress: up to now). A file that is not a sound recording is
    422 saying what is wrong with it."""
    path = await recording_ops.download(recs, name)
    return FileResponse(path, media_type="application/vnd.sqlite3", filename=path.name)


@router.post("/api/recordings/{name}/open", status_code=status.HTTP_201_CREATED,
             summary="Serve a recording as a read-only pool")
async def open_recording(name: RecordingName, recs: RecordingsDep, registry: RegistryDep, hub: HubDep,
                         body: RecordingOpen | None = None) -> dict:
    """The recording becomes a pool (default name `rec-<name>`) whose map, stats and events are
    those at its last event; `at_seq` and /history reach any point of it. Anything that would
    change it is 409. A file the server did not write (or that changed since) is checked whole
    first, as an upload is: one that is not a sound recording is 422 saying what is wrong."""
    return await recording_ops.open_as_pool(recs, registry, hub, name, body.pool if body else None)


@router.post(UPLOAD_PATH, status_code=status.HTTP_201_CREATED,
             summary="Upload a recording file and serve it as a read-only pool",
             openapi_extra={"requestBody": {"required": True, "content": {
                 OCTET: {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_recording(request: Request, recs: RecordingsDep, registry: RegistryDep, hub: HubDep,
                           settings: SettingsDep) -> dict:
    """The body is the file's bytes (`Content-Type: application/octet-stream`; the one mutation
    that is not JSON: a file is bytes, and this type is no more CORS-safelisted than JSON, so a
    cross-site form cannot send it either). At most KVSCOPE_MAX_UPLOAD bytes (413 says the cap).
    It must be a pool history recording (`kvscope record`, Record on the page): anything else is
    422 saying what the file is and which command reads it (a KV-event recording: `kvscope
    recording FILE`). Kept in the recordings directory as `upload-<date>-<time>-<random>` (a
    name the server chooses), then opened like POST /api/recordings/{name}/open: the answer
    is the pool it is served as (`rec-upload-...`)."""
    return await recording_ops.upload(recs, registry, hub, request.stream(), settings.max_upload)
