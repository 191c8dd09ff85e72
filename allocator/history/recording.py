"""Recordings: a pool's config, events and keyframes written to a SQLite file as they happen."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

from ..errors import Conflict, InvalidRequest
from ..pools.blockmap import BlockMap
from ..pools.events import event_dict
from ..vocab import EVENT_FIELDS, FITS, STRATEGIES
from .columns import FIRST_FIELD, KIND, SEQ, TS
from .history import History, pool_geometry
from .keyframes import Keyframe
from .replay import Replayer
from .segments import Segment
from .view import HistoryView, stats_of

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
            raise Conflict(f"pool {pool.name!r} keeps no live history to record (made without one: "
                           "create_pool(..., history=True) or History(pool) keeps one; or it is a "
                           "recording itself)")
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
        self.db.executemany("INSERT INTO meta VALUES (?, ?)",
                            [(k, json.dumps(v, default=str)) for k, v in rows.items()])
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
                packs.append(Segment.pack([r for r in seg.rows() if r[SEQ] > self.seq]))
        tail = [r for r in view.tail if r[SEQ] > max(self.seq, packs[-1].last if packs else 0)]
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


SQLITE_MAGIC = b"SQLite format 3\x00"
# What other files a user may hand over, by their first bytes, to say what was given instead.
OTHER_KINDS = ((b"\x1f\x8b", "gzip data"), (b"PK\x03\x04", "a zip archive"),
               (b"\x80", "a pickle (a PyTorch memory snapshot opens with `python -m torch.cuda._memory_viz`)"))
OPEN_HINT = "pool histories come from `kvscope record` or a pool's Record button and open with `kvscope open FILE`"


def describe_head(head: bytes) -> str:
    """What a file that is not a pool history seems to be, from its first bytes."""
    if not head:
        return "an empty file"
    for magic, what in OTHER_KINDS:
        if head.startswith(magic):
            return what
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON or other text"
    return "neither an SQLite pool history nor a KV-event recording"


def read_recording(path: str | Path, label: str | None = None,
                   max_blocks: int | None = None) -> tuple[dict, HistoryView]:
    """(meta, view) of a recording file, complete or cut short by a killed writer. Raises
    InvalidRequest when the file is not a kvscope recording, saying what it is instead and
    which command reads it. `label` names the file in messages (default: its path);
    `max_blocks` (a file from elsewhere) refuses a larger pool before any keyframe inflates."""
    path = Path(path)
    where = label or repr(str(path))
    try:
        return _read_recording(path, where, max_blocks)
    except InvalidRequest:
        raise
    except Exception as exc:  # whatever else a damaged file breaks in the reading is the file's fault
        raise InvalidRequest(f"{where} is corrupt: it does not read as a recording ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None


def _read_recording(path: Path, where: str, max_blocks: int | None) -> tuple[dict, HistoryView]:
    if not path.is_file():
        raise InvalidRequest(f"{where} is not a file: no recording file there")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise InvalidRequest(f"{where} cannot be read: {exc.strerror or exc}") from None
    if head.startswith(KV_EVENT_RECORDING_MAGIC):
        raise InvalidRequest(f"{where} is a KV-event recording (kvscope mirror --record, .kvevents), "
                             "not a pool history: read it with `kvscope recording FILE`")
    if head != SQLITE_MAGIC and (head or not Path(f"{path}-wal").is_file()):  # (a WAL may hold it all)
        raise InvalidRequest(f"{where} is not a kvscope recording: {describe_head(head)}; {OPEN_HINT}")
    try:
        db = sqlite3.connect(path)  # not mode=ro: a killed writer's WAL may need recovering
        try:
            meta = {k: load_meta(k, v) for k, v in db.execute("SELECT key, value FROM meta")}
            kfs = [Keyframe.from_row(*row) for row in
                   db.execute("SELECT seq, owner_z, state_z, scalars FROM keyframes ORDER BY seq")]
            segs = [Segment(first, last, blob, untrusted=True) for first, last, blob in
                    db.execute("SELECT first, last, blob FROM segments ORDER BY first")]
        finally:
            db.close()
    except (sqlite3.Error, json.JSONDecodeError, pickle.UnpicklingError, TypeError, ValueError,
            EOFError, RecursionError) as exc:
        raise InvalidRequest(f"{where} is an SQLite database but not a kvscope recording ({exc}); "
                             f"{OPEN_HINT}") from None
    if meta.get("format") != FORMAT or not kfs:
        raise InvalidRequest(f"{where} is an SQLite database but not a kvscope recording "
                             f"(format {meta.get('format')!r}); {OPEN_HINT}")
    why = meta_problem(meta) or segments_problem(segs)
    if why:
        raise InvalidRequest(f"{where} is corrupt: {why}")
    try:
        # The data is plain (the loader refuses anything else) and consistent: refuse a bad
        # file up front rather than fail a replay later. Compact segments are checked whole
        # (cheap); older row segments the first and the last.
        for i, seg in enumerate(segs):
            if seg.columns() is None and i in (0, len(segs) - 1):
                seg.rows()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise InvalidRequest(f"{where} is not a kvscope recording: {exc}") from None
    if max_blocks is not None:
        check_geometry(meta, max_blocks, where)
    blocks = meta["geometry"]["num_blocks"]
    for kf in kfs:
        why = kf.size_problem(blocks)
        if why:
            raise InvalidRequest(f"{where} is corrupt: {why}")
    last = segs[-1].last if segs else kfs[0].seq
    for a, b in zip(segs, segs[1:]):
        if b.first != a.last + 1:
            raise InvalidRequest(f"{where} is corrupt: events {a.last + 1}..{b.first - 1} missing")
    if kfs[0].seq > last or (segs and kfs[0].seq < segs[0].first - 1):
        raise InvalidRequest(f"{where} is corrupt: its first keyframe at {kfs[0].seq} is outside "
                             f"its events ..{last}")
    view = HistoryView(geometry=meta["geometry"], keyframes=[k for k in kfs if k.seq <= last],
                       segments=segs, tail=[], last_seq=last, dropped_events=0)
    return meta, view


MAX_META_DEPTH = 32  # nesting of a meta value: what kvscope writes is 4 deep at most


def load_meta(key, value):
    """One meta row's JSON value: text, no NaN or Infinity (no JSON answer could carry it),
    nested at most MAX_META_DEPTH deep (the JSON encoder of every answer recurses). Raises
    ValueError."""
    if not (isinstance(key, str) and isinstance(value, str)):
        raise ValueError(f"meta row {key!r} is not text")
    out = json.loads(value, parse_constant=_no_constant)
    stack = [(out, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_META_DEPTH:
                raise ValueError(f"meta {key!r} is nested more than {MAX_META_DEPTH} deep")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


# What each meta value kvscope writes must be, when present (None: absent is allowed).
META_TYPES = {"pool": str, "config": dict, "geometry": dict, "start_seq": int,
              "started_at": (int, float), "stopped_at": (int, float), "last_seq": int}


def meta_problem(meta: dict) -> str | None:
    """What is wrong with a recording's meta values, or None."""
    for key, kind in META_TYPES.items():
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            return f"meta {key!r} is {meta[key]!r}"
    return geometry_problem(meta.get("geometry"))


