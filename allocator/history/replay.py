"""Replayer: a block map and a pool's numbers rolled forward over stored events.

What each kind of event does is written once, as its handler in `HANDLERS`: the block writes it
makes (`write(ids, owner or None to keep it, state)`) and the numbers it moves. Every way of
replaying goes through those handlers: `apply` (one row, written at once), `apply_rows` (many
rows, their writes gathered and applied vectorised, the last write per block winning) and
`apply_columns` (a segment's columns: allocate and free in compiled code, `replay_columns`,
which must agree with their handlers, and every other kind that changes the map through its
handler, in order).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from .._core import replay_columns, rows_of_columns2
from ..pools.blockmap import CACHED, FREE, NO_OWNER, SHARED, USED
from ..pools.events import packed_list
from ..vocab import EVICTION_REASONS
from .columns import (
    CODE_MASK,
    COUNTER_NAMES,
    FLAG_KEY,
    FLAG_OBJ,
    KIND,
    NVALS,
    ROW,
    SEQ,
    EventColumns,
    value_at,
    wide_at,
)

if TYPE_CHECKING:
    from .keyframes import Keyframe

# Kinds whose handlers leave the map and the numbers alone (the cache's own figures aside):
# the compiled replay does not stop at them. Every other Python-recorded kind stops it and
# goes through its handler (the safe default for a new kind).
UNREPLAYED_KINDS = frozenset({"put", "hit", "miss", "remove", "evict", "policy", "workload"})
# Kinds that move the cache's own figures.
CACHE_KINDS = frozenset({"hit", "miss", "evict", "policy", "put"})
# Kinds of prefix caching and mirrors.
PREFIX_KINDS = frozenset(("stored", "removed", "cleared", "open", "append", "close"))


def _field(row: tuple, i: int):
    """row[i], or None when a (recorded) event is shorter than its kind."""
    return row[i] if len(row) > i else None


# -- block-id fields ---------------------------------------------------------------------------
def _index(value) -> np.ndarray | slice | int | None:
    """A stored block-id field (allocator/pools/events.py BLOCK_FIELDS) as an index for numpy."""
    if value is None:
        return None
    cls = value.__class__
    if cls is int:
        return value
    if cls is bytes:
        return np.frombuffer(value, dtype=np.int32) if value else None
    if cls is range:
        return slice(value.start, value.stop)
    if cls is tuple:  # a packed range: (start, stop)
        return slice(*value)
    return np.asarray(value, dtype=np.int64) if len(value) else None


def _count(value) -> int:
    """How many block ids a stored block-id field names."""
    if value is None:
        return 0
    cls = value.__class__
    if cls is int:
        return 1
    if cls is bytes:
        return len(value) // 4
    if cls is tuple:  # a packed range: (start, stop)
        start, stop = value
        return stop - start
    return len(value)


_pack_i = struct.Struct("=i").pack
# int32 0, 1, 2, ... as native bytes, grown on demand: the ids of a range are a slice of it
# (a copy of its bytes, ~15x cheaper than building them with np.arange).
_iota = b""
IOTA_MAX = 1 << 24  # ranges reaching past this many blocks are built as they come


def _range_bytes(start: int, stop: int) -> bytes:
    """The ids start..stop-1 as native int32 bytes."""
    global _iota
    if 0 <= start <= stop <= IOTA_MAX:
        if stop * 4 > len(_iota):
            _iota = np.arange(min(IOTA_MAX, max(stop, 2 * len(_iota) // 4, 1 << 16)), dtype=np.int32).tobytes()
        return _iota[start * 4:stop * 4]
    return np.arange(start, stop, dtype=np.int32).tobytes()


def _ids_bytes(value) -> bytes:
    """A stored block-id field as native int32 bytes."""
    cls = value.__class__
    if cls is bytes:
        return value
    if cls is int:
        return _pack_i(value)
    if cls is range:
        return _range_bytes(value.start, value.stop)
    if cls is tuple:  # a packed range: (start, stop)
        start, stop = value
        return _range_bytes(start, stop)
    return np.asarray(value, dtype=np.int32).tobytes()


def _id_seq(value):
    """A prefix event's `blocks` (native int32 bytes from the core, a list from a mirror or an
    older recording, or None) as something to iterate over."""
    return packed_list(value) or ()


def _last_write(target: np.ndarray, pieces: list, lens: list, vals: list) -> None:
    """target[i] = the value of the last write to i, for writes given as (ids, value) in order."""
    if not pieces:
        return
    idx = np.frombuffer(b"".join(pieces), dtype=np.int32)
    values = np.repeat(np.asarray(vals, dtype=target.dtype if target.dtype != np.uint8 else np.int64), lens)
    last = np.full(target.size, -1, dtype=np.int64)
    np.maximum.at(last, idx, np.arange(idx.size, dtype=np.int64))
    hit = np.flatnonzero(last >= 0)
    target[hit] = values[last[hit]]


# -- what each kind does: handler(rep, row, write, flush) ---------------------------------------
# `write(ids, owner, state)` writes blocks (owner None: keep each block's owner); `flush()` makes
# the writes so far land before a handler that reads or rewrites the whole map (defragment,
# reset). Rows recorded by an earlier build may lack the fields added since (at the end).

def _allocate(rep: Replayer, row: tuple, write, flush, f=ROW["allocate"]) -> None:
    aid = row[f.id]
    write(row[f.block_ids], aid, row[f.state])
    rep.requested += row[f.requested_bytes]
    rep.allocations += 1
    if aid > rep.last_id:
        rep.last_id = aid


def _free(rep: Replayer, row: tuple, write, flush, f=ROW["free"]) -> None:
    write(row[f.block_ids], NO_OWNER, FREE)
    rep.requested -= row[f.requested_bytes]
    rep.allocations -= 1
    rep.frees += 1


def _extend(rep: Replayer, row: tuple, write, flush, f=ROW["extend"]) -> None:
    freed = row[f.freed_ids]
    if freed is not None:  # the data moved: the blocks it left went free
        write(freed, NO_OWNER, FREE)
        rep.counters["moves"] += 1
        rep.counters["moved_blocks"] += _count(freed)
    write(row[f.block_ids], row[f.id], row[f.state])
    rep.requested += row[f.added_bytes]
    rep.counters["extends"] += 1


def _truncate(rep: Replayer, row: tuple, write, flush, f=ROW["truncate"]) -> None:
    write(row[f.block_ids], NO_OWNER, FREE)
    rep.requested -= row[f.removed_bytes]
    rep.counters["truncates"] += 1


def _state(rep: Replayer, row: tuple, write, flush, f=ROW["state"]) -> None:
    write(row[f.block_ids], None, row[f.state])


def _defragment(rep: Replayer, row: tuple, write, flush, f=ROW["defragment"]) -> None:
    flush()  # the moves read the map as the events before left it
    owner, state = rep.owner, rep.state
    for src, dst, n in row[f.moves] or ():  # (src, dst, count) runs, applied in order
        o, st = owner[src:src + n].copy(), state[src:src + n].copy()
        owner[src:src + n] = NO_OWNER
        state[src:src + n] = FREE
        owner[dst:dst + n] = o
        state[dst:dst + n] = st
    rep.counters["defragmentations"] += 1
    rep.counters["moved_blocks"] += row[f.moved_blocks]
    rep.counters["moves"] += _field(row, f.moved_allocations) or 0


def _reset(rep: Replayer, row: tuple, write, flush) -> None:
    flush()  # (writes still gathered would land after the reset)
    rep.owner[:] = NO_OWNER
    rep.state[:] = FREE
    rep.requested = 0
    rep.allocations = 0


def _oom(rep: Replayer, row: tuple, write, flush, f=ROW["oom"]) -> None:
    rep.counters["ooms_" + row[f.cause]] += 1


def _hit(rep: Replayer, row: tuple, write, flush) -> None:
    if rep.cache is not None:
        rep.cache["hits"] += 1


def _miss(rep: Replayer, row: tuple, write, flush) -> None:
    if rep.cache is not None:
        rep.cache["misses"] += 1


def _evict(rep: Replayer, row: tuple, write, flush, f=ROW["evict"]) -> None:
    if rep.cache is not None:
        _count_eviction(rep.cache, _field(row, f.reason))


def _put(rep: Replayer, row: tuple, write, flush, f=ROW["put"]) -> None:
    if rep.cache is not None:
        _add_id(rep.cache, _field(row, f.id))


def _policy(rep: Replayer, row: tuple, write, flush, f=ROW["policy"]) -> None:
    policy = _field(row, f.policy)
    if rep.cache is not None and isinstance(policy, str):
        rep.cache["policy"] = policy


# Prefix-cache events: `stored` places blocks with the owners and state it carries (a
# mirror's; a prefix-caching pool's stored blocks are already its sequences'); `removed` frees
# the blocks it names unless `taken_by` took them (that event placed them); `cleared` frees its
# `freed_ids`, else every block named; open / append / close place a sequence's blocks as their
# fields say (allocator/vocab.py). Recorded before those fields existed, they place nothing.

def _open(rep: Replayer, row: tuple, write, flush, f=ROW["open"]) -> None:
    if len(row) > f.added_bytes:
        blocks, shared = row[f.blocks], row[f.shared_ids]
        if shared is not None:
            held = set(np.frombuffer(shared, dtype=np.int32).tolist())
            blocks = [b for b in _id_seq(blocks) if b not in held]
        write(blocks, row[f.seq_id], USED)
        if shared is not None:
            write(shared, None, SHARED)
        rep.requested += row[f.added_bytes]
    if row[f.seq_id] > rep.last_id:
        rep.last_id = row[f.seq_id]


def _append(rep: Replayer, row: tuple, write, flush, f=ROW["append"]) -> None:
    if len(row) > f.added_bytes:
        write(row[f.blocks], row[f.seq_id], USED)
        rep.requested += row[f.added_bytes]


def _close(rep: Replayer, row: tuple, write, flush, f=ROW["close"]) -> None:
    if len(row) > f.added_bytes:
        write(row[f.freed_ids], NO_OWNER, FREE)
        write(row[f.cached_ids], None, CACHED)
        write(row[f.used_ids], None, USED)
        rep.requested += row[f.added_bytes]


def _stored(rep: Replayer, row: tuple, write, flush, f=ROW["stored"]) -> None:
    if len(row) <= f.state:  # a prefix-caching pool's (or recorded before `owners` / `state`)
        return
    state = row[f.state]
    for b, o in zip(_id_seq(row[f.blocks]), row[f.owners]):
        if b >= 0:
            write(b, o, state)


def _removed(rep: Replayer, row: tuple, write, flush, f=ROW["removed"]) -> None:
    taken_by = _field(row, f.taken_by)
    if taken_by is not None:
        if taken_by > rep.last_id:
            rep.last_id = taken_by
    else:
        write([b for b in _id_seq(row[f.blocks]) if b >= 0], NO_OWNER, FREE)


def _cleared(rep: Replayer, row: tuple, write, flush, f=ROW["cleared"]) -> None:
    freed = _field(row, f.freed_ids)
    if freed is None:
        freed = [b for b in _id_seq(row[f.blocks]) if b >= 0]
    write(freed, NO_OWNER, FREE)


HANDLERS = {"allocate": _allocate, "free": _free, "extend": _extend, "truncate": _truncate,
            "state": _state, "defragment": _defragment, "reset": _reset, "oom": _oom,
            "hit": _hit, "miss": _miss, "evict": _evict, "put": _put, "policy": _policy,
            "open": _open, "append": _append, "close": _close, "stored": _stored,
            "removed": _removed, "cleared": _cleared}
# Kinds that change nothing a replay keeps (a cache `remove` frees through the `free` it causes).
NO_EFFECT_KINDS = frozenset({"remove", "workload"})


def _nothing() -> None:
    pass


def _ignore(rep: Replayer, row: tuple, write, flush) -> None:
    pass


# -- the cache's own figures ---------------------------------------------------------------------
def _count_eviction(cache: dict, reason) -> None:
    if isinstance(reason, str):  # a file's event may name anything: count only a reason
        cache["evictions"][reason] = cache["evictions"].get(reason, 0) + 1


def _add_id(cache: dict, aid) -> None:
    if type(aid) is int and 0 < aid < 1 << 63:  # an allocation id (a file's event may hold anything)
        cache["ids"].add(aid)


# Where the figures the cache counts sit: among a keyed event's `wide` values, and among a
# Python-recorded event's values.
_EVICT_REASON = (wide_at("evict", "reason"), value_at("evict", "reason"))
_PUT_ID = (wide_at("put", "id"), value_at("put", "id"))
_POLICY_NAME = value_at("policy", "policy")


class Replayer:
    """Block map and numbers being rolled forward one stored event at a time."""

    __slots__ = ("owner", "state", "requested", "allocations", "last_id", "frees", "counters", "seq",
                 "cache")

    def __init__(self, kf: Keyframe) -> None:
        self.owner, self.state = kf.arrays()
        self.requested, self.allocations, self.last_id, self.frees = (
            kf.requested, kf.allocations, kf.last_id, kf.frees)
        self.counters = dict(zip(COUNTER_NAMES, kf.counters))
        # The cache's figures (None: the pool had no cache at the keyframe): rolled forward by
        # hit / miss / evict / policy / put events.
        self.cache = self.cache_of(kf)
        self.seq = kf.seq

    @staticmethod
    def cache_of(kf: Keyframe) -> dict | None:
        """A keyframe's cache figures as the replay rolls them, or None."""
        c = kf.cache
        if c is None:
            return None
        return {"policy": c.policy, "capacity_bytes": c.capacity_bytes, "hits": c.hits,
                "misses": c.misses, "evictions": dict(zip(EVICTION_REASONS, c.evictions)),
                # allocation ids that held an entry since the keyframe (ids are never reused:
                # one whose blocks are gone was evicted or removed)
                "ids": set(np.frombuffer(c.entry_ids, dtype=np.int64).tolist())}

    # -- rows ----------------------------------------------------------------------------------
    def _write_now(self, ids, owner, state) -> None:
        idx = _index(ids)
        if idx is None:
            return
        if owner is not None:
            self.owner[idx] = owner
        self.state[idx] = state

    def apply(self, row: tuple) -> None:
        """One stored row, its writes made at once."""
        handler = HANDLERS.get(row[KIND])
        if handler is not None:
            handler(self, row, self._write_now, _nothing)
        self.seq = row[SEQ]

    def apply_rows(self, rows) -> None:
        """Many stored rows in order, vectorised: block writes are gathered as int32 bytes and,
        per block, the last write wins (np.maximum.at over write order); a handler that reads
        or rewrites the whole map (defragment, reset) flushes what came before it. Same
        result as `apply` row by row."""
        opieces, olens, ovals = [], [], []  # owner writes
        spieces, slens, svals = [], [], []  # state writes (every write sets the state)

        def write(value, own, st) -> None:
            if value is None:
                return
            piece = _ids_bytes(value)
            if not piece:
                return
            k = len(piece) >> 2
            if own is not None:
                opieces.append(piece)
                olens.append(k)
                ovals.append(own)
            spieces.append(piece)
            slens.append(k)
            svals.append(st)

        def flush() -> None:
            _last_write(self.owner, opieces, olens, ovals)
            _last_write(self.state, spieces, slens, svals)
            for lst in (opieces, olens, ovals, spieces, slens, svals):
                lst.clear()

        seq = self.seq
        handlers, kind_at, seq_at = HANDLERS, KIND, SEQ
        for row in rows:
            try:
                handler = handlers[row[kind_at]]
            except KeyError:  # a kind that changes nothing a replay keeps
                handler = _ignore
            handler(self, row, write, flush)
            seq = row[seq_at]
        flush()
        self.seq = seq

    # -- columns -------------------------------------------------------------------------------
    def apply_columns(self, cols: EventColumns, after: int, upto: int) -> None:
        """The events of a segment with after < seq <= upto: allocate and free in compiled
        code (allocator/_events.pxi replay_columns), every other kind that changes the map
        through its handler, in order; the cache's figures counted from the kind column. A
        segment of mostly Python-recorded events goes through `apply_rows` instead. Same
        result as `apply` row by row."""
        if cols.mostly_python():
            self.apply_rows(r for r in rows_of_columns2(cols) if after < r[SEQ] <= upto)
            self.seq = min(upto, cols.last)
            return
        if self.cache is not None:
            self._count_cache_columns(cols, after, upto)
        names = cols.names
        # The compiled replay's running numbers, in the order it keeps them.
        acc = np.array([self.requested, self.allocations, self.last_id, self.frees], dtype=np.int64)
        pos = np.zeros(5, dtype=np.int64)  # where it stopped: event, numeric, ids, keyed, obj
        stop_at = np.frombuffer(bytes(n not in UNREPLAYED_KINDS for n in names) + bytes(64 - len(names)),
                                dtype=np.uint8)
        ts = None
        while True:
            i = replay_columns(cols, self.owner, self.state, after, upto, acc, pos, stop_at)
            if i < 0:
                break
            self.requested, self.allocations, self.last_id, self.frees = acc.tolist()
            if ts is None:
                ts = np.frombuffer(cols.ts, dtype=np.float64)
            kind = names[cols.kind[i] & CODE_MASK]
            self.apply((cols.first + i, float(ts[i]), kind) + tuple(cols.objs[pos[4] - 1]))
            acc[:] = (self.requested, self.allocations, self.last_id, self.frees)
        self.requested, self.allocations, self.last_id, self.frees = acc.tolist()
        self.seq = min(upto, cols.last)

    def _count_cache_columns(self, cols: EventColumns, after: int, upto: int) -> None:
        """The cache's figures over a segment's events after < seq <= upto, counted from the
        kind column as the cache handlers count them row by row (the compiled replay does not
        stop at these kinds)."""
        first = cols.first
        lo, hi = max(after + 1, first) - first, min(upto, cols.last) - first + 1
        if hi <= lo:
            return
        names, c = cols.names, self.cache
        kind = np.frombuffer(cols.kind, dtype=np.uint8)
        codes = kind[lo:hi] & CODE_MASK
        for name, figure in (("hit", "hits"), ("miss", "misses")):
            if name in names:
                c[figure] += int(np.count_nonzero(codes == names.index(name)))
        is_obj = (kind & FLAG_OBJ) != 0
        is_key = ((kind & FLAG_KEY) != 0) & ~is_obj
        key_index = np.cumsum(is_key) - 1  # of each event: its place among the keyed events
        obj_index = np.cumsum(is_obj) - 1  # ... and among the Python-recorded ones
        wide = np.frombuffer(cols.wide, dtype=np.int64)
        for name, (in_wide, in_values) in (("evict", _EVICT_REASON), ("put", _PUT_ID)):
            if name not in names:
                continue
            at = np.flatnonzero(codes == names.index(name)) + lo
            keyed = at[is_key[at]]
            values = wide[key_index[keyed] * NVALS + in_wide]
            objs = [_field(cols.objs[obj_index[i]], in_values) for i in at[is_obj[at]].tolist()]
            if name == "evict":  # the reason: an index into the string table
                sids, n = np.unique(values, return_counts=True)
                for sid, k in zip(sids.tolist(), n.tolist()):
                    reason = cols.strings[sid]
                    c["evictions"][reason] = c["evictions"].get(reason, 0) + k
                for reason in objs:
                    _count_eviction(c, reason)
            else:  # the allocation id
                c["ids"].update(values.tolist())
                for aid in objs:
                    _add_id(c, aid)
        if "policy" in names:
            at = np.flatnonzero(codes == names.index("policy"))
            if at.size:
                i = int(at[-1]) + lo
                policy = _field(cols.objs[int(np.count_nonzero(is_obj[:i]))], _POLICY_NAME)
                if isinstance(policy, str):
                    c["policy"] = policy


__all__ = ["CACHE_KINDS", "HANDLERS", "NO_EFFECT_KINDS", "PREFIX_KINDS", "Replayer", "UNREPLAYED_KINDS"]
