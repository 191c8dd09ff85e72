"""EventLog: a bounded ring of what happened in one pool, read by sequence number."""

from __future__ import annotations

from ._core import EventRing
from .vocab import EVENT_FIELDS  # field names of each kind, after the common (seq, ts, type)


class EventLog(EventRing):
    """Bounded ring of typed events with a monotonically increasing `seq` (compiled: see
    `allocator/_events.pxi` for the layout and invariants).

    Invariant: `seq` of the newest event == `last_seq`; events older than the ring's capacity are
    dropped (readers see a gap in seq, never a reordering). `record(kind, *values)` takes the
    kind's EVENT_FIELDS in order; `after()` turns events into dicts only when someone reads them.
    The compiled pool records its numeric events (allocate, free) without any Python object.
    """

    __slots__ = ()

    def __init__(self, capacity: int = 10_000) -> None:
        pass  # EventRing.__cinit__ took the capacity; the kinds are EVENT_FIELDS'

    def __new__(cls, capacity: int = 10_000):
        return EventRing.__new__(cls, capacity, EVENT_FIELDS)
