"""EventLog: a bounded ring of what happened in one pool, read by sequence number."""

from __future__ import annotations

from array import array
from collections import deque
from itertools import islice
from time import time as _now

from .vocab import EVENT_FIELDS  # field names of each kind, after the common (seq, ts, type)

# Fields holding block ids. Stored in the cheapest form that packs fast (allocator/history.py
# pickles events; arrays and ranges pickle ~30x slower than bytes): an int for one block, bytes
# of native int32 ids, a list of ints, a range, or (start, stop) for a range once packed.
# `after()` hands out plain lists.
BLOCK_FIELDS = frozenset(("block_ids", "freed_ids"))
NEVER = 1 << 62


def stored_ids(value):
    """Block ids as an event stores them: an array('i') becomes its bytes (ints, lists, ranges
    and None stay)."""
    return value.tobytes() if value.__class__ is array else value


def block_list(value) -> list[int]:
    """A stored block-id field as a plain list of ints (None -> [])."""
    cls = value.__class__
    if value is None:
        return []
    if cls is int:
        return [value]
    if cls is bytes:
        return array("i", value).tolist()
    if cls is tuple:
        return list(range(*value))
    return list(value)


def _plain(kind: str, values: tuple) -> list:
    out = []
    for name, v in zip(EVENT_FIELDS[kind], values):
        if name in BLOCK_FIELDS:
            v = block_list(v)
        elif name == "moves" and v is not None:
            v = [list(m) for m in v]
        out.append(v)
    return out


_PLAIN_KINDS = frozenset(k for k, f in EVENT_FIELDS.items() if BLOCK_FIELDS.intersection(f) or "moves" in f)


def event_dict(row: tuple) -> dict:
    """One stored tuple `(seq, ts, type, *values)` as the dict readers get."""
    kind = row[2]
    event = {"seq": row[0], "ts": row[1], "type": kind}
    event.update(zip(EVENT_FIELDS[kind], _plain(kind, row[3:]) if kind in _PLAIN_KINDS else row[3:]))
    return event


class EventLog:
    """Bounded ring of typed events with a monotonically increasing `seq`.

    Invariant: `seq` of the newest event == `last_seq`; events older than the ring's capacity are
    dropped (readers see a gap in seq, never a reordering). Events are stored as flat tuples
    `(seq, ts, type, *values)`, turned into dicts only when read, since recording sits on every
    allocator hot path.

    NOTE: flat, not `(seq, ts, type, values)`: a tuple of atomic values is untracked by the
    cyclic GC at its first young-generation pass, while a nested one survives into older
    generations and, 10,000 events at a time, triggers full collections that scan every
    object in the process (torch's included), which once cost more than the allocator itself.
    """

    __slots__ = ("_ring", "_append", "last_seq", "capacity", "spill_at", "sink")

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._ring: deque[tuple] = deque(maxlen=capacity)
        self._append = self._ring.append
        self.last_seq = 0
        # A history (`sink`) drains the ring before it drops events: writers call
        # `sink.spill()` once `last_seq` reaches `spill_at`, at a point where the pool is
        # consistent (after the event's change is complete).
        self.sink = None
        self.spill_at = NEVER

    def record(self, kind: str, *values: object) -> int:
        """Append one event; `values` follow EVENT_FIELDS[kind]. Returns its seq."""
        self.last_seq = seq = self.last_seq + 1
        self._append((seq, _now(), kind, *values))
        if seq >= self.spill_at:
            self.sink.spill()
        return seq

    def reserve(self, n: int) -> None:
        """Make room for `n` events appended without a spill check (a batch): drain the ring
        into the history first, and widen the ring if the batch alone exceeds it."""
        if self.sink is None or self.last_seq + n < self.spill_at:
            return
        self.sink.spill()
        if n >= self.capacity:
            self.capacity = n + 1
            self._ring = deque(self._ring, maxlen=self.capacity)
            self._append = self._ring.append
            self.sink.spill()

    def raw_after(self, seq: int) -> list[tuple]:
        """The stored tuples with seq > `seq`, oldest first (for the history)."""
        ring = self._ring
        if not ring or ring[-1][0] <= seq:
            return []
        k = ring[-1][0] - seq
        if k >= len(ring):
            return list(ring)
        return list(islice(ring, len(ring) - k, None))

    def truncate(self, seq: int) -> None:
        """Forget events after `seq` (a rolled-back batch that no reader has seen yet)."""
        ring = self._ring
        while ring and ring[-1][0] > seq:
            ring.pop()
        self.last_seq = seq
        if self.sink is not None:
            self.sink.rollback(seq)

    def after(self, seq: int = 0, limit: int = 1000, kinds: set[str] | None = None) -> list[dict]:
        """Events with seq > `seq`, oldest first, at most `limit`."""
        out: list[dict] = []
        ring = self._ring
        if not ring or ring[-1][0] <= seq:
            return out
        start = max(0, len(ring) - (ring[-1][0] - seq))
        for i in range(start, len(ring)):
            row = ring[i]
            kind = row[2]
            if kinds is not None and kind not in kinds:
                continue
            out.append(event_dict(row))
            if len(out) >= limit:
                break
        return out

    def __len__(self) -> int:
        return len(self._ring)
