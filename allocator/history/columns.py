"""The stored forms of a pool's events, named: the compact columns a segment keeps
(`EventColumns`, "cols2"), the columns of recordings made before them (`OldColumns`, "cols1"),
the flat rows both decode to, and the figures a keyframe stores."""

from __future__ import annotations

import pickle
from collections import namedtuple
from typing import NamedTuple

import numpy as np

from ..vocab import EVENT_FIELDS, EVICTION_REASONS

COLUMNS2 = "cols2"  # the format tag of EventRing.export()'s columns
COLUMNS1 = "cols1"  # the format tag of the older columns (recordings of an earlier build)
NVALS = 6  # int64 values per compiled event (allocator/_events.pxi)
FLAG_OBJ = 0x80  # kind byte: a Python-recorded event (its values are a tuple in `objs`)
FLAG_KEY = 0x40  # kind byte: a keyed event (its key in `keys`, its values in `wide`)
CODE_MASK = 0x3F  # kind byte: the kind's code (an index into `names`)

# A stored row is (seq, ts, kind, *EVENT_FIELDS[kind]), as EventRing.raw_after() gives it.
SEQ, TS, KIND, FIRST_FIELD = 0, 1, 2, 3
# Where each field of each kind sits in a row: ROW["allocate"].block_ids == 7. Rows recorded
# by an earlier build may be shorter than their kind (fields added since are at the end).
ROW = {kind: namedtuple(f"{kind}_row", fields)(*range(FIRST_FIELD, FIRST_FIELD + len(fields)))
       for kind, fields in EVENT_FIELDS.items()}


def value_at(kind: str, name: str) -> int:
    """Where field `name` sits in a `kind` event's values (a row without seq, ts, kind: what
    `objs` holds for a Python-recorded event)."""
    return getattr(ROW[kind], name) - FIRST_FIELD


def wide_at(kind: str, name: str) -> int:
    """Where field `name` sits among a keyed `kind` event's NVALS `wide` values (its fields
    after the key)."""
    return value_at(kind, name) - 1


class EventColumns(NamedTuple):
    """One segment of events as EventRing.export() hands it over ("cols2"; the layout is
    documented there, allocator/_events.pxi). A tuple: the compiled readers (replay_columns,
    rows_of_columns2, validate_columns) take it as it is, and a file stores it as a plain
    tuple (`plain()`), which is what the restricted unpickler reads back."""

    format: str  # COLUMNS2
    first: int  # seq of the first event
    last: int  # seq of the last event
    ts: bytes  # float64 per event
    kind: bytes  # uint8 per event: code | FLAG_OBJ / FLAG_KEY
    aux: bytes  # uint8 per event: an allocate's block state
    num: bytes  # int64 (id, requested bytes) per numeric event (allocate, free)
    nb: bytes  # int32 block count per numeric event
    ne: bytes  # int32 entries in `ids` per numeric event (-1: the ids were not kept)
    ids: bytes  # int32 block ids, runs of 3+ ascending ids as (-length, first)
    wide: bytes  # int64, NVALS per keyed event (put, evict)
    keys: list  # the key of each keyed event
    objs: list | bytes  # the value tuple of each Python-recorded event (bytes: kept pickled)
    names: list  # kind names by code
    strings: list  # the string table keyed events index
    block_bytes: int  # the pool's block size (an allocate's allocated bytes)

    @classmethod
    def of(cls, data: tuple) -> EventColumns:
        """Columns from a tuple read back (a recording's segment). Raises
        pickle.UnpicklingError when it is not one "cols2" tuple's worth of values."""
        if len(data) != len(cls._fields):
            raise pickle.UnpicklingError(f"event columns hold {len(data)} values, not {len(cls._fields)}")
        return cls._make(data)

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def plain(self) -> tuple:
        """As a plain tuple (what a recording stores: the file names no class)."""
        return tuple(self)

    def mostly_python(self) -> bool:
        """Whether most events are Python-recorded (contiguous, tiered, prefix pools): stopping
        the compiled replay at each costs more than decoding the rows and writing them
        vectorised (Replayer.apply_rows)."""
        return len(self.objs) * 4 > self.count

    def kind_codes(self, lo: int, hi: int) -> np.ndarray:
        """The kind code of events lo..hi-1 (indexes into the segment)."""
        return np.frombuffer(self.kind, dtype=np.uint8)[lo:hi] & CODE_MASK