def _is_int(v, low: int = 0) -> bool:
    return v.__class__ is int and v >= low


def geometry_problem(geo) -> str | None:
    """What a recorded pool's geometry (`pool_geometry`) lacks or gets wrong, or None: every
    field replay and stats read, of the type the writer writes, tiers inside the map."""
    if not isinstance(geo, dict):
        return f"its geometry {geo!r} is not a geometry"
    if geo.get("strategy") not in STRATEGIES:
        return f"its geometry names no known strategy ({geo.get('strategy')!r})"
    if not (_is_int(geo.get("num_blocks"), 1) and _is_int(geo.get("block_bytes"), 1)):
        return f"its geometry {geo!r} names no block count and block size"
    if geo.get("scatter_fails").__class__ is not bool:
        return "its geometry lacks scatter_fails (true or false)"
    if geo["strategy"] == "contiguous" and geo.get("fit") not in FITS:
        return f"its contiguous geometry names no fit of {FITS} ({geo.get('fit')!r})"
    prefix = geo.get("prefix_caching")
    if prefix is not None and not (isinstance(prefix, dict) and isinstance(prefix.get("policy"), str)
                                   and prefix.get("kv_cache").__class__ is bool):
        return f"its geometry's prefix_caching {prefix!r} is not {{policy, kv_cache}}"
    if geo["strategy"] == "tiered":
        return tiers_problem(geo.get("tiers"), geo["num_blocks"])
    return None


