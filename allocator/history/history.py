"""History: a pool's whole event history, packed, with keyframes, so any past block map can be
rebuilt. A pool extension: the server attaches one to every pool it serves; a pool made from
Python keeps none unless asked (`History(pool)`, or `create_pool(..., history=True)`)."""

from __future__ import annotations

from ..errors import positive_int
from ..vocab import EVICTION_REASONS
from .columns import COUNTER_NAMES, KIND, ROW, SEQ, CacheFigures, EventColumns
from .keyframes import PAGE_BLOCKS, Keyframe, keyframe_of, unique_bytes
from .segments import Segment
from .view import HistoryView

DEFAULT_HISTORY_BYTES = 64 << 20
# Events between keyframes: EVENTS_PER_KEYFRAME_BLOCK per block of the pool (one per four blocks
# for Python-recorded strategies), at least one ring's worth, at most KEYFRAME_EVENTS. A
# keyframe compresses the pages that changed since the previous one (zlib level 1; unchanged
# pages are shared); a read replays up to one interval of events. Scaling the interval with the
# pool keeps a keyframe's cost small per event; the cap bounds a read's replay
# (`python -m bench history` measures both).
KEYFRAME_EVENTS = 131_072
EVENTS_PER_KEYFRAME_BLOCK = 4


class History:
    """Every event of one pool since the history was attached to it (or since the oldest kept
    keyframe), packed. Made on a pool, it attaches itself as the pool's extension "history"
    (`pool.history`; a new one replaces the old) and drains the pool's event ring from then on.

    The pool's EventLog ring holds the newest events; before it would drop one, the log calls
    `spill()`, which takes the ring's unconsumed events as compact columns into a `Segment`
    (EventRing.export: no Python object per compiled event) and, every
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
        positive_int(max_bytes, "history_bytes")
        positive_int(page_blocks, "page_blocks")
        if keyframe_every is not None:
            positive_int(keyframe_every, "keyframe_every")
        self.pool = pool
        self.page_blocks = page_blocks
        self.max_bytes = max_bytes
        # Events recorded from Python (contiguous, tiered) replay far slower than compiled
        # ones: keyframes four times as often keep their reads about as fast.
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
        self._add_keyframe(self._snapshot(first=True))
        self.attached = True
        old = pool.history
        if old is not None:
            old.detach()
        pool.events.sink = self
        pool.attach("history", self)
        self._arm()

    # -- as the pool's extension -----------------------------------------------------------------
    def on_pool_reset(self) -> None:
        """Nothing to do: the pool's `reset` event replays as "every block free"."""

    def stats(self) -> None:
        """Nothing under the pool's stats (its own figures: `info()`, GET .../history)."""
        return None

    def detach(self) -> None:
        """Stop keeping the pool's events (`pool.history = None`, or a new History on the pool):
        the ring's events so far are taken in, and the history stays readable as it is then."""
        if not self.attached:
            return
        events = self.pool.events
        if events.sink is self:
            self.spill()
            events.sink = None
        self.attached = False

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

    def _snapshot(self, reuse: bool = False, first: bool = False) -> Keyframe:
        """A keyframe of the pool now. With `reuse` (the history's own keyframes, taken in
        order), pages unchanged since the previous one are shared with it: the block map's
        chunk stamps (BlockMap.changes_since, a reader of its own) say which changed. `first`
        (the history's first) on a pool that has recorded no event yet: its map is the one it
        was made with (every change to the map records an event), every block free, so every
        full page is the same and is compressed once."""
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
        owner, state = bm.owners_np(), bm.states_np()
        uniform = first and p.events.last_seq == 0
        kf = keyframe_of(p.events.last_seq, owner, state, p.requested_total, len(p), last_id, p._frees,
                         [p.counters[n] for n in COUNTER_NAMES], dirty, base, self.page_blocks,
                         uniform=uniform, cache=figures)
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
            shared = unique_bytes(mine) - unique_bytes(mine, nxt.owner_pages + nxt.state_pages)
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
            tail=p.events.raw_after(self.consumed) if self.attached else [], last_seq=self.last_seq,
            dropped_events=self.dropped_events)

    @property
    def last_seq(self) -> int:
        """The newest event kept: the pool's newest while attached."""
        return self.pool.events.last_seq if self.attached else self.consumed

    def info(self) -> dict:
        return {"first_seq": self.first_seq, "last_seq": self.last_seq,
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
    """One event's values with ranges as (start, stop) (a range pickles far slower)."""
    if range in map(type, values):
        return tuple((v.start, v.stop) if v.__class__ is range else v for v in values)
    return values


__all__ = ["DEFAULT_HISTORY_BYTES", "History", "pool_geometry"]