class OldColumns(NamedTuple):
    """A segment as a recording of an earlier build stored it ("cols1"): NVALS int64 values,
    an aux byte and an id count per event, block ids plain; Python-recorded values in `objs`."""

    format: str  # COLUMNS1
    first: int
    last: int
    ts: bytes  # float64 per event
    kind: bytes  # uint8 per event: code | FLAG_OBJ
    vals: bytes  # int64, NVALS per event
    aux: bytes  # uint8 per event
    nids: bytes  # int32 per event: block ids in `ids` (<= 0: none)
    ids: bytes  # int32 block ids
    objs: list
    names: list

    @classmethod
    def of(cls, data: tuple) -> OldColumns:
        if len(data) != len(cls._fields):
            raise pickle.UnpicklingError(f"old event columns hold {len(data)} values, not {len(cls._fields)}")
        return cls._make(data)

    def rows(self) -> list[tuple]:
        """Back to flat rows in the vocabulary's layout, as EventRing.raw_after() makes them:
        numeric allocate (id, requested, allocated, blocks, block_ids, state), free (id,
        blocks, block_ids, requested_bytes)."""
        ts = np.frombuffer(self.ts, dtype=np.float64).tolist()
        kind = np.frombuffer(self.kind, dtype=np.uint8).tolist()
        vals = np.frombuffer(self.vals, dtype=np.int64).reshape(-1, NVALS).tolist()
        aux = np.frombuffer(self.aux, dtype=np.uint8).tolist()
        nids = np.frombuffer(self.nids, dtype=np.int32).tolist()
        id_arr = np.frombuffer(self.ids, dtype=np.int32)
        names, objs = self.names, self.objs
        out: list[tuple] = []
        pos = oi = 0
        for i, k in enumerate(kind):
            seq = self.first + i
            name = names[k & CODE_MASK]
            if k & FLAG_OBJ:
                out.append((seq, ts[i], name) + tuple(objs[oi]))
                oi += 1
                continue
            m = nids[i]
            if m == 1:
                bid = int(id_arr[pos])
            elif m > 1:
                bid = id_arr[pos:pos + m].tobytes()
            else:
                bid = None
            pos += max(m, 0)
            v = vals[i]
            if name == "free":  # (id, blocks, requested_bytes)
                out.append((seq, ts[i], name, v[0], v[1], bid, v[2]))
            else:  # allocate: (id, requested, allocated, blocks)
                out.append((seq, ts[i], name, v[0], v[1], v[2], v[3], bid, aux[i]))
        return out


class CacheFigures(NamedTuple):
    """The KV cache's own figures at a keyframe."""

    policy: str
    capacity_bytes: int
    hits: int
    misses: int
    evictions: tuple  # by EVICTION_REASONS
    entry_ids: bytes  # its entries' allocation ids, int64

    @classmethod
    def of(cls, value) -> CacheFigures:
        """From a file's keyframe, checked to be what History._snapshot writes. Raises
        pickle.UnpicklingError."""
        f = cls._make(value) if isinstance(value, tuple) and len(value) == len(cls._fields) else None
        if not (f is not None and isinstance(f.policy, str)
                and all(isinstance(v, int) for v in (f.capacity_bytes, f.hits, f.misses))
                and isinstance(f.evictions, tuple) and len(f.evictions) == len(EVICTION_REASONS)
                and all(isinstance(v, int) for v in f.evictions)
                and isinstance(f.entry_ids, bytes) and len(f.entry_ids) % 8 == 0):
            raise pickle.UnpicklingError("a keyframe's cache figures are not (policy, capacity, hits, "
                                         "misses, evictions, entry ids)")
        return f


COUNTER_NAMES = ("extends", "truncates", "moves", "moved_blocks", "defragmentations",
                 "ooms_capacity", "ooms_fragmentation")


class KeyframeFigures(NamedTuple):
    """A keyframe's numbers as a recording stores them (`scalars`: this tuple pickled, plain;
    without `cache` when the pool had no KV cache)."""

    requested: int
    allocations: int  # live allocation count
    last_id: int
    frees: int
    counters: tuple  # values of COUNTER_NAMES
    cache: CacheFigures | None = None

    def plain(self) -> tuple:
        head = (self.requested, self.allocations, self.last_id, self.frees, self.counters)
        return head if self.cache is None else head + (tuple(self.cache),)

    @classmethod
    def of(cls, values, seq) -> KeyframeFigures:
        """From a file's keyframe, every field checked. Raises pickle.UnpicklingError."""
        nfields = len(cls._fields)
        if not (values.__class__ is tuple and len(values) in (nfields - 1, nfields) and seq.__class__ is int):
            raise _bad_figures(seq)
        figures = cls._make(values if len(values) == nfields else values + (None,))
        counters = figures.counters
        if not (all(v.__class__ is int for v in (figures.requested, figures.allocations, figures.last_id,
                                                  figures.frees))
                and counters.__class__ is tuple and len(counters) == len(COUNTER_NAMES)
                and all(v.__class__ is int for v in counters)):
            raise _bad_figures(seq)
        if len(values) == nfields:  # the writer leaves `cache` out when there is none
            figures = figures._replace(cache=CacheFigures.of(figures.cache))
        return figures


def _bad_figures(seq) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"keyframe {seq!r}: its figures are not (requested, allocations, "
                                  f"last id, frees, {len(COUNTER_NAMES)} counters[, cache])")


__all__ = ["COLUMNS1", "COLUMNS2", "COUNTER_NAMES", "CacheFigures", "EventColumns", "KeyframeFigures",
           "OldColumns", "ROW", "value_at", "wide_at"]