def tiers_problem(tiers, num_blocks: int) -> str | None:
    if not (isinstance(tiers, list) and tiers):
        return "its tiered geometry lacks its tiers"
    for t in tiers:
        if not (isinstance(t, dict) and isinstance(t.get("name"), str) and _is_int(t.get("units"), 1)
                and _is_int(t.get("start")) and _is_int(t.get("count"))
                and t["start"] + t["count"] * t["units"] <= num_blocks):
            return f"its tier {t!r} is not {{name, units, start, count}} inside {num_blocks} blocks"
    return None


def segments_problem(segs: list[Segment]) -> str | None:
    for seg in segs:
        if not (_is_int(seg.first) and _is_int(seg.last) and seg.first <= seg.last
                and isinstance(seg.blob, bytes)):
            return f"segment {seg.first!r}..{seg.last!r} is not events first..last as bytes"
    return None


def check_untrusted(meta: dict, view: HistoryView, max_blocks: int, where: str) -> None:
    """Bounds a recording from elsewhere (an upload) must keep before anything is allocated
    for it: a known strategy, at most `max_blocks` blocks, keyframes that inflate to exactly
    the map's size (a zlib bomb stops at one byte more). Raises InvalidRequest."""
    n = check_geometry(meta, max_blocks, where)
    for kf in view.keyframes:
        why = kf.size_problem(n)
        if why:
            raise InvalidRequest(f"{where} is corrupt: {why}")


def check_geometry(meta: dict, max_blocks: int, where: str) -> int:
    """The recorded pool's block count, when its geometry is one kvscope makes and at most
    `max_blocks` blocks. Raises InvalidRequest."""
    geo = meta.get("geometry")
    n = geo.get("num_blocks") if isinstance(geo, dict) else None
    if not (isinstance(n, int) and 0 < n <= max_blocks and isinstance(geo.get("block_bytes"), int)
            and geo["block_bytes"] > 0 and geo.get("strategy") in ("paged", "contiguous", "tiered")):
        raise InvalidRequest(f"{where} is corrupt or too large: geometry {geo!r} (at most "
                             f"{max_blocks} blocks of a paged, contiguous or tiered pool)")
    return n


CHECK_CHUNK = 65_536  # events replayed at once while checking (bounds the gathered writes)


def check_rows(view: HistoryView, each=None) -> None:
    """Every stored event of a recording from elsewhere, once, in order: seqs contiguous from
    the first keyframe, known kinds of at most their fields' length, and the whole history
    replayed from the first keyframe (what any `at_seq` later replays, it replays here first).
    `each(row)`: the caller's own check of a row. Raises whatever a bad row raises."""
    rep = Replayer(view.keyframes[0])
    expected = view.first_seq + 1
    chunk: list = []
    for row in view.rows(view.first_seq, view.last_seq):
        if row[SEQ] != expected:
            raise ValueError(f"event seq {row[SEQ]!r} where {expected} was due")
        fields = EVENT_FIELDS.get(row[KIND]) if isinstance(row[KIND], str) else None
        if fields is None or len(row) > FIRST_FIELD + len(fields) or not isinstance(row[TS], (int, float)):
            raise ValueError(f"event {expected} is not a known kind of event: {tuple(row[:FIRST_FIELD])!r}")
        if each is not None:
            each(row)
        expected += 1
        chunk.append(row)
        if len(chunk) >= CHECK_CHUNK:
            rep.apply_rows(chunk)
            chunk = []
    rep.apply_rows(chunk)
    if expected != view.last_seq + 1:
        raise ValueError(f"events end at {expected - 1}, not at {view.last_seq}")


def open_untrusted(path: str | Path, name: str, max_blocks: int, label: str, each=None) -> RecordedPool:
    """A RecordedPool of a file from elsewhere, refused with InvalidRequest (never another
    exception) when it is not a sound kvscope recording: `check_untrusted`, then every event
    checked and replayed (`check_rows`, with the caller's `each(row)`), then the pool's config
    and stats at its end built once (what serving it answers first). Blocking: O(events)."""
    try:
        meta, view = read_recording(path, label, max_blocks)
        check_untrusted(meta, view, max_blocks, label)
        check_rows(view, each)
        pool = RecordedPool(path, name, preread=(meta, view))
        pool.config(), pool.stats()
        return pool
    except InvalidRequest:
        raise
    except Exception as exc:  # whatever a crafted file breaks in the reading is the file's fault
        raise corrupt(label, exc) from None


