"""EventLog: a bounded ring of what happened in one pool, read by sequence number."""

from __future__ import annotations

from collections import deque
from time import time as _now

from .vocab import EVENT_FIELDS  # field names of each kind, after the common (seq, ts, type)


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

    __slots__ = ("_ring", "_append", "last_seq")

    def __init__(self, capacity: int = 10_000) -> None:
        self._ring: deque[tuple] = deque(maxlen=capacity)
        self._append = self._ring.append
        self.last_seq = 0

    def record(self, kind: str, *values: object) -> int:
        """Append one event; `values` follow EVENT_FIELDS[kind]. Returns its seq."""
        self.last_seq = seq = self.last_seq + 1
        self._append((seq, _now(), kind, *values))
        return seq

    def truncate(self, seq: int) -> None:
        """Forget events after `seq` (a rolled-back batch that no reader has seen yet)."""
        ring = self._ring
        while ring and ring[-1][0] > seq:
            ring.pop()
        self.last_seq = seq

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
            event = {"seq": row[0], "ts": row[1], "type": kind}
            event.update(zip(EVENT_FIELDS[kind], row[3:]))
            out.append(event)
            if len(out) >= limit:
                break
        return out

    def __len__(self) -> int:
        return len(self._ring)
