"""TieredPool: the seed article's small / medium / large block pools, with its bugs fixed."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from .._core import FreeStack
from ..errors import InvalidRequest
from .blockmap import FREE, NO_OWNER
from .pool import Pool, free_mismatch, pair_runs

# Block size of each tier in units (the pool's block_bytes) and its share of the units. The
# article used 64 MiB / 256 MiB / 1 GiB blocks: ratios 1 : 4 : 16.
DEFAULT_TIERS = (
    {"name": "small", "units": 1, "share": 0.25},
    {"name": "medium", "units": 4, "share": 0.25},
    {"name": "large", "units": 16, "share": 0.5},
)


@dataclass(slots=True)
class Tier:
    """One block pool: `count` blocks of `units` units each, from unit `start`.

    `free` is the compiled fixed-capacity stack (allocator/_core.pxd `Stack`) of tier-local
    block indices, the lowest on top: never resized, so a long-lived pool never pays a realloc
    copy when a big request takes many blocks and later frees give them back.
    """

    name: str
    units: int
    start: int
    count: int
    free: FreeStack

    def unit_rows(self, blocks) -> list[int]:
        u, s = self.units, self.start
        if u == 1:
            return [s + b for b in blocks]
        return [s + b * u + i for b in blocks for i in range(u)]


class TieredPool(Pool):
    """Several block pools of different block sizes in one tensor, addressed in units.

    A request goes to the smallest tier whose block holds it, else takes several blocks of the
    largest tier. With `fallback` (default on) an exhausted tier hands the request to the next
    larger one. Each allocation remembers its tier, so `free` returns blocks to the pool they
    came from (the article returned every block to the small pool). The block map has one cell
    per unit: a medium block covers `units` cells. A record is
    `[requested_bytes, tier_index, blocks]` with tier-local block indices in data order.

    NOTE: a request that fails while enough memory is free in other tiers counts as an OOM of
    cause "fragmentation": memory is free but in the wrong shape, the tiered form of it.
    """

    strategy = "tiered"
    exact_footprint = False
    filters_victims = True

    def __init__(self, num_blocks: int, block_bytes: int, tiers=None, fallback: bool = True, **kw):
        super().__init__(num_blocks, block_bytes, **kw)
        self.fallback = fallback
        self.tiers = self._layout(DEFAULT_TIERS if tiers is None else tiers)
        self.used_blocks = 0
        self._allocs: dict[int, list] = {}

    def _layout(self, spec) -> list[Tier]:
        if not isinstance(spec, (list, tuple)) or not spec:
            raise InvalidRequest("tiers must be a non-empty list of {name, units, share}")
        try:
            rows = sorted(
                ((str(t["name"]), int(t["units"]), float(t["share"])) for t in spec), key=lambda r: r[1]
            )
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest("each tier needs 'name', 'units' (int >= 1) and 'share' (0..1)") from None
        if any(u < 1 for _, u, _ in rows) or any(not 0 < s <= 1 for _, _, s in rows):
            raise InvalidRequest("tier units must be >= 1 and shares in (0, 1]")
        if len({u for _, u, _ in rows}) != len(rows) or len({n for n, _, _ in rows}) != len(rows):
            raise InvalidRequest("tier names and block sizes must be distinct")
        total = sum(s for _, _, s in rows)
        counts = [int(self.num_blocks * s / total) // u for _, u, s in rows]
        # Units left over by rounding go to the smallest tier, so the pool has no dead units.
        used = sum(c * u for c, (_, u, _) in zip(counts, rows))
        counts[0] += (self.num_blocks - used) // rows[0][1]
        tiers, start = [], 0
        for (name, units, _), count in zip(rows, counts):
            if count <= 0:
                raise InvalidRequest(f"tier {name!r} gets no blocks in a pool of {self.num_blocks} units")
            tiers.append(Tier(name, units, start, count, FreeStack(count, full=True)))
            start += count * units
        if start < self.num_blocks:
            raise InvalidRequest("tier layout leaves units unused; adjust shares")
        return tiers

    def _reset_free_structure(self) -> None:
        self.used_blocks = 0
        for t in self.tiers:
            t.free.refill(0)

    # -- placement ------------------------------------------------------------------------
    def _first_tier(self, nbytes: int) -> int:
        for i, t in enumerate(self.tiers):
            if t.units * self.block_bytes >= nbytes:
                return i
        return len(self.tiers) - 1

    def _blocks_needed(self, tier: Tier, nbytes: int) -> int:
        return -(-nbytes // (tier.units * self.block_bytes))

    def footprint(self, nbytes: int) -> int:
        tier = self.tiers[self._first_tier(nbytes)]
        return self._blocks_needed(tier, nbytes) * tier.units * self.block_bytes

    def _allocate(self, aid: int, nbytes: int, state: int) -> None:
        first = self._first_tier(nbytes)
        candidates = range(first, len(self.tiers)) if self.fallback else (first,)
        for i in candidates:
            tier = self.tiers[i]
            n = self._blocks_needed(tier, nbytes)
            if n <= len(tier.free):
                blocks = tier.free.pop_many(n)
                break
        else:
            raise self._tier_oom(nbytes)
        rows = tier.unit_rows(blocks)
        self.blockmap.assign(rows, aid, state)
        self._allocs[aid] = [nbytes, i, blocks]
        held = n * tier.units
        self.requested_total += nbytes
        self.used_blocks += held
        self.events.record("allocate", aid, nbytes, held * self.block_bytes, held, rows, state)

    def _tier_oom(self, nbytes: int):
        free = (self.num_blocks - self.used_blocks) * self.block_bytes
        largest = self.largest_free_bytes()
        return self._oom(nbytes, free, largest, "fragmentation" if free >= nbytes else "capacity")

    def growth_bytes(self, aid: int, extra: int) -> int:
        """`extend` stays in the allocation's tier: whole blocks of that tier."""
        requested, i, blocks = self._record(aid)
        tier = self.tiers[i]
        more = self._blocks_needed(tier, requested + extra) - len(blocks)
        return max(0, more) * tier.units * self.block_bytes

    def _extend(self, aid: int, nbytes: int) -> bool:
        rec = self._allocs[aid]
        tier = self.tiers[rec[1]]
        blocks = rec[2]
        need = self._blocks_needed(tier, rec[0] + nbytes) - len(blocks)
        if need > len(tier.free):
            raise self._tier_oom(need * tier.units * self.block_bytes)
        state = self.blockmap.state[tier.unit_rows(blocks[:1])[0]]
        rows = None
        if need > 0:
            new = tier.free.pop_many(need)
            rows = tier.unit_rows(new)
            self.blockmap.assign(rows, aid, state)
            blocks.extend(new)
            self.used_blocks += need * tier.units
        rec[0] += nbytes
        self.requested_total += nbytes
        self.counters["extends"] += 1
        self.events.record("extend", aid, rec[0], len(blocks) * tier.units * self.block_bytes, False,
                           rows, None, nbytes, state)
        return False

    def _truncate(self, aid: int, nbytes: int):
        rec = self._allocs[aid]
        requested, i, blocks = rec
        tier = self.tiers[i]
        keep = self._blocks_needed(tier, nbytes)
        tail = blocks[keep:]
        rows = None
        if tail:
            del blocks[keep:]
            rows = tier.unit_rows(tail)
            self.blockmap.assign(rows, NO_OWNER, FREE)
            tail.reverse()
            tier.free.push_many(tail)
            self.used_blocks -= len(tail) * tier.units
        rec[0] = nbytes
        self.requested_total += nbytes - requested
        return rows

    def victim_filter(self, nbytes: int, grow: int | None = None):
        """Only blocks of a tier the request can use help it: the allocation's own tier when it
        grows (extend stays in its tier), else the first fitting tier and, with fallback, the
        larger ones."""
        if grow is not None:
            usable = {self._allocs[grow][1]}
        else:
            first = self._first_tier(nbytes)
            usable = set(range(first, len(self.tiers))) if self.fallback else {first}
        allocs = self._allocs
        return lambda aid: aid in allocs and allocs[aid][1] in usable

    def _release(self, aid: int) -> None:
        requested, i, blocks = self._allocs.pop(aid)
        tier = self.tiers[i]
        rows = tier.unit_rows(blocks)
        self.blockmap.assign(rows, NO_OWNER, FREE)
        blocks.reverse()
        tier.free.push_many(blocks)
        held = len(blocks) * tier.units
        self.requested_total -= requested
        self.used_blocks -= held
        self._frees += 1
        self.events.record("free", aid, held, rows, requested)

    def _block_ids(self, aid: int):
        _, i, blocks = self._allocs[aid]
        return self.tiers[i].unit_rows(blocks)

    def _tier_name(self, aid: int) -> str | None:
        return self.tiers[self._allocs[aid][1]].name

    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        """Within each tier, two-finger compaction: live blocks above the tier's `used` line move
        into its free holes below it. Sources and destinations are disjoint."""
        runs: list[tuple[int, int, int]] = []
        owners = self.blockmap.owners_np()
        states = self.blockmap.states_np()
        moved = 0
        for tier in self.tiers:
            u, base = tier.units, tier.start
            first_units = owners[base : base + tier.count * u : u]  # owner of each tier block
            used = tier.count - len(tier.free)
            src = np.flatnonzero(first_units[used:] != NO_OWNER) + used
            dst = np.flatnonzero(first_units[:used] == NO_OWNER)
            assert src.size == dst.size, f"tier {tier.name}: live blocks above the line != holes"
            if src.size == 0:
                continue
            remap = np.arange(tier.count, dtype=np.int32)
            remap[src] = dst
            touched = np.unique(first_units[src]).tolist()
            for aid in touched:
                rec = self._allocs[aid]
                rec[2] = array("i", remap[np.frombuffer(rec[2], dtype=np.int32)].tobytes())
            src_rows = (base + src[:, None] * u + np.arange(u)[None, :]).ravel()
            dst_rows = (base + dst[:, None] * u + np.arange(u)[None, :]).ravel()
            owners[dst_rows] = owners[src_rows]
            states[dst_rows] = states[src_rows]
            owners[src_rows] = NO_OWNER
            states[src_rows] = 0
            tier.free.refill(used)
            runs += pair_runs(src_rows, dst_rows)
            moved += len(touched)
        self.counters["moves"] += moved
        return runs, True

    def _free_lengths(self) -> np.ndarray:
        """Free extents as a request sees them, in units: each free block of a smaller tier is
        one extent of its size (those tiers serve one-block requests only), while the largest
        tier's free blocks together are one extent (it serves multi-block requests). Runs of
        free units in the map would merge blocks, and tiers, that no request can use as one."""
        *smaller, largest = self.tiers
        parts = [np.full(len(t.free), t.units, dtype=np.int64) for t in smaller]
        if len(largest.free):
            parts.append(np.array([len(largest.free) * largest.units], dtype=np.int64))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        problems = []
        in_free = np.zeros(self.num_blocks, dtype=bool)
        for t in self.tiers:
            free = t.free.held()
            if np.unique(free).size != free.size:
                problems.append(f"tier {t.name}: a block appears twice in its free stack")
            if free.size and (free.min() < 0 or free.max() >= t.count):
                problems.append(f"tier {t.name}: free stack holds a block outside the tier")
                continue
            rows = (t.start + free[:, None] * t.units + np.arange(t.units)[None, :]).ravel()
            in_free[rows] = True
        problems += free_mismatch(in_free, expected_free, "unit", "a tier's free stack")
        for aid, (_, i, blocks) in self._allocs.items():
            if any(b >= self.tiers[i].count for b in blocks):
                problems.append(f"allocation {aid} holds a block outside tier {self.tiers[i].name}")
        return problems

    def _tier_stats(self) -> list[dict]:
        return [
            {"name": t.name, "block_bytes": t.units * self.block_bytes, "units": t.units,
             "start": t.start, "blocks": t.count, "free_blocks": len(t.free)}
            for t in self.tiers
        ]

    def _extra_stats(self) -> dict:
        return {"tiers": self._tier_stats()}

    def _extra_config(self) -> dict:
        return {"tiers": self._tier_stats(), "fallback": self.fallback}