def file_stamp(path: str | Path) -> tuple[int, int, int, int] | None:
    """What changes when a file is written to, cut short, copied over or replaced: (device,
    inode, size, mtime in ns); None when there is no file to read there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Verdict(NamedTuple):
    """What checking a recording file found: the file's stamp then, and why it is not sound
    (None: sound)."""

    stamp: tuple | None
    problem: str | None


class Verdicts:
    """What checking each recording file found, kept while the file is unchanged (`file_stamp`):
    a file this process wrote (`trust`) or checked whole once is not checked again, and a file
    found damaged is refused again without reading it, until it changes. A file put in the
    directory by hand, or changed since, is checked whole (`open_untrusted`) when first opened.

    Invariant: `_seen[path]` is the Verdict on the file as it was when judged.
    """

    def __init__(self) -> None:
        self._seen: dict[str, Verdict] = {}

    def trust(self, path: str | Path) -> None:
        """`path` as this process wrote it (a stopped recorder's file, a checked upload)."""
        self._seen[str(path)] = Verdict(file_stamp(path), None)

    def sound(self, path: str | Path) -> bool:
        """Whether `path`, unchanged since it was judged, was judged a sound recording."""
        seen = self._seen.get(str(path))
        return (seen is not None and seen.problem is None and seen.stamp is not None
                and seen.stamp == file_stamp(path))

    def problem(self, path: str | Path) -> str | None:
        """Why `path`, unchanged since it was judged, is not a sound recording; None when it is
        or when it was not judged as it is now."""
        seen = self._seen.get(str(path))
        return seen.problem if seen is not None and seen.stamp == file_stamp(path) else None

    def open(self, path: str | Path, name: str, max_blocks: int, label: str, each=None,
             served=None) -> RecordedPool:
        """`path` as a RecordedPool named `name`: read as it is when judged sound while
        unchanged, otherwise checked whole first (`open_untrusted` with `each(row)`, then
        `served(pool)`, the caller's check of what serving it answers), and the verdict kept.
        `label` names the file in messages. Raises InvalidRequest (never another exception).
        Blocking: O(events) the first time."""
        key = str(path)
        why = self.problem(path)
        if why is not None:
            raise InvalidRequest(why)
        if self.sound(path):
            try:
                return RecordedPool(path, name, preread=read_recording(path, label))
            except InvalidRequest:
                raise
            except Exception as exc:  # judged sound, yet it breaks: the file's fault all the same
                raise corrupt(label, exc) from None
        try:
            pool = open_untrusted(path, name, max_blocks, label, each)
            if served is not None:
                served(pool)
        except InvalidRequest as exc:
            self._seen[key] = Verdict(file_stamp(path), str(exc))
            raise
        self._seen[key] = Verdict(file_stamp(path), None)  # (after reading: opening may recover a WAL)
        return pool


def corrupt(label: str, exc: BaseException) -> InvalidRequest:
    """The 422 for what a damaged recording broke while it was read or replayed."""
    return InvalidRequest(f"{label} is corrupt: its events do not replay ({type(exc).__name__}: "
                          f"{str(exc)[:200]})")


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
        return [r for r in self._rows if r[SEQ] > seq]

    def after(self, seq: int = 0, limit: int = 1000, kinds=None, block_ids: bool = True) -> list[dict]:
        out = []
        for row in self._rows:
            if row[SEQ] > seq and (kinds is None or row[KIND] in kinds):
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

    def __init__(self, path: str | Path, name: str | None = None,
                 preread: tuple[dict, HistoryView] | None = None) -> None:
        meta, view = preread or read_recording(path)
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

    def damaged(self, exc: BaseException) -> InvalidRequest:
        """The 422 for `exc`, raised while reading or replaying this recording's data (a file
        changed or damaged in a way the checks on opening it did not catch)."""
        return corrupt(f"recording {Path(self.path).stem!r}", exc)

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


__all__ = ["ReadOnly", "RecordedPool", "Recorder", "Verdicts", "file_stamp", "open_untrusted", "read_recording"]
