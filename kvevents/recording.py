"""Recordings: what a subscriber received, to a file, and back into a mirror later.

A recording is the magic `KVSREC1\n` then length-prefixed records (u32 big-endian length, then
msgpack): a header `{"kvscope_recording": 1, "endpoint": ..., "topic": ..., "started": ts}`, then
`[recv_ts, seq, topic, payload]` per batch the subscriber applied, in seq order (payload: the raw
bytes as received, so a recording keeps even what kvscope could not decode).

Files are named `*.kvevents` (SUFFIX); the SQLite pool history recordings of `kvscope record`
are `*.kvrec`. A reader goes by the first bytes, never by the name, so KV-event recordings made
before the two suffixes were told apart (named `.kvrec`) still read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgspec

from .codec import Cleared, WireError, decode_batch

FORMAT = 1
MAGIC = b"KVSREC1\n"
SUFFIX = ".kvevents"
HISTORY_SUFFIX = ".kvrec"  # a pool history recording (allocator/recording.py), not this kind
# A pool history recording (allocator/recording.py) is an SQLite file: told apart by its header.
SQLITE_MAGIC = b"SQLite format 3\x00"


class Recorder:
    """Appends records to `path` (thread-safe; flushed every record so a crash loses nothing)."""

    def __init__(self, path: str, endpoint: str = "", topic: str = "") -> None:
        self.path = path
        self._f = open(path, "wb")  # noqa: SIM115 (lives as long as the recorder)
        self._f.write(MAGIC)
        self._enc = msgspec.msgpack.Encoder()
        self._lock = threading.Lock()
        self.records = 0
        self._write({"kvscope_recording": FORMAT, "endpoint": endpoint, "topic": topic,
                     "started": time.time()})

    def _write(self, obj) -> None:
        body = self._enc.encode(obj)
        with self._lock:
            self._f.write(len(body).to_bytes(4, "big") + body)
            self._f.flush()

    def write(self, recv_ts: float, seq: int, topic: bytes, payload: bytes) -> None:
        self._write([recv_ts, seq, bytes(topic), bytes(payload)])
        self.records += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read(path: str) -> Iterator[tuple[float, int, bytes]]:
    """(recv_ts, seq, payload) of every record. Raises WireError on a file that is not a
    recording; a record cut short at the end (a crash while writing) ends the reading."""
    for ts, seq, _topic, payload in read_records(path):
        yield ts, seq, payload


def read_records(path: str) -> Iterator[tuple[float, int, bytes, bytes]]:
    """(recv_ts, seq, topic, payload) of every record (a fleet recording's topic names the
    engine). Raises WireError as `read` does."""
    dec = msgspec.msgpack.Decoder()
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
        if head != MAGIC:
            if head == SQLITE_MAGIC[:len(MAGIC)]:
                raise WireError("malformed", f"{path} is a pool history recording (kvscope record), "
                                "not KV events: open it with `kvscope open FILE`")
            raise WireError("malformed", f"{path} is not a kvscope recording")
        first = True
        while True:
            head = f.read(4)
            if len(head) < 4:
                return
            body = f.read(int.from_bytes(head, "big"))
            try:
                obj = dec.decode(body)
            except msgspec.DecodeError:
                return
            if first:
                first = False
                if not (isinstance(obj, dict) and obj.get("kvscope_recording") == FORMAT):
                    raise WireError("malformed", f"{path}: unknown recording header")
                continue
            if not (isinstance(obj, list) and len(obj) == 4 and isinstance(obj[3], bytes)):
                raise WireError("malformed", f"{path}: a record is not [ts, seq, topic, payload]")
            yield float(obj[0]), int(obj[1]), obj[2] if isinstance(obj[2], bytes) else b"", obj[3]


def replay_into(path: str, pool, speed: float | None = None, apply=None, stop=None,
                progress: dict | None = None) -> dict:
    """Apply a recording's batches to a mirror pool in seq order (a seq going back is an engine
    restart and clears the mirror, as live). `speed`: None = as fast as possible, else that many
    times real time. `apply(change)` runs each change (default: at once); `stop` (an Event) ends
    early. Returns (and keeps updating `progress` with) counts: batches, events, errors, gaps,
    restarts."""
    out = progress if progress is not None else {}
    out.update({"batches": 0, "events": 0, "errors": 0, "gaps": 0, "restarts": 0})
    run = apply or (lambda change: change())
    last = t0 = None
    start = time.monotonic()
    for ts, seq, payload in read(path):
        if stop is not None and stop.is_set():
            break
        if speed:
            t0 = ts if t0 is None else t0
            wait = (ts - t0) / speed - (time.monotonic() - start)
            if wait > 0 and (stop.wait(wait) if stop is not None else time.sleep(wait)):
                break
        if last is not None and seq == last:
            continue  # the same batch twice (a recording made by another tool)
        if last is not None and seq < last:
            out["restarts"] += 1
            run(lambda: pool.apply([Cleared()]))
        elif last is not None and seq > last + 1:
            out["gaps"] += 1
        last = seq
        try:
            batch = decode_batch(payload)
        except WireError:
            out["errors"] += 1
            continue
        run(lambda events=batch.events: pool.apply(events))
        out["batches"] += 1
        out["events"] += len(batch.events)
    return out
