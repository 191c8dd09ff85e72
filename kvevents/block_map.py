"""The Fleet view's block maps (GET /api/fleets/{fleet}/blocks): per engine the colour group of
each block it holds, the largest groups with the engine sets holding them, parent-hash cycles.

`BlockMap` keeps one answer while the index it was computed from is unchanged; `blocks_maps`
writes it from a compiled layout (`layout_of`); `Maps.only` cuts the maps of some engines from
it without another layout.
"""

from __future__ import annotations

import json
import time

import numpy as np

from .index import FleetIndex, engine_color_lists, layout_of, snapshot_buffers, snapshot_fits

MAX_MAP_BLOCKS = 65_536  # an engine's map lists at most this many blocks
MAX_MAP_TOTAL = 64 * MAX_MAP_BLOCKS  # ... and all engines' maps together at most this many
TOP_PREFIXES = 12
TOP_SETS = 12  # the engine sets listed per prefix (the largest)
SUBSET_SET_NAMES = 8  # ... each naming at most this many engines in the maps of a subset


class BlockMap:
    """The page's block maps of one fleet (GET /api/fleets/{fleet}/blocks), kept while the index
    is unchanged. `snapshot(index)`, where changes run, copies the index's arrays (memcpy
    speed); `compute(job)`, in any thread, lays them out (compiled, without the GIL: bounded by
    the nodes however the parents loop) and writes the JSON. One computation at a time: the
    server shares `inflight` among the clients asking meanwhile. The parent-hash cycles found
    by the last computation are each engine's `parent_cycles`."""

    def __init__(self) -> None:
        self.version: int | None = None  # the index's version the body was computed at
        self.maps = Maps(b"", {})
        self.cycle_blocks: dict[str, int] = {}
        self.cycles = 0
        self.inflight = None  # the computation under way (the server's task)
        self.computations = 0
        self.longest_snapshot_s = 0.0  # CPU time of the longest snapshot (taken on the loop)
        self._snap = None

    def current(self, index: FleetIndex) -> bool:
        return self.version is not None and self.version == index.version()

    def reserve(self, sizes: tuple[int, int]) -> None:
        """Allocate (and touch, so no page fault is left for the copy) buffers for a snapshot of
        `index.snapshot_sizes()` with room to grow: in any thread, not during a computation."""
        if not snapshot_fits(self._snap, sizes):
            self._snap = snapshot_buffers(sizes)

    def snapshot(self, index: FleetIndex) -> tuple:
        """What `compute` needs: call where changes run, never while a computation is under way
        (its arrays are reused)."""
        cpu0 = time.thread_time()
        self._snap = index.snapshot(self._snap)
        self.longest_snapshot_s = max(self.longest_snapshot_s, time.thread_time() - cpu0)
        names = {info.eid: name for name, info in index.engines.items()}
        return index.version(), self._snap, names

    @property
    def body(self) -> bytes:
        return self.maps.body

    def compute(self, job: tuple) -> Maps:
        version, snap, names = job
        lay = layout_of(snap)
        maps = blocks_maps(lay, names, version)
        self.cycle_blocks = {n: int(lay.cycle_blocks[e]) for e, n in names.items() if lay.cycle_blocks[e]}
        self.cycles = int(lay.cycles)
        self.version, self.maps = version, maps
        self.computations += 1
        return maps


class Maps:
    """One /blocks answer: its JSON `body` (every engine's map) and where each engine's map
    sits in it, so the maps of some engines are cut from it (`only`) without another layout."""

    __slots__ = ("body", "cycles", "small_head", "spans")

    def __init__(self, body: bytes, spans: dict[str, tuple[int, int]], small_head: bytes = b"{",
                 cycles: dict[str, int] | None = None) -> None:
        self.body, self.spans, self.small_head, self.cycles = body, spans, small_head, cycles or {}

    def only(self, names) -> bytes:
        """The answer for `names` alone: their maps and `parent_cycles` (a name without a map
        is left out: an engine added since, or none of the fleet's), each largest group's sets
        naming at most SUBSET_SET_NAMES engines (`more_engines`: how many more), the rest as in
        `body`."""
        body = memoryview(self.body)
        shown = [n for n in dict.fromkeys(names) if n in self.spans]
        cycles = json.dumps({n: self.cycles.get(n, 0) for n in shown}).encode()
        parts = [body[a:b] for a, b in (self.spans[n] for n in shown)]
        return b"".join([self.small_head, b', "parent_cycles": ', cycles, b', "engines":{',
                         b",".join(parts), b"}}"])


