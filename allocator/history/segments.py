"""Segment: a run of a pool's events as the history keeps them (compact columns) or a recording
stores them (those columns, an earlier build's, or row tuples, pickled)."""

from __future__ import annotations

import io
import pickle

from .._core import rows_of_columns2, validate_columns
from .columns import COLUMNS1, COLUMNS2, SEQ, EventColumns, OldColumns
from .pickles import safe_loads


class Segment:
    """Events first..last (contiguous seqs).

    Written by the history: EventRing.export()'s columns as they came (`cols`, EventColumns,
    no Python object per event; the value tuples of Python-recorded events pickled once into
    bytes, as pickling ranges and lists is what those strategies' events cost anyway). Read
    back from a recording: `blob`, a pickle of those columns (as a plain tuple), of an earlier
    build's OldColumns or of row tuples. `rows()` gives row tuples for any of them; `columns()`
    the EventColumns (objects unpickled) or None. A segment read from a file (`untrusted`) has
    its pickles walked (`check_pickle`) before its first load.
    """

    __slots__ = ("first", "last", "_blob", "_cols", "nbytes", "_untrusted")

    def __init__(self, first: int, last: int, blob: bytes | None = None, cols: EventColumns | None = None,
                 untrusted: bool = False) -> None:
        self.first, self.last, self._blob, self._cols = first, last, blob, cols
        self._untrusted = untrusted
        if cols is not None:
            self.nbytes = 200 + 64 * len(cols.keys) + sum(map(len, (
                cols.ts, cols.kind, cols.aux, cols.num, cols.nb, cols.ne, cols.ids, cols.wide, cols.objs)))
        else:
            self.nbytes = len(blob) + 100

    @property
    def blob(self) -> bytes:
        """The pickled form (what a recording stores: the columns as a plain tuple)."""
        if self._blob is None:
            buf = io.BytesIO()
            pickler = pickle.Pickler(buf, 5)
            pickler.fast = True
            pickler.dump(self._cols.plain())
            return buf.getvalue()
        return self._blob

    def columns(self) -> EventColumns | None:
        """The columns with the Python-recorded values as a list, or None for a segment in
        another form. Raises pickle.UnpicklingError for a file's inconsistent columns."""
        cols = self._cols
        if cols is None:
            data = safe_loads(self._blob, self._untrusted, refs=False)
            if not (data.__class__ is tuple and data and data[0] == COLUMNS2):
                return None
            cols = EventColumns.of(data)
            if cols.objs.__class__ in (bytes, list):
                cols = _objs_loaded(cols, self._untrusted)
            self._untrusted = False  # walked whole once: later loads of the same bytes are safe
            why = validate_columns(cols)
            if why is not None:
                raise pickle.UnpicklingError(f"recording segment {self.first}..{self.last}: {why}")
            return cols
        return _objs_loaded(cols)

    def rows(self) -> list[tuple]:
        cols = self.columns()
        if cols is not None:
            return rows_of_columns2(cols)
        data = safe_loads(self._blob, self._untrusted, refs=False)
        self._untrusted = False  # walked whole once: later loads of the same bytes are safe
        if data.__class__ is tuple and data and data[0] == COLUMNS1:
            return OldColumns.of(data).rows()
        if not (data.__class__ is list and all(r.__class__ is tuple and len(r) >= 3 for r in data)):
            raise pickle.UnpicklingError(f"recording segment {self.first}..{self.last} holds neither "
                                         "event columns nor event rows")
        return data

    @classmethod
    def of_columns(cls, cols: tuple) -> Segment:
        """From `EventRing.export()`: kept as they come, the Python-recorded values pickled."""
        if cols.__class__ is not EventColumns:
            cols = EventColumns._make(cols)
        objs = cols.objs
        if objs:
            buf = io.BytesIO()
            pickler = pickle.Pickler(buf, 5)
            pickler.fast = True  # no memo: events hold no shared or cyclic objects
            pickler.dump(objs)
            objs = buf.getvalue()
        else:
            objs = b""
        return cls(cols.first, cols.last, cols=cols._replace(objs=objs))

    @classmethod
    def pack(cls, rows: list[tuple]) -> Segment:
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, 5)
        pickler.fast = True  # no memo: ~30% faster, and events hold no shared or cyclic objects
        pickler.dump(rows)
        return cls(rows[0][SEQ], rows[-1][SEQ], buf.getvalue())


def replayable(seg: Segment) -> EventColumns | list[tuple]:
    """What a segment replays from: its columns, or its rows when it has no columns or mostly
    Python-recorded events (Replayer.apply_columns would hand those to apply_rows anyway)."""
    cols = seg.columns()
    if cols is None:
        return seg.rows()
    return rows_of_columns2(cols) if cols.mostly_python() else cols


def _objs_loaded(cols: EventColumns, bounded: bool = False) -> EventColumns:
    """Columns with the Python-recorded values as a list (they are kept pickled)."""
    objs = cols.objs
    if objs.__class__ is bytes:
        return cols._replace(objs=safe_loads(objs, bounded, refs=False) if objs else [])
    return cols


__all__ = ["Segment", "replayable"]
