"""MirrorPool: a read-only pool that holds what a live engine says its prefix cache holds."""

from __future__ import annotations

import heapq
from array import array
from time import time as _now

import numpy as np

from ..errors import InvalidRequest
from ..pools.blockmap import CACHED, NO_OWNER
from ..pools.pool import Pool

NO_PARENT = -1


class MirrorPool(Pool):
    """The engine's cached block set, as its KV events report it, on `num_blocks` logical slots.

    Events carry block hashes, never the engine's physical block ids, so each cached block takes
    the lowest free *logical* slot: the map shows how many blocks are cached and how they group
    into prefix trees, not where they sit in GPU memory. A slot's block-map owner is its prefix
    tree (the owner of its parent when the parent is cached at store time, else a new tree id),
    so one tree is one colour on the page. The pool is read-only: allocate, extend, free,
    truncate and defragment are refused; `reset` forgets the mirrored set.

    A hash may be cached more than once: vLLM does not de-duplicate blocks (two requests that
    fill the same block at once both keep theirs, each stored and later removed), and a hybrid
    model stores a hash once per KV-cache group. So every store is one copy on its own slot and
    every remove drops one copy; a hash is cached while it has a copy. `_slot_of` maps a hash to
    its first copy's slot, `_extra` to the slots of further copies. Copies that arrive when every
    slot is taken are counted in `_unplaced` (hash -> [parent hash or None, copies]) and in
    `overflow`, so `cached_hashes()` always equals the engine's set even when `num_blocks` is
    too small (removes take unplaced copies first).

    Per slot (compact arrays): `slot_hash` (uint64), `slot_parent` (parent hash, uint64, valid
    where `slot_has_parent`), `slot_depth` (int32: 0 for a root or a block whose parent was not
    cached when it arrived).

    Invariants (see `check`): the slots of `_slot_of` and `_extra` are exactly the occupied
    slots, each once, with `slot_hash[s]` its hash; a hash with extra copies has a first one; a
    slot is in the free stack iff it is unoccupied iff its block-map state is FREE (owner -1);
    occupied slots are CACHED.
    """

    strategy = "mirror"
    scatter_fails = False  # nothing is allocated here, so nothing can fail

    def __init__(self, num_blocks: int, block_bytes: int = 1, **kw) -> None:
        super().__init__(num_blocks, block_bytes, **kw)
        self._allocs: dict = {}
        self.slot_hash = np.zeros(num_blocks, dtype=np.uint64)
        self.slot_parent = np.zeros(num_blocks, dtype=np.uint64)
        self.slot_has_parent = np.zeros(num_blocks, dtype=np.bool_)
        self.slot_depth = np.zeros(num_blocks, dtype=np.int32)
        self._slot_of: dict[int, int] = {}
        self._extra: dict[int, list[int]] = {}
        self._unplaced: dict[int, list] = {}
        self._next_tree = 0
        self._reset_free_structure()
        self.source = None  # whatever feeds the mirror; its status() shows in stats()
        self.block_size: int | None = None  # tokens per block, from the first BlockStored
        self.mirror_counters = {
            "batches": 0, "stored_events": 0, "removed_events": 0, "cleared_events": 0,
            "stored_blocks": 0, "removed_blocks": 0, "duplicate_stores": 0,
            "unknown_removes": 0, "overflow": 0, "other_medium": 0,
        }

    # -- the free structure -------------------------------------------------------------------
    def _reset_free_structure(self) -> None:
        self._free = array("i", np.arange(self.num_blocks - 1, -1, -1, dtype=np.int32).tobytes())

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def _free_lengths(self) -> np.ndarray:
        return self.blockmap.free_runs()[1]

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        return []

    @property
    def allocated_total(self) -> int:
        return 0

    # -- read-only ------------------------------------------------------------------------------
    def _refuse(self, *_a, **_k):
        raise InvalidRequest(
            f"pool {self.name!r} mirrors an engine's prefix cache and is read-only; "
            "its blocks change only when the engine reports it")

    allocate = extend = free = truncate = allocate_many = free_many = _refuse

    def defragment(self):
        self._refuse()

    # The allocator's own verbs never reach these (refused above); a mirror has no allocations.
    _allocate = _extend = _truncate = _release = _refuse

    def _block_ids(self, aid: int):
        return ()

    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        return [], True

    def reset(self) -> int:
        """Forget the mirrored set (the engine's own cache is untouched). Returns blocks dropped."""
        dropped = self.used_blocks + sum(u[1] for u in self._unplaced.values())
        self._clear()
        self.events.record("reset", dropped)
        return dropped

    # -- applying the engine's events -----------------------------------------------------------
    def apply(self, events, medium_filter: tuple = (None, "GPU")) -> None:
        """Apply one batch of normalised events (objects with `kind` 'stored' / 'removed' /
        'cleared', as kvevents.codec makes). Events of another medium (a CPU offload tier) are
        counted and skipped. Never raises on content: a remove of an unknown hash is counted."""
        c = self.mirror_counters
        c["batches"] += 1
        for ev in events:
            kind = ev.kind
            if kind == "cleared":
                c["cleared_events"] += 1
                blocks = list(self._slot_of.values()) + [x for v in self._extra.values() for x in v]
                hashes = list(self.cached_hashes())
                self._clear()
                self.events.record("cleared", blocks, hashes)
                continue
            if getattr(ev, "medium", None) not in medium_filter:
                c["other_medium"] += 1
                continue
            if kind == "stored":
                c["stored_events"] += 1
                self.store(ev.block_hashes, ev.parent, ev.token_ids, ev.block_size)
            elif kind == "removed":
                c["removed_events"] += 1
                self.remove(ev.block_hashes)

    def store(self, hashes: list[int], parent: int | None, token_ids=None,
              block_size: int | None = None, seq_id=None) -> list[int]:
        """Cache one copy of each of `hashes`, a chain under `parent`; returns the slots taken
        (-1 = no free slot)."""
        c = self.mirror_counters
        if block_size and self.block_size is None:
            self.block_size = block_size
        slot_of, free, unplaced = self._slot_of, self._free, self._unplaced
        own, bm = self._own, self._bm
        slots: list[int] = []
        prev = parent
        for h in hashes:
            c["stored_blocks"] += 1
            first = slot_of.get(h)
            if first is not None or h in unplaced:
                c["duplicate_stores"] += 1
            if not free:
                c["overflow"] += 1
                u = unplaced.get(h)
                if u is None:
                    unplaced[h] = [prev, 1]
                else:
                    u[1] += 1
                slots.append(-1)
                prev = h
                continue
            s = free.pop()
            if first is not None:  # another copy: same tree, same place in it
                tree, depth = own[first], int(self.slot_depth[first])
                self._extra.setdefault(h, []).append(s)
            else:
                ps = slot_of.get(prev, -1) if prev is not None else -1
                if ps >= 0:
                    tree, depth = own[ps], int(self.slot_depth[ps]) + 1
                else:
                    tree, depth = self._next_tree, 0
                    self._next_tree += 1
                slot_of[h] = s
            self.slot_hash[s] = h
            self.slot_has_parent[s] = prev is not None
            self.slot_parent[s] = 0 if prev is None else prev
            self.slot_depth[s] = depth
            bm.assign((s,), tree, CACHED)
            slots.append(s)
            prev = h
        self.events.record("stored", slots, list(hashes), parent, token_ids, block_size, seq_id,
                           [int(own[x]) if x >= 0 else -1 for x in slots], CACHED)
        return slots

    def remove(self, hashes: list[int], reason: str = "engine") -> list[int]:
        """Drop one copy of each of `hashes`; returns the slots freed. A hash with no copy is
        counted in `unknown_removes`, not raised."""
        c = self.mirror_counters
        slot_of, free, unplaced, extra = self._slot_of, self._free, self._unplaced, self._extra
        freed: list[int] = []
        for h in hashes:
            u = unplaced.get(h)
            if u is not None:
                c["removed_blocks"] += 1
                u[1] -= 1
                if not u[1]:
                    del unplaced[h]
                continue
            more = extra.get(h)
            if more:
                s = more.pop()
                if not more:
                    del extra[h]
            else:
                s = slot_of.pop(h, None)
                if s is None:
                    c["unknown_removes"] += 1
                    continue
            c["removed_blocks"] += 1
            self.blockmap.assign((s,), NO_OWNER, 0)
            free.append(s)
            freed.append(s)
        self.events.record("removed", freed, list(hashes), reason)
        return freed

    def copies(self, h: int) -> int:
        """How many copies of `h` the engine holds (0: not cached)."""
        n = (h in self._slot_of) + len(self._extra.get(h, ()))
        u = self._unplaced.get(h)
        return n + (u[1] if u else 0)

    def _clear(self) -> None:
        self._slot_of.clear()
        self._extra.clear()
        self._unplaced.clear()
        self._reset_free_structure()
        self.blockmap.clear()
        self.slot_has_parent[:] = False

    # -- reading --------------------------------------------------------------------------------
    def cached_hashes(self) -> set[int]:
        """Every hash the engine has cached, placed on a slot or not."""
        return set(self._slot_of) | set(self._unplaced)

    def slot_of(self, h: int) -> int | None:
        return self._slot_of.get(h)

    def forest_snapshot(self) -> tuple:
        """What `forest_of` needs, copied (C-speed copies: O(cached) but cheap), so the shape can
        be computed off the thread that mutates the pool."""
        unplaced_only = sum(1 for h in self._unplaced if h not in self._slot_of)
        return (dict(self._slot_of), unplaced_only, self.slot_hash.copy(),
                self.slot_parent.copy(), self.slot_has_parent.copy(), self.slot_depth.copy(),
                self.block_size)

    def forest(self, top: int = 5) -> dict:
        """The prefix forest's shape now (see `forest_of`)."""
        return forest_of(self.forest_snapshot(), top)

    def _extra_stats(self) -> dict:
        out = {"mirror": {**self.mirror_counters, "cached_blocks": len(self.cached_hashes()),
                          "copies": self.used_blocks + sum(u[1] for u in self._unplaced.values()),
                          "block_size": self.block_size, "logical_slots": True}}
        if self.source is not None:
            out["mirror"]["source"] = self.source.status()
        return out

    def _extra_config(self) -> dict:
        cfg = {"logical_slots": True}
        if self.source is not None:
            cfg["source"] = self.source.describe()
        return cfg

    # -- invariants -----------------------------------------------------------------------------
    def check(self) -> list[str]:
        problems: list[str] = []
        states = self.blockmap.states_np()
        owners = self.blockmap.owners_np()
        occupied = np.zeros(self.num_blocks, dtype=np.bool_)
        held = [(h, s) for h, s in self._slot_of.items()]
        held += [(h, s) for h, slots in self._extra.items() for s in slots]
        for h, more in self._extra.items():
            if h not in self._slot_of:
                problems.append(f"hash {h:016x} has extra copies but no first one")
            if not more:
                problems.append(f"hash {h:016x} has an empty list of extra copies")
        for h, s in held:
            if not 0 <= s < self.num_blocks:
                problems.append(f"hash {h:016x} on slot {s} outside the pool")
                continue
            if occupied[s]:
                problems.append(f"slot {s} holds two copies")
            occupied[s] = True
            if int(self.slot_hash[s]) != h:
                problems.append(f"slot {s} records hash {int(self.slot_hash[s]):016x}, not {h:016x}")
        for h, (_parent, n) in self._unplaced.items():
            if n <= 0:
                problems.append(f"hash {h:016x} has {n} unplaced copies")
        in_free = np.zeros(self.num_blocks, dtype=np.bool_)
        free = np.frombuffer(self._free, dtype=np.int32)
        in_free[free] = True
        if free.size != np.unique(free).size:
            problems.append("a slot is twice in the free stack")
        if (in_free == occupied).any():
            problems.append(f"slot {int(np.flatnonzero(in_free == occupied)[0])} is both free and "
                            "occupied, or neither")
        if ((states == CACHED) != occupied).any():
            problems.append(f"slot {int(np.flatnonzero((states == CACHED) != occupied)[0])} state "
                            "disagrees with the mirrored set")
        if ((owners == NO_OWNER) == occupied).any():
            problems.append("an occupied slot has no owner, or a free one has one")
        return problems