def map_blocks_per_engine(engines: int) -> int:
    """The most blocks one engine's map lists in a fleet of `engines`: MAX_MAP_BLOCKS, less in
    a fleet so large that its maps together would pass MAX_MAP_TOTAL."""
    return min(MAX_MAP_BLOCKS, MAX_MAP_TOTAL // max(engines, 1))


def blocks_maps(lay, names: dict[int, str], version: int | None = None) -> Maps:
    """The /blocks answer from a `layout_of` Layout and the engine names by id: per engine the
    colour id of each block it holds (24 bits of its group's top key; 0: the shared trunk),
    sorted so a group's blocks sit together, at most `map_blocks_per_engine`; the largest groups
    with the engine sets holding them (the TOP_SETS largest, and what the others hold); the
    parent-hash cycles. The engines' lists are gathered, sorted and written by compiled code
    without the GIL (`engine_color_lists`), so a large map never holds it long."""
    groups = lay.groups
    colors = (groups >> np.uint64(40)).astype(np.int64)
    colors[(colors == 0) & (groups != 0)] = 1  # 0 names the shared trunk only
    order = np.argsort(colors, kind="stable")
    sc, ss = colors[order], lay.sets[order]
    limit = map_blocks_per_engine(len(names))
    lists = engine_color_lists(colors, lay.positions, lay.by_engine, names, limit)
    parts = [(name, b"".join([json.dumps(name).encode(), b':{"blocks":', str(n).encode(),
                              b',"truncated":', b"true" if n > limit else b"false", b',"colors":', colors_json, b"}"]))
             for name, (n, colors_json) in zip(names.values(), lists)]
    starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]]) if sc.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], sc.size].astype(np.int64)
    sizes = ends - starts
    prefixes = []
    for g in np.argsort(-sizes, kind="stable")[:TOP_PREFIXES].tolist():
        a, b = int(starts[g]), int(ends[g])
        _, first, n = np.unique(ss[a:b], return_index=True, return_counts=True)
        # the largest sets first; among equals, as their masks would sort (highest engine first)
        sets = sorted(((int(k), lay.engines_of(int(order[a + f])))
                       for f, k in zip(first.tolist(), n.tolist())),
                      key=lambda s: (-s[0], s[1][::-1]))
        color = int(sc[a])
        prefixes.append({
            "color": color, "shared": color == 0, "blocks": b - a,
            "key": None if color == 0 else f"{int(groups[order[a]]):016x}",
            "sets": [{"engines": [names[e] for e in engines if e in names], "blocks": k}
                     for k, engines in sets[:TOP_SETS]],
            "other_sets": len(sets) - min(len(sets), TOP_SETS),
            "other_sets_blocks": sum(k for k, _ in sets[TOP_SETS:])})
    head = {"version": version, "max_group_blocks": int(lay.max_group),
            "shared_blocks": int((colors == 0).sum()), "cycles": int(lay.cycles),
            "parent_cycles": {n: int(lay.cycle_blocks[e]) for e, n in names.items()},
            "prefixes": prefixes}
    small = {k: v for k, v in head.items() if k != "parent_cycles"}
    small["prefixes"] = [{**p, "sets": [_few_names(s) for s in p["sets"]]} for p in prefixes]
    out = [(json.dumps(head)[:-1] + ',"engines":{').encode()]
    spans, at = {}, len(out[0])
    for i, (name, part) in enumerate(parts):
        if i:
            out.append(b",")
            at += 1
        out.append(part)
        spans[name] = (at, at + len(part))
        at += len(part)
    out.append(b"}}")
    return Maps(b"".join(out), spans, json.dumps(small)[:-1].encode(), head["parent_cycles"])


def _few_names(s: dict) -> dict:
    """A largest group's engine set naming at most SUBSET_SET_NAMES of its engines."""
    more = max(0, len(s["engines"]) - SUBSET_SET_NAMES)
    return {**s, "engines": s["engines"][:SUBSET_SET_NAMES], "more_engines": more}
