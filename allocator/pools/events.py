"""EventLog: a bounded ring of what happened in one pool, read by sequence number."""

from __future__ import annotations

from array import array

import numpy as np

from .._core import EventRing
from ..vocab import EVENT_FIELDS  # field names of each kind, after the common (seq, ts, type)

# Fields holding block ids. Stored in the cheapest form that packs fast
# (allocator/history/ pickles events; arrays and ranges pickle far slower than bytes):
# an int for one block, bytes of native int32 ids, a list of ints, a range, or (start, stop) for
# a range once packed.
# `after()` hands out plain lists.
BLOCK_FIELDS = frozenset(("block_ids", "freed_ids", "shared_ids", "cached_ids", "used_ids"))
# A prefix-caching pool's core records the id, hash and token runs of its prefix events as native
# bytes (array typecodes here: int32 block ids, uint64 hashes, int64 token ids), which it builds
# from C and the history packs much faster than lists; a mirror's are lists. Readers get lists.
PACKED_FIELDS = {"blocks": "i", "block_hashes": "Q", "token_ids": "q"}
PACKED_KINDS = frozenset(("stored", "removed", "cleared", "open", "append", "close"))
NEVER = 1 << 62


def stored_ids(value):
    """Block ids as an event stores them: an array('i') or a numpy array becomes native int32
    bytes (ints, lists, ranges and None stay)."""
    if value.__class__ is array:
        return value.tobytes()
    if isinstance(value, np.ndarray):
        return value.astype(np.int32, copy=False).tobytes()
    return value


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
    return [int(b) for b in value]


def packed_list(value, typecode: str = "i"):
    """A packed field (`PACKED_FIELDS`) as a list when it is bytes; any other value as it is."""
    if value.__class__ is bytes:
        return array(typecode, value).tolist()
    return value


def _plain(kind: str, values: tuple) -> list:
    out = []
    packed = kind in PACKED_KINDS
    for name, v in zip(EVENT_FIELDS[kind], values):
        if name in BLOCK_FIELDS:
            v = block_list(v)
        elif packed and name in PACKED_FIELDS:
            v = packed_list(v, PACKED_FIELDS[name])
        elif name == "moves" and v is not None:
            v = [list(m) for m in v]
        out.append(v)
    return out


_PLAIN_KINDS = frozenset(k for k, f in EVENT_FIELDS.items()
                         if BLOCK_FIELDS.intersection(f) or "moves" in f) | PACKED_KINDS


def event_dict(row: tuple) -> dict:
    """One stored tuple `(seq, ts, type, *values)` as the dict readers get."""
    kind = row[2]
    event = {"seq": row[0], "ts": row[1], "type": kind}
    event.update(zip(EVENT_FIELDS[kind], _plain(kind, row[3:]) if kind in _PLAIN_KINDS else row[3:]))
    return event


class EventLog(EventRing):
    """Bounded ring of typed events with a monotonically increasing `seq` (compiled: see
    `allocator/_events.pxi` for the layout and invariants).

    Invariant: `seq` of the newest event == `last_seq`; events older than the ring's capacity are
    dropped (readers see a gap in seq, never a reordering) unless a history (`sink`,
    allocator/history/history.py) drained them first. `record(kind, *values)` takes the kind's
    EVENT_FIELDS in order; `after()` turns events into dicts only when someone reads them.
    The compiled pool records its numeric events (allocate, free) without any Python object.
    """

    __slots__ = ()

    def __init__(self, capacity: int = 10_000) -> None:
        pass  # EventRing.__cinit__ took the capacity; the kinds are EVENT_FIELDS'

    def __new__(cls, capacity: int = 10_000):
        return EventRing.__new__(cls, capacity, EVENT_FIELDS)

    def after(self, seq: int = 0, limit: int = 1000, kinds=None, block_ids: bool = True) -> list[dict]:
        """Events with seq > `seq`, oldest first, at most `limit`, as dicts {"seq", "ts",
        "type", *fields}; kinds that change the map carry their `block_ids` (a list) whatever
        `block_ids` says (kept for callers that ask for them)."""
        out = []
        for row in self.raw_after(seq):
            if kinds is not None and row[2] not in kinds:
                continue
            out.append(event_dict(row))
            if len(out) >= limit:
                break
        return out