def forest_of(snapshot: tuple, top: int = 5) -> dict:
    """The prefix forest's shape: roots (no parent), orphans (parent not cached), depth along
    cached parents, and the `top` most shared prefixes (blocks with at least two cached children,
    by cached descendants). O(cached log cached); pure, so it may run in a worker thread."""
    slot_of, unplaced, slot_hash, slot_parent, has_parent, stored_depth, block_size = snapshot
    num = slot_hash.size
    occupied = np.fromiter(slot_of.values(), dtype=np.int64, count=len(slot_of))
    n = occupied.size
    parent_slot = np.full(num, -1, dtype=np.int64)
    roots = orphans = 0
    get = slot_of.get
    for s, hp, p in zip(occupied.tolist(), has_parent[occupied].tolist(),
                        slot_parent[occupied].tolist()):
        if not hp:
            roots += 1
            continue
        ps = get(p)
        if ps is None:
            orphans += 1
        else:
            parent_slot[s] = ps
    # Depth along cached parents (a stored depth is stale once a parent left): walk in stored-
    # depth order, which puts every parent before its children.
    depth = np.zeros(num, dtype=np.int64)
    order = occupied[np.argsort(stored_depth[occupied], kind="stable")] if n else occupied
    ps_o = parent_slot[order].tolist()
    order_l = order.tolist()
    for s, p in zip(order_l, ps_o):
        if p >= 0:
            depth[s] = depth[p] + 1
    desc = np.zeros(num, dtype=np.int64)
    children = np.zeros(num, dtype=np.int64)
    for s, p in zip(reversed(order_l), reversed(ps_o)):
        if p >= 0:
            desc[p] += desc[s] + 1
            children[p] += 1
    shared = heapq.nlargest(top, (s for s in order_l if children[s] >= 2),
                            key=lambda s: (int(desc[s]), -s))
    return {
        "cached_blocks": n + unplaced,
        "placed_blocks": n,
        "roots": roots,
        "orphans": orphans,
        "trees": roots + orphans,
        "max_depth": int(depth[occupied].max()) + 1 if n else 0,
        "mean_depth": round(float(depth[occupied].mean()) + 1, 3) if n else 0.0,
        "top_prefixes": [
            {"hash": f"{int(slot_hash[s]):016x}", "slot": int(s), "depth": int(depth[s]) + 1,
             "children": int(children[s]), "descendants": int(desc[s]),
             "tokens": None if not block_size else (int(depth[s]) + 1) * block_size}
            for s in shared],
        "at": _now(),
    }


__all__ = ["MirrorPool", "forest_of"]
