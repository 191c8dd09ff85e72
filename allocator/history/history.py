"""History: a pool's whole event history with keyframes, so any past block map can be rebuilt."""

from __future__ import annotations

import gc
import io
import pickle
import pickletools
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from .._core import map_summary, rows_of_columns2, validate_columns
from ..errors import Conflict, NotFound
from ..pools.blockmap import CACHED, FREE, NO_OWNER, PINNED, STATE_NAMES
from ..pools.events import event_dict
from ..pools.metrics import fragmentation_stats
from ..vocab import EVICTION_REASONS
from .columns import (
    COLUMNS1,
    COLUMNS2,
    COUNTER_NAMES,
    KIND,
    ROW,
    SEQ,
    TS,
    CacheFigures,
    EventColumns,
    KeyframeFigures,
    OldColumns,
)
from .replay import Replayer

DEFAULT_HISTORY_BYTES = 64 << 20
# Events between keyframes: EVENTS_PER_KEYFRAME_BLOCK per block of the pool (one per four blocks
# for Python-recorded strategies), at least one ring's worth, at most KEYFRAME_EVENTS. A
# keyframe costs ~5 ns per block of the pages that changed since the previous one (zlib level
# 1; unchanged pages are shared); a read replays up to one interval: ~20 ns per compiled event
# (allocate, free, put, evict), ~1 us per Python-recorded one. 4 events per block keeps a small
# pool's keyframes near 1 ns an event; the cap keeps a read within ~100 ms.
KEYFRAME_EVENTS = 131_072
EVENTS_PER_KEYFRAME_BLOCK = 4


class OutsideHistory(NotFound):
    """A point before the oldest kept event or after the newest one."""

    def __init__(self, seq: int, first: int, last: int, dropped: int) -> None:
        why = (f"; older events were dropped to keep the history within its memory budget "
               f"({dropped} so far)" if dropped and seq < first else "")
        super().__init__("history point", seq)
        self.args = (f"event seq {seq} is outside the history, which holds seq {first}..{last}{why}",)
        self.first, self.last = first, last

    def details(self) -> dict:
        return {"kind": self.kind, "id": self.ident, "first_seq": self.first, "last_seq": self.last}


