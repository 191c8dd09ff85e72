"""Recordings: a pool's config, events and keyframes written to a SQLite file as they happen."""

from __future__ import annotations

import json
import pickle
import sqlite3
import time
import zlib
from pathlib import Path

from .errors import Conflict, InvalidRequest
from .history import History, HistoryView, Keyframe, Segment, pool_geometry

FORMAT = "kvscope-recording"
VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keyframes (seq INTEGER PRIMARY KEY, owner_z BLOB NOT NULL,
                                      state_z BLOB NOT NULL, scalars BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS segments (first INTEGER PRIMARY KEY, last INTEGER NOT NULL, blob BLOB NOT NULL);
"""


class Recorder:
    """Appends one pool's history to a SQLite file (WAL journal): the pool's config and
    geometry once, a keyframe of the live map at the start, then, at every `flush()`, the events
    since the last flush as one packed segment plus the history's newer keyframes, in one
    committed transaction. Whoever owns the recorder calls `flush()` at least once a second,
    so a writer killed at any moment loses at most the last second (SQLite's WAL keeps every
    committed transaction across a crash).

    Invariant: rows in `segments` cover start_seq+1..`seq` contiguously; `keyframes` hold one
    at start_seq and the pool history's keyframes taken since.
    """

    def __init__(self, pool, path: str | Path, meta: dict | None = None) -> None:
        if not isinstance(pool.history, History):
            raise Conflict(f"pool {pool.name!r} keeps no live history to record (history_bytes=0, "
                           "or it is a recording itself)")
        self.pool = pool
        self.path = Path(path)
        if self.path.exists():
            raise Conflict(f"recording file {str(self.path)!r} already exists")
        try:
            self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise InvalidRequest(f"cannot create recording {str(self.path)!r}: {exc}") from None
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        self.db.executescript(SCHEMA)
        history = pool.history
        kf = history._snapshot()
        self.start_seq = self.seq = self.kf_seq = kf.seq
        self.started_at = time.time()
        self.events_written = 0
        self.stopped = False
        rows = {"format": FORMAT, "version": VERSION, "pool": pool.name, "config": pool.config(),
                "geometry": pool_geometry(pool), "start_seq": kf.seq, "started_at": self.started_at,
                **(meta or {})}
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v, default=str)) for k, v in rows.items()])
        self._put_keyframe(kf)
        self.db.execute("COMMIT")

    def _put_keyframe(self, kf: Keyframe) -> None:
        r = kf.to_row()
        self.db.execute("INSERT OR REPLACE INTO keyframes VALUES (?, ?, ?, ?)",
                        (r["seq"], r["owner_z"], r["state_z"], r["scalars"]))

    def flush(self) -> int:
        """Write what happened since the last flush, in one transaction; returns the events written."""
        if self.stopped:
            return 0
        history = self.pool.history
        view = history.view()
        if view.first_seq > self.seq:  # the history dropped events never written (tiny budget)
            raise Conflict(f"recording {str(self.path)!r} fell behind the history's memory budget")
        new_kfs = [kf for kf in view.keyframes if kf.seq > self.kf_seq]
        packs: list[Segment] = []
        for seg in view.segments:
            if seg.last <= self.seq:
                continue
            if seg.first > self.seq:
                packs.append(seg)
            else:
                packs.append(Segment.pack([r for r in seg.rows() if r[0] > self.seq]))
        tail = [r for r in view.tail if r[0] > max(self.seq, packs[-1].last if packs else 0)]
        if tail:
            packs.append(Segment.pack(tail))
        if not packs and not new_kfs:
            return 0
        written = 0
        self.db.execute("BEGIN")
        for seg in packs:
            self.db.execute("INSERT INTO segments VALUES (?, ?, ?)", (seg.first, seg.last, seg.blob))
            written += seg.last - seg.first + 1
        for kf in new_kfs:
            self._put_keyframe(kf)
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('last_seq', ?)", (json.dumps(view.last_seq),))
        self.db.execute("COMMIT")
        if packs:
            self.seq = packs[-1].last
        if new_kfs:
            self.kf_seq = new_kfs[-1].seq
        self.events_written += written
        return written

    def stop(self) -> dict:
        """Flush, mark the recording complete and close the file."""
        if not self.stopped:
            self.flush()
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('stopped_at', ?)", (json.dumps(time.time()),))
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.db.close()
            self.stopped = True
        return self.info()

    def info(self) -> dict:
        return {"path": str(self.path), "pool": self.pool.name, "start_seq": self.start_seq,
                "last_seq": self.seq, "events": self.events_written, "started_at": self.started_at,
                "recording": not self.stopped}


# The first bytes of the other kind of kvscope recording, the KV events a mirror received
# (kvevents/recording.py, not importable from allocator/): named so that a user handed the wrong
# file is told which command reads it.
KV_EVENT_RECORDING_MAGIC = b"KVSREC1\n"


def read_recording(path: str | Path) -> tuple[dict, HistoryView]:
    """(meta, view) of a recording file, complete or cut short by a killed writer. Raises
    InvalidRequest when the file is not a kvscope recording."""
    path = Path(path)
    if not path.is_file():
        raise InvalidRequest(f"no recording file at {str(path)!r}")
    with open(path, "rb") as f:
        head = f.read(len(KV_EVENT_RECORDING_MAGIC))
    if head == KV_EVENT_RECORDING_MAGIC:
        raise InvalidRequest(f"{str(path)!r} is a KV-event recording (kvscope mirror --record), not a "
                             "pool history: read it with `kvscope recording FILE`")
    try:
        db = sqlite3.connect(path)  # not mode=ro: a killed writer's WAL may need recovering
        try:
            meta = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}
            kfs = [Keyframe.from_row(*row) for row in
                   db.execute("SELECT seq, owner_z, state_z, scalars FROM keyframes ORDER BY seq")]
            segs = [Segment(first, last, blob) for first, last, blob in
                    db.execute("SELECT first, last, blob FROM segments ORDER BY first")]
        finally:
            db.close()
    except (sqlite3.Error, json.JSONDecodeError, pickle.UnpicklingError) as exc:
        raise InvalidRequest(f"{str(path)!r} is not a kvscope recording: {exc}") from None
    if meta.get("format") != FORMAT or not kfs:
        raise InvalidRequest(f"{str(path)!r} is not a kvscope recording (format {meta.get('format')!r})")
    try:
        # The data is plain (the loader refuses anything else) and consistent: refuse a bad
        # file up front rather than fail a replay later. Compact segments are checked whole
        # (cheap); older row segments the first and the last.
        for i, seg in enumerate(segs):
            if seg.columns() is None and 0 < i < len(segs) - 1:
                continue
            if i in (0, len(segs) - 1):
                seg.rows()
        blocks = meta.get("geometry", {}).get("num_blocks")
        for kf in kfs:
            owner, state = kf.arrays()
            if owner.size != blocks or state.size != blocks:
                raise ValueError(f"keyframe at seq {kf.seq} does not hold {blocks} blocks")
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, zlib.error) as exc:
        raise InvalidRequest(f"{str(path)!r} is not a kvscope recording: {exc}") from None
    last = segs[-1].last if segs else kfs[0].seq
    for a, b in zip(segs, segs[1:]):
        if b.first != a.last + 1:
            raise InvalidRequest(f"recording {str(path)!r} is corrupt: events {a.last + 1}..{b.first - 1} missing")
    view = HistoryView(geometry=meta["geometry"], keyframes=[k for k in kfs if k.seq <= last],
                       segments=segs, tail=[], last_seq=last, dropped_events=0)
    return meta, view




class ReadOnly(Conflict, AttributeError):
    """What a recorded pool answers to anything that would change it (409 over HTTP; also an
    AttributeError, so `hasattr` probes see a missing attribute)."""


class _RecordedStorage:
    __slots__ = ("device",)

    def __init__(self) -> None:
        self.device = "recording"


class RecordedHistory:
    """The `history` of a recorded pool: the file's frozen view."""

    def __init__(self, view: HistoryView, nbytes: int) -> None:
        self._view = view
        self.nbytes = nbytes
        self.max_bytes = nbytes
        self.first_seq = view.first_seq
        self.dropped_events = 0

    def view(self) -> HistoryView:
        return self._view


class RecordedEvents:
    """The newest events of a recording, read like an EventLog (never written)."""

    def __init__(self, rows: list[tuple], last_seq: int) -> None:
        self._rows = rows
        self.last_seq = last_seq
        self.capacity = len(rows)

    def raw_after(self, seq: int) -> list[tuple]:
        return [r for r in self._rows if r[0] > seq]

    def after(self, seq: int = 0, limit: int = 1000, kinds=None, block_ids: bool = True) -> list[dict]:
        from .events import event_dict

        out = []
        for row in self._rows:
            if row[0] > seq and (kinds is None or row[2] in kinds):
                out.append(event_dict(row))
                if len(out) >= limit:
                    break
        return out

    def __len__(self) -> int:
        return len(self._rows)


class RecordedPool:
    """A recording served like a pool, read-only: its block map, numbers and the newest events
    are those at the recording's last event; `history` replays any point of it. Any other
    attribute (allocate, free, reset, defragment, ...) raises ReadOnly."""

    strategy = "recorded"
    cache = None
    model = None

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        from .blockmap import BlockMap

        meta, view = read_recording(path)
        self.path = str(path)
        self.meta = meta
        geo = view.geometry
        self.name = name or meta.get("pool", "recording")
        self.strategy = geo["strategy"]
        self.num_blocks, self.block_bytes = geo["num_blocks"], geo["block_bytes"]
        self.scatter_fails = geo.get("scatter_fails", True)
        self.tokens_per_block = (meta.get("config") or {}).get("tokens_per_block")
        self.storage = _RecordedStorage()
        self.history = RecordedHistory(view, Path(path).stat().st_size)
        rep = view.replay_to(view.last_seq)
        self._final = rep
        self.blockmap = BlockMap(self.num_blocks)
        self.blockmap.owners_np()[:] = rep.owner
        self.blockmap.states_np()[:] = rep.state
        self.events = RecordedEvents(list(view.rows(max(view.first_seq, view.last_seq - 10_000),
                                                    view.last_seq)), view.last_seq)

    def __getattr__(self, name: str):
        raise ReadOnly(f"pool {self.__dict__.get('name', '?')!r} is a recording (read-only): "
                       f"{name!r} is not available")

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def used_blocks(self) -> int:
        return int((self._final.owner >= 0).sum())

    def stats(self) -> dict:
        from .history import stats_of

        return stats_of(self.history.view().geometry, self._final)

    def config(self) -> dict:
        cfg = dict(self.meta.get("config") or {})
        cfg.update(name=self.name, device="recording", recording={
            "path": self.path, "start_seq": self.meta.get("start_seq"), "last_seq": self.events.last_seq,
            "started_at": self.meta.get("started_at"), "complete": "stopped_at" in self.meta})
        return cfg

    def check(self) -> list[str]:
        return []

    def ids(self) -> list[int]:
        return sorted(set(self._final.owner[self._final.owner >= 0].tolist()))

    def __len__(self) -> int:
        return self._final.allocations

    def __contains__(self, aid) -> bool:
        return False


__all__ = ["ReadOnly", "RecordedPool", "Recorder", "read_recording"]
