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
from allocator.history.recording import (
    RecordedPool,
    Recorder,
    Verdicts,
    corrupt,
    file_stamp,
    open_untrusted,
    read_recording,
)
from allocator.pools.events import event_dict

FLUSH_S = 0.5  # at most this much (plus one flush's time) is lost when the server is killed
SUFFIX = ".kvrec"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"


STALE_PART_S = 3600.0  # an upload part file untouched this long belongs to a killed server


class Recordings:
    """At most one recorder per pool, each flushed every FLUSH_S by one task; files live in
    `directory` (KVSCOPE_RECORDINGS_DIR) and are named `<name>.kvrec`. A recorder stops when
    asked, when its pool is deleted, or when the server shuts down.

    Any file in the directory may have been put there by hand (a copy cut short, a file of
    another kind, one damaged since): opening or downloading a file this process did not write,
    or that changed since, checks it whole first, as an upload is (`verdicts`); a bad one is a
    422 naming it and what is wrong, and the listing shows it with its `error`."""

    def __init__(self, directory: str | Path, registry, max_blocks: int = 1 << 24) -> None:
        self.directory = Path(directory)
        self.registry = registry
        self.max_blocks = max_blocks  # a file from elsewhere is refused past this many blocks
        self.verdicts = Verdicts()
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
        out = recorder.stop() | {"name": recorder.path.stem}
        self.verdicts.trust(recorder.path)
        return out

    def flush_all(self, only: Path | None = None) -> None:
        """Flush every recorder (or only the one writing `only`); one that fails (a full disk)
        stops, with why in `failed`. On the event loop: never from two threads at once."""
        for pool, (recorder, handle) in list(self.active.items()):
            if only is not None and recorder.path.resolve() != only.resolve():
                continue
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
        """Every `*.kvrec` in the directory; one that is not a sound recording (as far as
        reading it, or checking it whole when it was opened, found) is listed with `error`
        saying why. Blocking: reads every file."""
        out = []
        recording = {r.path.resolve() for r, _ in tuple(self.active.values())}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")) if self.directory.is_dir() else ():
            stamp = file_stamp(path)
            item = {"name": path.stem, "bytes": stamp[2] if stamp else None,
                    "recording": path.resolve() in recording}
            try:
                why = self.verdicts.problem(path)
                if why is not None:
                    raise InvalidRequest(why)
                meta, view = read_recording(path, label(path.stem))
                item.update(pool=meta.get("pool"), strategy=view.geometry["strategy"],
                            start_seq=view.first_seq, last_seq=view.last_seq,
                            started_at=meta.get("started_at"), complete="stopped_at" in meta)
            except InvalidRequest as exc:
                item["error"] = str(exc)
            out.append(item)
        return out

    def open(self, name: str, as_name: str | None = None) -> RecordedPool:
        """The recording `name` served read-only (pool `as_name`, default rec-<name>): a file
        this process is recording, or wrote, or checked unchanged, is read as it is; any other
        is checked whole first. Raises NotFound, InvalidRequest (saying what is wrong with the
        file). Blocking: run it off the event loop."""
        path = self.existing(name)
        as_name = as_name or pool_name_for(path.stem)
        if self.recorder_of(path) is None:
            return self.verdicts.open(path, as_name, self.max_blocks, label(path.stem), each=servable,
                                      served=answers_as_json)
        try:  # being written by this process: whole so far, nothing to check
            return RecordedPool(path, as_name, preread=read_recording(path, label(path.stem)))
        except InvalidRequest:
            raise
        except Exception as exc:
            raise corrupt(label(path.stem), exc) from None

    def download(self, name: str) -> Path:
        """The file of recording `name` once it is known to be a sound recording (checked whole
        as `open` does unless this process wrote it or is writing it). Raises NotFound,
        InvalidRequest. Blocking: run it off the event loop (then `flush_all(only=it)`)."""
        path = self.existing(name)
        if self.recorder_of(path) is None and not self.verdicts.sound(path):
            self.verdicts.open(path, pool_name_for(path.stem), self.max_blocks, label(path.stem),
                               each=servable, served=answers_as_json)
        return path


    def existing(self, name: str) -> Path:
        path = self.file_of(name)
        if not path.is_file():
            raise NotFound("recording", name)
        return path

    def recorder_of(self, path: Path) -> Recorder | None:
        """The recorder of this process writing `path`, if any."""
        for recorder, _ in tuple(self.active.values()):
            if recorder.path.resolve() == path.resolve():
                return recorder
        return None

    def incoming(self) -> Path:
        """A fresh hidden file in the directory for an upload's bytes (not listed: no suffix)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / f".upload-{secrets.token_hex(8)}.part"

    def accept_upload(self, part: Path) -> RecordedPool:
        """Check an uploaded file (`incoming()`) as a recording from elsewhere and keep it as
        `upload-<date>-<time>-<random>.kvrec`: the name is the server's, never the client's.
        Returns it opened read-only (pool `rec-<name>`). Raises InvalidRequest (the file is
        not kept then). Blocking: run it off the event loop."""
        name = f"upload-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        pool = open_untrusted(part, pool_name_for(name), self.max_blocks, "the uploaded file", each=servable)
        answers_as_json(pool, "the uploaded file")
        final = self.file_of(name)
        os.link(part, final)  # fails rather than replace an existing file
        pool.path = str(final)
        self.verdicts.trust(final)
        return pool


def label(stem: str) -> str:
    """How messages name the recording file `<stem>.kvrec` (never by the server's path)."""
    return f"recording {stem!r}"


def answers_as_json(pool: RecordedPool, where: str | None = None) -> None:
    """Raises InvalidRequest unless what GET /api/pools/{it} answers is JSON with no NaN (a
    crafted config or count breaks it)."""
    try:
        json.dumps(jsonable_encoder({"config": pool.config(), "stats": pool.stats()}), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        where = where or label(Path(pool.path).stem)
        raise InvalidRequest(f"{where} is corrupt: its pool does not answer as JSON ({exc})") from None


def servable(row: tuple) -> None:
    """Raises unless the event answers over REST as every route would send it (JSON, no NaN)."""
    json.dumps(jsonable_encoder(event_dict(row)), allow_nan=False)


def pool_name_for(stem: str) -> str:
    """A valid pool name for an opened recording: `rec-` + its name, lowercased, at most 64."""
    return ("rec-" + re.sub(r"[^a-z0-9_-]", "-", stem.lower()))[:64]
