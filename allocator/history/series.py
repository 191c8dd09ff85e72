"""Series: the figures a pool's charts plot, sampled over a stretch of its kept history."""

from __future__ import annotations

from ..errors import InvalidRequest
from .columns import TS
from .view import HistoryView, stats_of

# At most this many points per series: a point costs one stats_of (a pass over the map), and a
# chart a few hundred pixels wide shows no more.
MAX_POINTS = 2000
DEFAULT_POINTS = 300
# Per point: seq and ts of its event, then Pool.stats() figures, then event counts since the
# previous point (0 at the first): the charts' evictions/s and hit rate need only those.
STATS_FIELDS = ("utilization", "internal_fragmentation", "external_fragmentation", "requested_bytes",
                "allocated_bytes", "used_blocks", "free_blocks", "largest_free_bytes", "allocation_count")
COUNT_KINDS = {"evict": "evictions", "hit": "hits", "miss": "misses"}
# The cache's lifetime hit rate at each point (what the live chart plots), null where the history
# holds no cache figures (before the first keyframe taken with the cache on).
FIELDS = ("seq", "ts", *STATS_FIELDS, "ooms_capacity", "ooms_fragmentation", *COUNT_KINDS.values(),
          "cache_hit_rate")


def sample_seqs(first: int, last: int, points: int) -> list[int]:
    """Up to `points` evenly spaced seqs from `first` to `last`, both ends included (only
    `last` for a single point), strictly increasing."""
    if last - first + 1 <= points:
        return list(range(first, last + 1))
    if points == 1:
        return [last]
    span = last - first
    return [first + i * span // (points - 1) for i in range(points)]


def history_series(view: HistoryView, from_seq: int, to_seq: int, points: int = DEFAULT_POINTS) -> dict:
    """Columns (FIELDS, one value per point) at up to `points` evenly spaced seqs of
    from_seq..to_seq. The map is replayed once from the keyframe before `from_seq` and then
    rolled forward from each point to the next, so the whole costs about one replay of the
    stretch plus one stats pass per point. `ts` is null where the event is not kept (the
    keyframe at the history's start). Raises OutsideHistory, InvalidRequest."""
    view.check_seq(from_seq)
    view.check_seq(to_seq)
    if from_seq > to_seq:
        raise InvalidRequest(f"from_seq {from_seq} is after to_seq {to_seq}")
    if not 1 <= points <= MAX_POINTS:
        raise InvalidRequest(f"points must be 1..{MAX_POINTS}, not {points}")
    seqs = sample_seqs(from_seq, to_seq, points)
    cols: dict[str, list] = {name: [] for name in FIELDS}
    rep = view.replay_to(seqs[0])
    columns: dict = {}  # each segment decoded once for the whole series
    head = next(view.rows(seqs[0] - 1, seqs[0]), None) if seqs[0] > view.first_seq else None
    _add_point(cols, view.geometry, rep, head[TS] if head else None, dict.fromkeys(COUNT_KINDS, 0))
    for target in seqs[1:]:
        counts, ts = view.advance(rep, target, tuple(COUNT_KINDS), columns)
        _add_point(cols, view.geometry, rep, ts, counts)
    return {"from_seq": from_seq, "to_seq": to_seq, "points": len(seqs), "first_seq": view.first_seq,
            "last_seq": view.last_seq, "columns": cols}


def _add_point(cols: dict, geometry: dict, rep, ts: float | None, counts: dict) -> None:
    stats = stats_of(geometry, rep)
    cols["seq"].append(rep.seq)
    cols["ts"].append(ts)
    for name in STATS_FIELDS:
        cols[name].append(stats[name])
    cols["ooms_capacity"].append(stats["ooms"]["capacity"])
    cols["ooms_fragmentation"].append(stats["ooms"]["fragmentation"])
    for kind, name in COUNT_KINDS.items():
        cols[name].append(counts[kind])
    cols["cache_hit_rate"].append(stats["cache"]["hit_rate"] if "cache" in stats else None)


__all__ = ["DEFAULT_POINTS", "FIELDS", "MAX_POINTS", "history_series", "sample_seqs"]
