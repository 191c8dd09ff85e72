"""Recordings of a server: which pools are being recorded, the flush task, the files on disk."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sqlite3
import time
from pathlib import Path

from fastapi.encoders import jsonable_encoder

from allocator.errors import Conflict, InvalidRequest, KVScopeError, NotFound
from allocator.events import event_dict
from allocator.recording import RecordedPool, Recorder, open_untrusted, read_recording

FLUSH_S = 0.5  # at most this much (plus one flush's time) is lost when the server is killed
SUFFIX = ".kvrec"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"


STALE_PART_S = 3600.0  # an upload part file untouched this long belongs to a killed server


class Recordings:
    """At most one recorder per pool, each flushed every FLUSH_S by one task; files live in
    `directory` (KVSCOPE_RECORDINGS_DIR) and are named `<name>.kvrec`. A recorder stops when
    asked, when its pool is deleted, or when the server shuts down."""

    def __init__(self, directory: str | Path, registry) -> None:
        self.directory = Path(directory)
        self.registry = registry
        self.active: dict[str, tuple[Recorder, object]] = {}  # pool name -> (recorder, handle)
        self.failed: dict[str, str] = {}  # pool name -> why its last recording stopped on its own
        self._task: asyncio.Task | None = None
        self.sweep_parts()

    def sweep_parts(self, older_than_s: float = STALE_PART_S) -> int:
        """Delete upload part files (`incoming()`) a killed server left behind: those untouched
        for `older_than_s` (a live upload writes its part at least every few seconds, so
        another server sharing the directory keeps its own). Returns how many went."""
        gone = 0
        cutoff = time.time() - older_than_s
        for part in self.directory.glob(".upload-*.part*"):
            try:
                if part.stat().st_mtime < cutoff:
                    part.unlink()
                    gone += 1
            except OSError:
                pass  # raced with its owner, or not ours to delete: leave it
        return gone

    def file_of(self, name: str) -> Path:
        name = name.removesuffix(SUFFIX)
        if not re.fullmatch(NAME_PATTERN, name):
            raise InvalidRequest(f"recording name {name!r} must match {NAME_PATTERN}")
        return self.directory / f"{name}{SUFFIX}"

    def start(self, handle, name: str | None = None) -> dict:
        if handle.name in self.active:
            raise Conflict(f"pool {handle.name!r} is already being recorded; stop it first")
        name = name or f"{handle.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path = self.file_of(name)
        self.directory.mkdir(parents=True, exist_ok=True)
        recorder = Recorder(handle.pool, path)
        self.active[handle.name] = (recorder, handle)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())
        return recorder.info() | {"name": path.stem}

    def stop(self, pool: str) -> dict:
        try:
            recorder, _ = self.active.pop(pool)
        except KeyError:
            raise NotFound("recording of pool", pool) from None
        return recorder.stop() | {"name": recorder.path.stem}

    def flush_all(self) -> None:
        for pool, (recorder, handle) in list(self.active.items()):
            if self.registry.find(pool) is not handle:  # the pool was deleted
                self.stop(pool)
                continue
            try:
                recorder.flush()
            except (sqlite3.Error, OSError, KVScopeError) as exc:
                # a full disk or a history that outran the file: stop this one, keep the others
                self.failed[pool] = f"recording {recorder.path.stem!r} stopped: {exc}"
                self.active.pop(pool, None)
                try:
                    recorder.stop()
                except (sqlite3.Error, OSError, KVScopeError):
                    pass

    async def _flush_loop(self) -> None:
        while self.active:
            await asyncio.sleep(FLUSH_S)
            self.flush_all()

    def stop_all(self) -> None:
        for pool in list(self.active):
            self.stop(pool)

    def listing(self) -> list[dict]:
        out = []
        recording = {r.path.resolve(): r for r, _ in self.active.values()}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")) if self.directory.is_dir() else ():
            item = {"name": path.stem, "bytes": path.stat().st_size, "recording": path.resolve() in recording}
            try:
                meta, view = read_recording(path)
                item.update(pool=meta.get("pool"), strategy=view.geometry["strategy"],
                            start_seq=view.first_seq, last_seq=view.last_seq,
                            started_at=meta.get("started_at"), complete="stopped_at" in meta)
            except InvalidRequest as exc:
                item["error"] = str(exc)
            out.append(item)
        return out

    def open(self, name: str, as_name: str | None = None) -> RecordedPool:
        path = self.file_of(name)
        if not path.is_file():
            raise NotFound("recording", name)
        return RecordedPool(path, as_name or pool_name_for(path.stem))

    def incoming(self) -> Path:
        """A fresh hidden file in the directory for an upload's bytes (not listed: no suffix)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / f".upload-{secrets.token_hex(8)}.part"

    def accept_upload(self, part: Path, max_blocks: int) -> RecordedPool:
        """Check an uploaded file (`incoming()`) as a recording from elsewhere and keep it as
        `upload-<date>-<time>-<random>.kvrec`: the name is the server's, never the client's.
        Returns it opened read-only (pool `rec-<name>`). Raises InvalidRequest (the file is
        not kept then). Blocking: run it off the event loop."""
        name = f"upload-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        pool = open_untrusted(part, pool_name_for(name), max_blocks, "the uploaded file", each=servable)
        try:  # what GET /api/pools/{it} answers: JSON, no NaN (a crafted config or count breaks it)
            json.dumps(jsonable_encoder({"config": pool.config(), "stats": pool.stats()}), allow_nan=False)
        except (ValueError, TypeError, RecursionError) as exc:
            raise InvalidRequest(f"the uploaded file is corrupt: its pool does not answer as JSON ({exc})") from None
        final = self.file_of(name)
        os.link(part, final)  # fails rather than replace an existing file
        pool.path = str(final)
        return pool


def servable(row: tuple) -> None:
    """Raises unless the event answers over REST as every route would send it (JSON, no NaN)."""
    json.dumps(jsonable_encoder(event_dict(row)), allow_nan=False)


def pool_name_for(stem: str) -> str:
    """A valid pool name for an opened recording: `rec-` + its name, lowercased, at most 64."""
    return ("rec-" + re.sub(r"[^a-z0-9_-]", "-", stem.lower()))[:64]
