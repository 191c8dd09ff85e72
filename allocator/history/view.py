"""HistoryView: a frozen history (a live pool's snapshot or a recording) read at any kept event:
the block map, the stats and the events then."""

from __future__ import annotations

import gc
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from .._core import map_summary
from ..errors import Conflict, NotFound
from ..pools.blockmap import CACHED, FREE, NO_OWNER, PINNED, STATE_NAMES
from ..pools.events import event_dict
from ..pools.metrics import fragmentation_stats
from .columns import KIND, SEQ, TS, EventColumns
from .keyframes import Keyframe
from .replay import Replayer
from .segments import Segment, replayable


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


__all__ = ["HistoryView", "OutsideHistory", "cache_stats_of", "map_runs", "stats_of"]
