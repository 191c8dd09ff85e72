"""Exports of a pool's history: a PyTorch memory snapshot for memory_viz, and CSV of events."""

from __future__ import annotations

import csv
import io
import json
import pickle

import numpy as np

from ..pools.blockmap import NO_OWNER
from ..pools.events import BLOCK_FIELDS, block_list, event_dict
from ..vocab import EVENT_FIELDS
from .columns import KIND, ROW, SEQ, TS
from .replay import Replayer
from .view import HistoryView

_ALLOCATE, _FREE, _OOM = ROW["allocate"], ROW["free"], ROW["oom"]

# Where the pool's segment starts in the snapshot's address space (any page-aligned value).
BASE_ADDRESS = 0x7F00_0000_0000
DEFAULT_MAX_EVENTS = 200_000


def _runs(rows) -> list[tuple[int, int]]:
    """(start, count) runs of consecutive ascending rows of a sorted sequence."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][0] + out[-1][1] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return [(s, c) for s, c in out]


class _Trace:
    """Builds `device_traces[0]`: each allocation is traced as one `alloc` per run of its rows;
    any change to an allocation's rows frees its runs and allocates the new ones, so every
    `free_completed` names the address and size of an earlier `alloc` (memory_viz pairs them
    by address)."""

    def __init__(self, block_bytes: int) -> None:
        self.bb = block_bytes
        self.rows_of: dict[int, list[int]] = {}
        self.requested_of: dict[int, int] = {}
        self.entries: list[dict] = []

    def _emit(self, action: str, aid: int, ts: float, seq: int) -> None:
        for start, count in _runs(self.rows_of.get(aid, ())):
            e = {"action": action, "addr": BASE_ADDRESS + start * self.bb, "size": count * self.bb,
                 "stream": 0, "frames": [{"filename": "kvscope", "line": seq, "name": f"allocation {aid}"}],
                 "time_us": int(ts * 1e6), "device_free": 0}
            self.entries.append(e)

    def alloc(self, aid: int, rows, ts: float, seq: int) -> None:
        self.rows_of[aid] = sorted(rows)
        self._emit("alloc", aid, ts, seq)

    def free(self, aid: int, ts: float, seq: int) -> None:
        self._emit("free_requested", aid, ts, seq)
        self._emit("free_completed", aid, ts, seq)
        self.rows_of.pop(aid, None)
        self.requested_of.pop(aid, None)

    def change(self, aid: int, rows, ts: float, seq: int) -> None:
        requested = self.requested_of.get(aid)
        self.free(aid, ts, seq)
        if requested is not None:
            self.requested_of[aid] = requested
        self.alloc(aid, rows, ts, seq)


def memory_snapshot_dict(view: HistoryView, max_events: int = DEFAULT_MAX_EVENTS) -> dict:
    """The kept history (its last `max_events` events at most) shaped like
    `torch.cuda.memory._snapshot()`: one segment covering the pool, whose blocks are the final
    map's runs, and `device_traces[0]` with `alloc` / `free_requested` / `free_completed` (and
    `oom`) actions. Allocations live when the window opens are traced as allocated at its start."""
    geo = view.geometry
    bb, n = geo["block_bytes"], geo["num_blocks"]
    start = max(view.first_seq, view.last_seq - max_events)
    rep: Replayer = view.replay_to(start)
    trace = _Trace(bb)
    first_ts = None
    rows_iter = list(view.rows(start, view.last_seq))
    if rows_iter:
        first_ts = rows_iter[0][TS]
    owners = rep.owner
    live = np.flatnonzero(owners != NO_OWNER)
    if live.size:
        order = np.argsort(owners[live], kind="stable")
        ids, cuts = np.unique(owners[live][order], return_index=True)
        for aid, rows in zip(ids.tolist(), np.split(live[order], cuts[1:])):
            trace.alloc(aid, rows.tolist(), first_ts or 0.0, start)
    for row in rows_iter:
        seq, ts, kind = row[SEQ], row[TS], row[KIND]
        ev = None
        if kind == "allocate":
            ev = event_dict(row)
            trace.requested_of[row[_ALLOCATE.id]] = row[_ALLOCATE.requested_bytes]
            trace.alloc(row[_ALLOCATE.id], ev["block_ids"], ts, seq)
        elif kind == "free":
            trace.free(row[_FREE.id], ts, seq)
        elif kind in ("extend", "truncate"):
            ev = event_dict(row)
            aid = ev["id"]
            rows = set(trace.rows_of.get(aid, ()))
            if kind == "extend":
                rows -= set(ev["freed_ids"])
                rows |= set(ev["block_ids"])
            else:
                rows -= set(ev["block_ids"])
            trace.requested_of[aid] = ev["requested_bytes"]
            trace.change(aid, rows, ts, seq)
        elif kind == "defragment":
            before = rep.owner.copy()
            rep.apply(row)
            moved = np.flatnonzero(before != rep.owner)
            touched = set(before[moved].tolist()) | set(rep.owner[moved].tolist())
            touched.discard(NO_OWNER)
            requested = {aid: trace.requested_of.get(aid) for aid in touched}
            for aid in sorted(touched):  # every moved allocation freed first, then placed anew
                trace.free(aid, ts, seq)
            for aid in sorted(touched):
                if requested[aid] is not None:
                    trace.requested_of[aid] = requested[aid]
                trace.alloc(aid, np.flatnonzero(rep.owner == aid).tolist(), ts, seq)
            continue
        elif kind == "reset":
            for aid in list(trace.rows_of):
                trace.free(aid, ts, seq)
        elif kind == "oom":
            trace.entries.append({"action": "oom", "addr": 0, "size": row[_OOM.requested_bytes], "stream": 0,
                                  "frames": [], "time_us": int(ts * 1e6), "device_free": row[_OOM.free_bytes]})
        rep.apply(row)
    # The final map as the segment's blocks: one block per run of one owner.
    owner = rep.owner
    change = np.flatnonzero(owner[1:] != owner[:-1]) + 1
    starts = np.concatenate(([0], change)).tolist()
    ends = starts[1:] + [n]
    waste = {aid: len(rows) * bb - trace.requested_of[aid] for aid, rows in trace.rows_of.items()
             if aid in trace.requested_of}
    blocks = []
    for s, e in reversed(list(zip(starts, ends))):  # from the top, so waste lands on last runs
        aid = int(owner[s])
        size = (e - s) * bb
        block = {"address": BASE_ADDRESS + s * bb, "size": size, "frames": []}
        if aid == NO_OWNER:
            block.update(state="inactive", requested_size=0)
        else:
            w = min(waste.get(aid, 0), size)
            waste[aid] = waste.get(aid, 0) - w
            block.update(state="active_allocated", requested_size=size - w,
                         frames=[{"filename": "kvscope", "line": 0, "name": f"allocation {aid}"}])
        blocks.append(block)
    blocks.reverse()
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    segment = {
        "device": 0, "address": BASE_ADDRESS, "total_size": n * bb, "allocated_size": active,
        "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks),
        "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [], "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace.entries],
            "allocator_settings": {}, "kvscope": {"geometry": geo, "first_seq": start, "last_seq": view.last_seq}}


def memory_snapshot(view: HistoryView, name: str = "pool", max_events: int = DEFAULT_MAX_EVENTS) -> bytes:
    """`memory_snapshot_dict` pickled with protocol 4, as `torch.cuda.memory._dump_snapshot` writes."""
    data = memory_snapshot_dict(view, max_events)
    data["kvscope"]["pool"] = name
    return pickle.dumps(data, protocol=4)


CSV_COLUMNS: tuple[str, ...] = ("seq", "ts", "type") + tuple(dict.fromkeys(
    f for fields in EVENT_FIELDS.values() for f in fields))


def _cell(name: str, value) -> object:
    if value is None:
        return ""
    if name in BLOCK_FIELDS:
        return " ".join(map(str, block_list(value) if not isinstance(value, list) else value))
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"))
    return value


def events_csv(view: HistoryView) -> str:
    """Every kept event as CSV: seq, ts, type, then the union of all kinds' fields (empty where
    a kind has no such field; block ids space-separated; dicts and lists as JSON)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for row in view.rows(view.first_seq, view.last_seq):
        ev = event_dict(row)
        w.writerow([_cell(c, ev.get(c)) for c in CSV_COLUMNS])
    return buf.getvalue()


__all__ = ["CSV_COLUMNS", "events_csv", "memory_snapshot", "memory_snapshot_dict"]