class _PlainUnpickler(pickle.Unpickler):
    """Loads only plain data (tuples, lists, dicts, numbers, strings, bytes, None) and ranges:
    a recording file from elsewhere cannot make the loader import or call anything else."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("builtins", "range"):
            return range
        raise pickle.UnpicklingError(f"recording data may not name {module}.{name}")


def safe_loads(blob: bytes, bounded: bool = False, refs: bool = True):
    """`pickle.loads` restricted to what the history writes. `bounded` (bytes from a file):
    `check_pickle(blob, refs)` first, so no size the pickle declares is allocated before it is
    seen to fit. Raises pickle.UnpicklingError."""
    if bounded:
        check_pickle(blob, refs)
    return _PlainUnpickler(io.BytesIO(blob)).load()


_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def check_pickle(blob, refs: bool = True) -> None:
    """Raises pickle.UnpicklingError unless `blob` is bytes whose every opcode is whole: each
    frame, bytes and string it declares fits in what is left of it. The C unpickler allocates
    a declared size before reading it (a 2^50-byte BINBYTES8 is a MemoryError, a 2^63-byte
    frame an OverflowError); this walk allocates at most the blob's own size. ~1 us an opcode.
    `refs` False: no object may be used twice (segments are written without a memo; a list
    of lists each holding the one before twice is 2^depth elements to whoever walks it)."""
    if blob.__class__ is not bytes:
        raise pickle.UnpicklingError(f"recording data is {type(blob).__name__}, not bytes")
    f = io.BytesIO(blob)
    try:
        for op, arg, pos in pickletools.genops(f):
            if op.name == "FRAME" and arg > len(blob) - f.tell():
                raise pickle.UnpicklingError(f"a pickle frame of {arg} bytes at offset {pos} "
                                             f"runs past the data's {len(blob)} bytes")
            if not refs and op.name in _MEMO_GETS:
                raise pickle.UnpicklingError(f"recorded events refer back to an object (offset {pos}); "
                                             "events are written with no shared objects")
    except (ValueError, OverflowError) as exc:  # pickletools: a length past the end, a bad opcode
        raise pickle.UnpicklingError(f"recording data is not a whole pickle: {exc}") from None


@dataclass(slots=True)
class Keyframe:
    """The block map and the numbers right after event `seq`, from which events after `seq`
    replay. The owner (int32) and state (uint8) arrays are cut in pages of PAGE_BLOCKS blocks,
    each zlib-compressed; a keyframe shares (the same bytes object) every page that did not
    change since the keyframe before it, so a keyframe costs what changed, not the whole map.

    `own_bytes`: the compressed bytes this keyframe holds that no older kept keyframe holds
    (what dropping the oldest keyframe frees is recomputed when it goes; see History._trim).
    """

    seq: int
    owner_pages: tuple
    state_pages: tuple
    requested: int
    allocations: int  # live allocation count
    last_id: int
    frees: int
    counters: tuple  # values of COUNTER_NAMES
    own_bytes: int = -1
    cache: CacheFigures | None = None  # the KV cache's own figures then; None: no cache

    def __post_init__(self) -> None:
        if self.own_bytes < 0:
            self.own_bytes = _unique_bytes(self.owner_pages + self.state_pages)

    @property
    def nbytes(self) -> int:
        return self.own_bytes + 200

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        owner = np.frombuffer(b"".join(map(zlib.decompress, self.owner_pages)), dtype=np.int32).copy()
        state = np.frombuffer(b"".join(map(zlib.decompress, self.state_pages)), dtype=np.uint8).copy()
        return owner, state

    def size_problem(self, num_blocks: int) -> str | None:
        """None when the pages inflate to exactly `num_blocks` owners and states; else what is
        wrong. Bounded: no page inflates past what is still due plus one byte (a zlib bomb
        stops there), so a file from elsewhere cannot make this allocate more than the map."""
        for pages, width in ((self.owner_pages, 4), (self.state_pages, 1)):
            due = num_blocks * width
            for page in pages:
                try:
                    got = len(zlib.decompressobj().decompress(page, due + 1))
                except (zlib.error, TypeError) as exc:
                    return f"keyframe {self.seq}: {exc}"
                due -= got
                if due < 0:
                    break
            if due != 0:
                return f"keyframe {self.seq} does not hold {num_blocks} blocks"
        return None

    def to_row(self) -> dict:
        figures = KeyframeFigures(self.requested, self.allocations, self.last_id, self.frees,
                                  tuple(self.counters), self.cache)
        return {"seq": self.seq, "owner_z": _pages_blob(self.owner_pages),
                "state_z": _pages_blob(self.state_pages), "scalars": pickle.dumps(figures.plain(), 4)}

    @classmethod
    def from_row(cls, seq: int, owner_z: bytes, state_z: bytes, scalars: bytes) -> Keyframe:
        """A keyframe as a recording stores it (`to_row`), every field checked to be what the
        writer writes. Raises pickle.UnpicklingError."""
        f = KeyframeFigures.of(safe_loads(scalars, bounded=True), seq)
        return cls(seq, _blob_pages(owner_z), _blob_pages(state_z), f.requested, f.allocations,
                   f.last_id, f.frees, f.counters, cache=f.cache)


PAGE_BLOCKS = 16_384  # blocks per keyframe page (64 KiB of owners before compression)


def _pages_blob(pages: tuple) -> bytes:
    """One page as its zlib stream (what recordings always held); several as a pickled tuple
    (a pickle starts with 0x80, a zlib stream with 0x78: the reader tells them apart)."""
    return pages[0] if len(pages) == 1 else pickle.dumps(tuple(pages), 4)


def _blob_pages(blob: bytes) -> tuple:
    if blob.__class__ is not bytes:
        raise pickle.UnpicklingError(f"a keyframe's pages are {type(blob).__name__}, not bytes")
    if blob[:1] == b"\x80":
        pages = safe_loads(blob, bounded=True)
        if not (isinstance(pages, tuple) and all(isinstance(p, bytes) for p in pages)):
            raise pickle.UnpicklingError("a keyframe's pages are not bytes")
        return pages
    return (blob,)


def _compress_pages(arr: np.ndarray, dirty, old: tuple | None, page_blocks: int,
                    uniform: bool = False) -> tuple:
    """arr cut in pages of `page_blocks`, compressed; pages not in `dirty` reuse `old`'s (None:
    compress every page). `uniform`: every element is the same (a new pool's map), so every
    full page is the same bytes object, compressed once."""
    n = arr.shape[0]
    out = []
    same = None
    for i, start in enumerate(range(0, n, page_blocks)):
        if old is not None and i not in dirty:
            out.append(old[i])
        elif uniform and start + page_blocks <= n:
            if same is None:
                same = zlib.compress(memoryview(arr[start:start + page_blocks]).cast("B"), 1)
            out.append(same)
        else:
            out.append(zlib.compress(memoryview(arr[start:start + page_blocks]).cast("B"), 1))
    return tuple(out)


def _unique_bytes(pages, exclude=()) -> int:
    """Bytes of the distinct page objects in `pages` that are not in `exclude` (by identity)."""
    skip = {id(p) for p in exclude}
    seen: dict[int, int] = {}
    for p in pages:
        if id(p) not in skip:
            seen[id(p)] = len(p)
    return sum(seen.values())


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


def keyframe_of(seq: int, owner: np.ndarray, state: np.ndarray, requested: int, allocations: int,
                last_id: int, frees: int, counters, dirty=None, base: Keyframe | None = None,
                page_blocks: int = PAGE_BLOCKS, empty: bool = False,
                cache: CacheFigures | None = None) -> Keyframe:
    """A keyframe of the map now; with `base` (the previous keyframe), only the pages in `dirty`
    (page indexes changed since `base`) are compressed, the others shared with it. `empty`:
    the map is all free (a new pool)."""
    old_o = base.owner_pages if base is not None else None
    old_s = base.state_pages if base is not None else None
    owner_pages = _compress_pages(owner, dirty, old_o, page_blocks, empty)
    state_pages = _compress_pages(state, dirty, old_s, page_blocks, empty)
    own = _unique_bytes(owner_pages + state_pages, (old_o or ()) + (old_s or ()))
    return Keyframe(seq, owner_pages, state_pages, requested, allocations, last_id, frees,
                    tuple(counters), own, cache)


class History:
    """Every event of one pool since it was made (or since the oldest kept keyframe), packed.

    The pool's EventLog ring holds the newest events; before it would drop one, the log calls
    `spill()`, which takes the ring's unconsumed events as compact columns into a `Segment`
    (EventRing.export: ~20 ns an event, no Python object per compiled event) and, every
    `keyframe_every` events, snapshots the live block map and counters as a `Keyframe` (only
    the pages that changed since the previous one are compressed). The hot path pays one
    comparison per event; the rest is amortised.

    Invariants: `keyframes[0].seq == first_seq`; segments cover first_seq+1..consumed
    contiguously and the ring holds consumed+1..events.last_seq; `nbytes <= max_bytes` after
    every spill except while only one keyframe is kept. When over budget the oldest keyframe
    and the segments before the next one are dropped (`dropped_events` counts them).
    """

    def __init__(self, pool, max_bytes: int = DEFAULT_HISTORY_BYTES,
                 keyframe_every: int | None = None, page_blocks: int = PAGE_BLOCKS) -> None:
        self.pool = pool
        self.page_blocks = page_blocks
        self.max_bytes = max_bytes
        # Events recorded from Python (contiguous, tiered) replay ~50x slower than compiled
        # ones: keyframes four times as often keep their reads as fast.
        span = (pool.num_blocks * EVENTS_PER_KEYFRAME_BLOCK if hasattr(type(pool), "_core")
                else pool.num_blocks // 4)
        self.keyframe_every = keyframe_every or max(pool.events.capacity, min(KEYFRAME_EVENTS, span))
        self._has_ranges = pool.strategy == "contiguous"  # its events name runs as ranges
        self.keyframes: list[Keyframe] = []
        self.segments: list[Segment] = []
        self.nbytes = 0
        self.dropped_events = 0
        self.consumed = self.origin_seq = pool.events.last_seq
        self._base: Keyframe | None = None  # the keyframe the next one may share pages with
        self._since = 0  # the block map's change-tracking token taken with _base
        if hasattr(pool, "_allocs"):
            self._add_keyframe(self._snapshot())
        else:  # made from Pool.__init__, before the strategy's structures exist: pool empty
            bm = pool.blockmap
            self._add_keyframe(keyframe_of(self.consumed, bm.owners_np(), bm.states_np(), 0, 0, 0, 0,
                                           [0] * len(COUNTER_NAMES), page_blocks=page_blocks,
                                           empty=True))
        pool.events.sink = self
        self._arm()

    @property
    def first_seq(self) -> int:
        return self.keyframes[0].seq

    # -- writing (called by the EventLog) --------------------------------------------------------
    def _arm(self) -> None:
        """Ask for the next spill before the ring (or its block-id ring) would drop an event
        not consumed yet: a spill comes right after an event, so leave one event's room."""
        events = self.pool.events
        events.spill_at = self.consumed + events.capacity - 1
        events.spill_bpos = events.bpos + events.bcap // 2

    def _snapshot(self, reuse: bool = False) -> Keyframe:
        """A keyframe of the pool now. With `reuse` (the history's own keyframes, taken in
        order), pages unchanged since the previous one are shared with it: the block map's
        chunk stamps (BlockMap.changes_since, a reader of its own) say which changed."""
        p = self.pool
        last_id = p._last_id
        newest = p.events.raw_after(p.events.last_seq - 1) if len(p.events) else ()
        if newest and newest[0][KIND] == "allocate":
            # Strategies other than paged record the allocate before Pool.allocate stores the id.
            last_id = max(last_id, newest[0][ROW["allocate"].id])
        bm = p.blockmap
        dirty = base = None
        if reuse:
            if self._base is not None:
                base = self._base
                self._since, runs = bm.changes_since(self._since)
                dirty = set()
                for start, count in runs:
                    dirty.update(range(start // self.page_blocks, (start + count - 1) // self.page_blocks + 1))
            else:
                self._since = bm.checkpoint()
        cache = p.cache
        figures = None if cache is None else CacheFigures(
            cache.policy, cache.capacity_bytes, cache.hits, cache.misses,
            tuple(cache.evictions[r] for r in EVICTION_REASONS), cache.entry_ids().tobytes())
        kf = keyframe_of(p.events.last_seq, bm.owners_np(), bm.states_np(), p.requested_total, len(p),
                         last_id, p._frees, [p.counters[n] for n in COUNTER_NAMES], dirty, base,
                         self.page_blocks, cache=figures)
        if reuse:
            self._base = kf
        return kf

    def _add_keyframe(self, kf: Keyframe) -> None:
        self.keyframes.append(kf)
        self.nbytes += kf.nbytes

    def spill(self) -> None:
        """Pack the ring's unconsumed events; keyframe the live map when one is due."""
        events = self.pool.events
        exported = events.export(self.consumed, self.pool.block_bytes)
        cols = None if exported is None else EventColumns._make(exported)
        if cols is not None and cols.first != self.consumed + 1:
            # The ring dropped events before they reached us (an event with more block ids
            # than half the id ring): start over from a keyframe of the map now.
            self._restart()
            return
        if cols is not None:
            if self._has_ranges:
                cols = cols._replace(objs=[_packable_values(v) for v in cols.objs])
            seg = Segment.of_columns(cols)
            self.segments.append(seg)
            self.nbytes += seg.nbytes
            self.consumed = seg.last
            # Keyframe now unless the next spill would still be within the interval.
            if self.consumed + events.capacity - self.keyframes[-1].seq > self.keyframe_every:
                self._add_keyframe(self._snapshot(reuse=True))
            if self.nbytes > self.max_bytes:
                self._trim()
        self._arm()

    def _restart(self) -> None:
        """Forget everything kept (counted as dropped) and keep from a keyframe of now."""
        self._base = None
        kf = self._snapshot(reuse=True)
        self.dropped_events = kf.seq - self.origin_seq
        self.keyframes, self.segments = [kf], []
        self.nbytes = kf.nbytes
        self.consumed = kf.seq
        self._arm()

    def _trim(self) -> None:
        if len(self.keyframes) < 2 and self.consumed > self.keyframes[-1].seq:
            self._add_keyframe(self._snapshot(reuse=True))  # so the older one can go
        while self.nbytes > self.max_bytes and len(self.keyframes) >= 2:
            old = self.keyframes.pop(0)
            nxt = self.keyframes[0]
            # Pages the next keyframe shares with the dropped one stay: they become its own.
            mine = old.owner_pages + old.state_pages
            shared = _unique_bytes(mine) - _unique_bytes(mine, nxt.owner_pages + nxt.state_pages)
            nxt.own_bytes += shared
            self.nbytes -= old.nbytes - shared
            keep_from = self.keyframes[0].seq
            while self.segments and self.segments[0].first <= keep_from:
                seg = self.segments[0]
                if seg.last > keep_from:  # split: keep the events after the keyframe
                    rows = [r for r in seg.rows() if r[SEQ] > keep_from]
                    self.segments[0] = Segment.pack(rows)
                    self.nbytes += self.segments[0].nbytes - seg.nbytes
                    break
                self.segments.pop(0)
                self.nbytes -= seg.nbytes
            self.dropped_events = keep_from - self.origin_seq

    def rollback(self, seq: int) -> None:
        """Forget what was consumed after `seq` (the EventLog truncated a rolled-back batch)."""
        if self.keyframes[-1].seq > seq:
            self._base = None  # the next keyframe shares nothing with a dropped one
        while self.keyframes[-1].seq > seq and len(self.keyframes) > 1:
            self.nbytes -= self.keyframes.pop().nbytes
        if self.keyframes[-1].seq > seq:  # the only keyframe is newer: retake it now
            self.nbytes -= self.keyframes.pop().nbytes
            self._add_keyframe(self._snapshot(reuse=True))
        while self.segments and self.segments[-1].last > seq:
            seg = self.segments.pop()
            self.nbytes -= seg.nbytes
            if seg.first <= seq:
                kept = Segment.pack([r for r in seg.rows() if r[SEQ] <= seq])
                self.segments.append(kept)
                self.nbytes += kept.nbytes
        self.consumed = min(self.consumed, seq)
        self.consumed = max(self.consumed, self.keyframes[-1].seq)
        self._arm()

    # -- reading ------------------------------------------------------------------------------
    def view(self) -> HistoryView:
        """An immutable snapshot of the history up to now, safe to read from another thread."""
        p = self.pool
        return HistoryView(
            geometry=pool_geometry(p), keyframes=list(self.keyframes), segments=list(self.segments),
            tail=p.events.raw_after(self.consumed), last_seq=p.events.last_seq,
            dropped_events=self.dropped_events)

    def info(self) -> dict:
        return {"first_seq": self.first_seq, "last_seq": self.pool.events.last_seq,
                "keyframes": len(self.keyframes), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "dropped_events": self.dropped_events, "keyframe_every": self.keyframe_every}


def pool_geometry(pool) -> dict:
    """What replay needs to know of a pool besides its events (plain data, stored in recordings)."""
    geo = {"strategy": pool.strategy, "num_blocks": pool.num_blocks, "block_bytes": pool.block_bytes,
           "scatter_fails": pool.scatter_fails}
    if pool.strategy == "tiered":
        geo["tiers"] = [{"name": t.name, "units": t.units, "start": t.start, "count": t.count}
                        for t in pool.tiers]
    if pool.strategy == "contiguous":
        geo["fit"] = pool.fit
    if hasattr(pool, "prefix_stats"):  # a PrefixPool (allocator/prefix/prefix.py imports this module)
        # idle cached blocks are not used there; a KV cache's CACHED allocations would be
        # told from them only by records the history does not keep
        geo["prefix_caching"] = {"policy": pool.policy, "kv_cache": pool.cache is not None}
    return geo


def _packable_values(values: tuple) -> tuple:
    """One event's values with ranges as (start, stop) (a range pickles ~30x slower)."""
    if range in map(type, values):
        return tuple((v.start, v.stop) if v.__class__ is range else v for v in values)
    return values


@dataclass(slots=True)
class HistoryView:
    """A frozen history (live snapshot or a recording): map, stats and events at any kept seq."""

    geometry: dict
    keyframes: list[Keyframe]
    segments: list[Segment]
    tail: list[tuple] = field(default_factory=list)  # unpacked events after the last segment
    last_seq: int = 0
    dropped_events: int = 0

    @property
    def first_seq(self) -> int:
        return self.keyframes[0].seq

    def check_seq(self, seq: int) -> None:
        if not self.first_seq <= seq <= self.last_seq:
            raise OutsideHistory(seq, self.first_seq, self.last_seq, self.dropped_events)

    def rows(self, after: int, upto: int):
        """Stored event tuples with after < seq <= upto, oldest first."""
        segs = self.segments
        i = bisect_right([s.last for s in segs], after)
        for seg in segs[i:]:
            if seg.first > upto:
                return
            for r in seg.rows():
                if after < r[SEQ] <= upto:
                    yield r
        for r in self.tail:
            if r[SEQ] > upto:
                return
            if r[SEQ] > after:
                yield r

    def replay_to(self, seq: int) -> Replayer:
        """The map and numbers right after event `seq`. Raises OutsideHistory."""
        self.check_seq(seq)
        k = bisect_right([kf.seq for kf in self.keyframes], seq) - 1
        rep = Replayer(self.keyframes[k])
        self.advance(rep, seq)
        return rep

    def advance(self, rep: Replayer, upto: int, count: tuple = (), columns: dict | None = None):
        """Roll `rep` forward to right after event `upto` (> rep.seq, within the history).
        Returns (events of each kind in `count` among those applied, ts of event `upto` or
        None when it is a keyframe's). `columns`: a dict the caller keeps across calls, so
        each segment is decoded once (Segment.columns() unpickles a file's segment). A replay
        that started before the cache existed takes the cache's figures from the first
        keyframe it passes that holds them."""
        if rep.cache is None:
            for kf in self.keyframes:
                if rep.seq < kf.seq <= upto and kf.cache is not None:
                    counts, ts = self._roll(rep, kf.seq, count, columns)
                    rep.cache = Replayer.cache_of(kf)
                    if upto > kf.seq:
                        more, ts = self._roll(rep, upto, count, columns)
                        counts = {k: counts[k] + more[k] for k in counts}
                    return counts, ts
        return self._roll(rep, upto, count, columns)

    def _roll(self, rep: Replayer, upto: int, count: tuple, columns: dict | None):
        after = rep.seq
        counts = dict.fromkeys(count, 0)
        ts = None
        # Row tuples (older segments, the ring's tail) make short-lived tuples: a full
        # collection triggered by them would scan every object of the process for nothing.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            segs = self.segments
            memo = {} if columns is None else columns
            for seg in segs[bisect_right([s.last for s in segs], after):]:
                if seg.first > upto:
                    break
                lo, hi = max(after + 1, seg.first) - seg.first, min(upto, seg.last) - seg.first + 1
                got = memo.get(id(seg))
                if got is None:
                    got = memo[id(seg)] = replayable(seg)
                if got.__class__ is not EventColumns:  # rows: row i is event first + i
                    ts = self._apply_rows(rep, got[lo:hi], counts, ts)
                    continue
                if count:
                    kinds = got.kind_codes(lo, hi)
                    for name in count:
                        if name in got.names:
                            counts[name] += int(np.count_nonzero(kinds == got.names.index(name)))
                if hi > lo:
                    ts = float(np.frombuffer(got.ts, dtype=np.float64)[hi - 1])
                rep.apply_columns(got, after, upto)
            ts = self._apply_rows(rep, [r for r in self.tail if after < r[SEQ] <= upto], counts, ts)
        finally:
            if was_enabled:
                gc.enable()
        rep.seq = upto
        return counts, ts

    @staticmethod
    def _apply_rows(rep: Replayer, rows: list, counts: dict, ts):
        if not rows:
            return ts
        for r in rows:
            if r[KIND] in counts:
                counts[r[KIND]] += 1
        rep.apply_rows(rows)
        return rows[-1][TS]

    def stats_at(self, seq: int) -> dict:
        """The pool's stats as they were right after event `seq` (without cache stats)."""
        return stats_of(self.geometry, self.replay_to(seq))

    def events(self, after: int = 0, limit: int = 1000, kinds: set[str] | None = None,
               upto: int | None = None) -> list[dict]:
        out = []
        for row in self.rows(max(after, self.first_seq), self.last_seq if upto is None else upto):
            if kinds is None or row[KIND] in kinds:
                out.append(event_dict(row))
                if len(out) >= limit:
                    break
        return out


def free_lengths(geometry: dict, owner: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Free extents as the strategy's own `_free_lengths` reports them, from the map alone."""
    if geometry["strategy"] == "tiered":
        tiers = geometry["tiers"]
        parts = []
        for t in tiers[:-1]:
            nfree = int((owner[t["start"]: t["start"] + t["count"] * t["units"]: t["units"]] == NO_OWNER).sum())
            parts.append(np.full(nfree, t["units"], dtype=np.int64))
        big = tiers[-1]
        nfree = int((owner[big["start"]: big["start"] + big["count"] * big["units"]: big["units"]] == NO_OWNER).sum())
        if nfree:
            parts.append(np.array([nfree * big["units"]], dtype=np.int64))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)
    free = state == FREE
    if not free.any():
        return np.empty(0, np.int64)
    edges = np.diff(np.concatenate(([False], free, [False])).astype(np.int8))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def stats_of(geometry: dict, rep: Replayer) -> dict:
    """Pool.stats() fields rebuilt from a replayed map, with the cache's figures where the
    replay holds them (`cache_stats_of`); a prefix pool's `prefix` section is not kept."""
    n, bb = geometry["num_blocks"], geometry["block_bytes"]
    used, counts, free_runs = map_summary(rep.owner, rep.state)  # one compiled pass
    prefix = geometry.get("prefix_caching")
    if prefix is not None:  # a prefix-caching pool's idle cached blocks are not used
        if not prefix.get("kv_cache"):
            used -= int(counts[CACHED])
        elif rep.cache is None:
            raise Conflict("this prefix-caching pool has a KV cache, and its history holds the "
                           "cache's entries only from its first keyframe taken with the cache on: "
                           "before that its used blocks cannot be told from its idle cached prefix "
                           "blocks (the block map is rebuilt: ask for blockmap?at_seq=)")
        else:  # idle prefix blocks: CACHED blocks that are no KV cache entry's
            kv = np.isin(rep.owner, np.fromiter(rep.cache["ids"], dtype=np.int64, count=len(rep.cache["ids"])))
            used -= int(np.count_nonzero((rep.state == CACHED) & ~kv))
    allocated = used * bb
    lengths = free_runs if geometry["strategy"] != "tiered" else free_lengths(geometry, rep.owner, rep.state)
    frag = fragmentation_stats(lengths, bb, rep.requested, allocated)
    out = {
        "strategy": geometry["strategy"],
        "total_blocks": n,
        "used_blocks": used,
        "free_blocks": n - used,
        "blocks_by_state": {STATE_NAMES[i]: int(counts[i]) for i in STATE_NAMES},
        "block_bytes": bb,
        "capacity_bytes": n * bb,
        "utilization": used / n,
        "requested_bytes": rep.requested,
        "allocated_bytes": allocated,
        "allocation_count": rep.allocations,
        **frag,
        "scatter_fails": geometry["scatter_fails"],
        "stranded_free_bytes": frag["free_bytes"] - frag["largest_free_bytes"] if geometry["scatter_fails"] else 0,
        "counters": {"allocations": rep.last_id, "frees": rep.frees, **rep.counters},
        "ooms": {"capacity": rep.counters["ooms_capacity"],
                 "fragmentation": rep.counters["ooms_fragmentation"]},
        "last_event_seq": rep.seq,
    }
    if rep.cache is not None:
        out["cache"] = cache_stats_of(geometry, rep, counts)
    if geometry["strategy"] == "contiguous":
        out["fit"] = geometry["fit"]
    if geometry["strategy"] == "tiered":
        out["tiers"] = [
            {"name": t["name"], "block_bytes": t["units"] * bb, "units": t["units"], "start": t["start"],
             "blocks": t["count"],
             "free_blocks": int((rep.owner[t["start"]: t["start"] + t["count"] * t["units"]: t["units"]]
                                 == NO_OWNER).sum())}
            for t in geometry["tiers"]]
    return out


def cache_stats_of(geometry: dict, rep: Replayer, counts: np.ndarray) -> dict:
    """KVCache.stats() as it was: its entries are the live allocations a put named since the
    keyframe (or held then), their bytes those of their blocks (an entry holds whole blocks on
    every strategy); hits, misses, evictions and the policy are rolled forward too. `refusals` (puts
    refused for want of room, which record no event) is not kept."""
    bb, c = geometry["block_bytes"], rep.cache
    ids = np.fromiter(c["ids"], dtype=np.int64, count=len(c["ids"]))
    held = np.isin(rep.owner, ids)  # blocks of an allocation that holds an entry
    lookups = c["hits"] + c["misses"]
    return {
        "policy": c["policy"],
        "capacity_bytes": c["capacity_bytes"],
        "used_bytes": int(np.count_nonzero(held)) * bb,
        "pinned_bytes": int(np.count_nonzero(held & (rep.state == PINNED))) * bb,
        "entries": int(np.unique(rep.owner[held]).size),
        "hits": c["hits"],
        "misses": c["misses"],
        "hit_rate": c["hits"] / lookups if lookups else 0.0,
        "evictions": dict(c["evictions"]),
    }


def map_runs(owner: np.ndarray, state: np.ndarray) -> list[list[int]]:
    """The map run-length encoded as [start, count, owner, state], like the live blockmap route."""
    n = owner.size
    if n == 0:
        return []
    change = np.flatnonzero((owner[1:] != owner[:-1]) | (state[1:] != state[:-1])) + 1
    starts = np.concatenate(([0], change))
    counts = np.diff(np.concatenate((starts, [n])))
    return np.stack([starts, counts, owner[starts], state[starts]], axis=1).tolist()


__all__ = ["DEFAULT_HISTORY_BYTES", "History", "HistoryView", "Keyframe", "OutsideHistory", "Replayer",
           "Segment", "map_runs", "pool_geometry", "stats_of"]
