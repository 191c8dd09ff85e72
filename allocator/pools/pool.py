"""Pool: what every allocation strategy shares (storage, block map, events, counters, checks)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from ..errors import (
    CorruptState,
    ExceedsCapacity,
    InvalidRequest,
    NotFound,
    OutOfMemory,
    block_state,
    positive_int,
)
from ..vocab import STRATEGY_INFO
from .blockmap import CACHED, FREE, NO_OWNER, PINNED, STATE_NAMES, USED, BlockMap
from .events import EventLog, stored_ids
from .geometry import ModelGeometry, size_in_bytes
from .metrics import fragmentation_stats
from .storage import BlockStorage


@dataclass(slots=True)
class Allocation:
    """A plain view of one allocation. `blocks` are [start, count] runs in data order."""

    id: int
    requested_bytes: int
    allocated_bytes: int
    blocks: list[list[int]]
    state: str = "used"
    tier: str | None = None

    def to_dict(self) -> dict:
        # Written out: dataclasses.asdict deep-copies and costs ~4x more on the batch path.
        return {"id": self.id, "requested_bytes": self.requested_bytes,
                "allocated_bytes": self.allocated_bytes, "blocks": self.blocks, "state": self.state,
                "tier": self.tier}


@dataclass(slots=True)
class DefragReport:
    """What a defragment did: blocks and bytes moved, time (whole call and copy alone), and the
    fragmentation summary before and after."""

    moved_blocks: int
    moved_bytes: int
    seconds: float
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    copy_seconds: float = 0.0  # the tensor gather + scatter alone, without the bookkeeping

    def to_dict(self) -> dict:
        return asdict(self)


def pair_runs(src: np.ndarray, dst: np.ndarray, rows: int = 1) -> list[tuple[int, int, int]]:
    """Merge block moves src[i] -> dst[i] (each `rows` storage rows) into (src, dst, count) runs."""
    if src.size == 0:
        return []
    brk = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], brk))
    counts = np.diff(np.concatenate((starts, [src.size])))
    return [(int(src[i]) * rows, int(dst[i]) * rows, int(c) * rows)
            for i, c in zip(starts.tolist(), counts.tolist())]


def free_mismatch(in_free: np.ndarray, expected_free: np.ndarray, unit: str, where: str) -> list[str]:
    """The first block the free structure and the allocations disagree on, as a problem."""
    diff = np.flatnonzero(in_free != expected_free)
    if not diff.size:
        return []
    b = int(diff[0])
    what = f"is in {where} but owned" if in_free[b] else "is neither free nor owned"
    return [f"{unit} {b} {what} ({diff.size} differ)"]


def runs_of(block_ids) -> list[list[int]]:
    """[start, count] runs of consecutive ascending block ids, in the given order."""
    runs: list[list[int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return runs


class PoolExtension(Protocol):
    """A layer built on a pool (the KV cache as "cache", the event history as "history"): the
    pool calls these and nothing else of it."""

    def on_pool_reset(self) -> None:
        """Every allocation is gone (their memory is already free)."""

    def stats(self) -> dict | None:
        """Its numbers, shown under its name in the pool's stats (None: nothing to show there)."""


class Pool(ABC):
    """Base of the strategies: one tensor (`storage`), its `blockmap`, `events` and counters.

    Subclasses keep their own free structure and per-allocation records (`_allocs`: id ->
    record whose first item is the requested bytes) and implement `_allocate`, `_extend`,
    `_truncate` (may return the block ids it freed, for the event), `_release`, `_block_ids`,
    `_compact` (returns the data moves as (src, dst,
    count) runs in an order safe to apply one after another, and whether sources and
    destinations are disjoint), `_free_lengths`, `_free_problems`, `_reset_free_structure` and
    `used_blocks`. Allocation ids are positive ints, never reused within a pool's life.

    Invariants (see `check`): the blocks of live allocations and the free structure partition
    the pool; the block map's owner of each block is the allocation holding it (or -1);
    `requested_total` / `allocated_total` / `used_blocks` equal the sums over allocations.

    NOTE: the boundary. Ids, sizes and states from outside enter only through the public
    methods, and each one checks them before the compiled core sees them: allocation ids
    (`free`, `free_many`, `extend`, `truncate`, `block_ids`, `allocation`, `held_bytes`,
    `growth_bytes`, `read`, `write`, `set_state`, `in`) must name a live allocation of this
    pool (NotFound: never a freed one, never a bool or float that hashes like an id); sizes
    (`allocate`, `allocate_many`, `extend`, `truncate`, `read`) must be positive ints within
    what the call allows (InvalidRequest / OutOfMemory); block states (`allocate`,
    `allocate_many`, `set_state`) must be USED, CACHED or PINNED. Behind the boundary the hot
    paths trust the invariants; `check()` verifies them without trusting them.
    """

    strategy = "base"
    # Whether `footprint(n)` is always what an allocation of n bytes ends up holding (tiered
    # pools may fall back to a larger tier, so theirs is only a first estimate).
    exact_footprint = True
    # Whether `victim_filter` ever restricts victims (tiered pools); when not, the cache skips
    # asking on its hot path.
    filters_victims = False

    def __init__(
        self,
        num_blocks: int,
        block_bytes: int,
        *,
        name: str = "pool",
        device: str = "auto",
        model: ModelGeometry | None = None,
        tokens_per_block: int | None = None,
        event_capacity: int = 10_000,
    ) -> None:
        positive_int(num_blocks, "num_blocks")
        positive_int(block_bytes, "block_bytes")
        self.name = name
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.model = model
        self.tokens_per_block = tokens_per_block
        self.storage = BlockStorage(num_blocks, block_bytes, device)
        self.blockmap = BlockMap(num_blocks)
        self.events = EventLog(event_capacity)
        # Layers built on this pool (the KV cache as "cache", the event history as "history"):
        # the pool tells them when it is reset and adds their stats to its own, and knows
        # nothing else of them.
        self.extensions: dict[str, PoolExtension] = {}
        # Hot-path aliases of the block map's arrays (one attribute load instead of two).
        self._bm = self.blockmap
        self._own, self._st, self._cv = self.blockmap.owner, self.blockmap.state, self.blockmap.chunk_version
        # Ids are never reused, so the count of allocations is the last id handed out.
        self._last_id = 0
        self._frees = 0
        self.requested_total = 0
        self.counters = {
            "extends": 0,
            "truncates": 0,
            "moves": 0,
            "moved_blocks": 0,
            "defragmentations": 0,
            "ooms_capacity": 0,
            "ooms_fragmentation": 0,
        }

    # -- sizes -------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int | None:
        return self.model.bytes_per_token if self.model else None

    def to_bytes(self, nbytes: int | None = None, tokens: int | None = None) -> int:
        """Resolve bytes-or-tokens to bytes. Raises InvalidRequest."""
        return size_in_bytes(nbytes, tokens, self.bytes_per_token)

    @property
    def scatter_fails(self) -> bool:
        """Whether free space scattered in pieces can fail a request here (allocator/vocab.py)."""
        info = STRATEGY_INFO.get(self.strategy)
        return True if info is None else info.scatter_fails

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    # -- public API ----------------------------------------------------------------------
    def allocate(self, nbytes: int, state: int = USED) -> int:
        """Allocate `nbytes` and return the new allocation id.

        Raises InvalidRequest (size not a positive int), OutOfMemory (cause capacity or
        fragmentation; nothing changes).
        """
        if nbytes.__class__ is not int or nbytes <= 0:
            self._bad_size(nbytes)
        block_state(state)
        aid = self._last_id + 1
        self._allocate(aid, nbytes, state)
        self._last_id = aid
        return aid

    def extend(self, aid: int, nbytes: int) -> bool:
        """Grow allocation `aid` by `nbytes`; returns True when its data had to move.

        Raises NotFound, InvalidRequest, OutOfMemory (the allocation is then unchanged).
        """
        if nbytes.__class__ is not int or nbytes <= 0:
            self._bad_size(nbytes)
        self._record(aid)
        return self._extend(aid, nbytes)

    def free(self, aid: int) -> None:
        """Return every block of `aid` to the pool. Raises NotFound (also on double free)."""
        self._record(aid)
        self._release(aid)

    def truncate(self, aid: int, nbytes: int) -> None:
        """Shrink allocation `aid` to `nbytes` (at most its current size), returning the blocks
        past the new end; the data before it stays in place. Never needs memory.

        Raises NotFound, InvalidRequest (not a positive int, or larger than the allocation).
        """
        if nbytes.__class__ is not int or nbytes <= 0:
            self._bad_size(nbytes)
        rec = self._record(aid)
        if nbytes > rec[0]:
            raise InvalidRequest(
                f"truncate to {nbytes} bytes would grow allocation {aid} of {rec[0]} bytes; use extend"
            )
        removed = rec[0] - nbytes
        freed = self._truncate(aid, nbytes)  # the rows it released
        self.counters["truncates"] += 1
        self.events.record("truncate", aid, nbytes, self.held_bytes(aid), freed, removed)

    def victim_filter(self, nbytes: int, grow: int | None = None):
        """Which allocations, freed, could let a request of `nbytes` (or the growth of `grow` by
        that much) succeed: a predicate on ids, or None when any freed memory may help."""
        return None

    def allocate_many(self, sizes: list[int], state: int = USED) -> list[int]:
        """Allocate each of `sizes` (bytes), all or nothing; returns the ids in order.

        The batched form of `allocate` for schedulers that place a whole step's requests at
        once. Raises InvalidRequest or OutOfMemory; on either, nothing was allocated and only
        the OOM itself is counted and logged.
        """
        for nbytes in sizes:
            if nbytes.__class__ is not int or nbytes <= 0:
                self._bad_size(nbytes)
            if nbytes > self.capacity_bytes:
                # ExceedsCapacity part-way would escape the OOM rollback below: a batch holding a
                # request past the whole pool is an OOM refused up front, as a paged pool's is.
                free = self.capacity_bytes - self.allocated_total
                raise self._oom(sum(sizes), free, self.largest_free_bytes(), "capacity", one_request=False)
        block_state(state)
        mark = (self._last_id, self._frees, self.events.last_seq, self._cursor())
        ids: list[int] = []
        try:
            for nbytes in sizes:
                ids.append(self.allocate(nbytes, state))
        except (OutOfMemory, InvalidRequest) as exc:  # InvalidRequest: a size above the capacity
            for aid in reversed(ids):  # LIFO: every free structure returns to where it was
                self._release(aid)
            self._last_id, self._frees, seq, cursor = mark
            self.events.truncate(seq)
            self._restore_cursor(cursor)
            if isinstance(exc, OutOfMemory):
                self.events.record("oom", exc.requested, exc.free, exc.largest_free, exc.cause)
            raise
        return ids

    def _cursor(self):
        """Placement state beyond the free structure (next fit's rover), for rollbacks."""
        return None

    def _restore_cursor(self, cursor) -> None:  # noqa: B027 - most strategies have no cursor
        pass

    def free_many(self, ids: list[int]) -> None:
        """Free every id in `ids`, all or nothing. Raises NotFound (unknown or repeated id)."""
        self._check_ids(ids)
        for aid in ids:
            self.free(aid)

    def _check_ids(self, ids: list[int]) -> None:
        seen: set[int] = set()
        for aid in ids:
            if aid in seen:
                raise NotFound("allocation", aid)  # the second free of a double free
            self._record(aid)
            seen.add(aid)

    def allocation(self, aid: int) -> Allocation:
        rec = self._record(aid)
        runs = self._block_runs(aid)
        return Allocation(
            id=aid,
            requested_bytes=rec[0],
            allocated_bytes=self.held_bytes(aid),
            blocks=runs,
            state=STATE_NAMES[self.blockmap.state[runs[0][0]]] if runs else "used",
            tier=self._tier_name(aid),
        )

    def block_runs(self, aid: int) -> list[list[int]]:
        """[start, count] runs of `aid`'s storage rows in data order. Raises NotFound."""
        self._record(aid)
        return self._block_runs(aid)

    def footprint(self, nbytes: int) -> int:
        """Bytes of pool memory a fresh allocation of `nbytes` would hold."""
        return -(-nbytes // self.block_bytes) * self.block_bytes

    def growth_bytes(self, aid: int, extra: int) -> int:
        """Bytes of pool memory `extend(aid, extra)` would add. Raises NotFound."""
        rec = self._record(aid)
        return max(0, self.footprint(rec[0] + extra) - self.held_bytes(aid))

    def held_bytes(self, aid: int) -> int:
        """Bytes of pool memory allocation `aid` holds. Raises NotFound."""
        self._record(aid)
        return len(self._block_ids(aid)) * self.block_bytes

    def largest_free_bytes(self) -> int:
        lengths = self._free_lengths()
        return int(lengths.max()) * self._free_unit_bytes() if lengths.size else 0

    def __contains__(self, aid: int) -> bool:
        return aid in self._allocs

    def ids(self) -> list[int]:
        return list(self._allocs)

    def __len__(self) -> int:
        return len(self._allocs)

    def block_ids(self, aid: int) -> list[int]:
        """Storage rows of `aid` in data order. Raises NotFound."""
        self._record(aid)
        return list(self._block_ids(aid))

    def write(self, aid: int, payload: bytes) -> None:
        """Store `payload` in the allocation's device memory (from its first byte)."""
        self._record(aid)
        self.storage.write(self._block_ids(aid), payload)

    def read(self, aid: int, nbytes: int | None = None) -> bytes:
        rec = self._record(aid)
        return self.storage.read(self._block_ids(aid), rec[0] if nbytes is None else nbytes)

    def set_state(self, aid: int, state: int) -> None:
        """Mark the blocks of `aid` USED, CACHED or PINNED (the cache does this). Raises
        NotFound, InvalidRequest (another state)."""
        self._record(aid)
        block_state(state)
        blocks = self._block_ids(aid)
        self.blockmap.set_state(blocks, state)
        self.events.record("state", aid, state, stored_ids(blocks))

    def state_of(self, aid: int) -> int:
        blocks = self._block_ids(aid)
        return self.blockmap.state[blocks[0]] if blocks else USED

    def defragment(self) -> DefragReport:
        """Compact live blocks to the low end with batched tensor copies, keeping every byte."""
        t0 = time.perf_counter()
        before = self._frag_summary()
        moves_before = self.counters["moves"]
        runs, disjoint = self._compact()
        t_copy = time.perf_counter()
        self.storage.move_runs(runs, disjoint)
        self.storage.synchronize()
        copy_seconds = time.perf_counter() - t_copy
        seconds = time.perf_counter() - t0
        after = self._frag_summary()
        self.blockmap.touch_all()
        moved = sum(r[2] for r in runs)
        self.counters["defragmentations"] += 1
        self.counters["moved_blocks"] += moved
        report = DefragReport(moved, moved * self.block_bytes, seconds, before, after, copy_seconds)
        self.events.record("defragment", moved, moved * self.block_bytes, seconds, before, after,
                           runs, self.counters["moves"] - moves_before)
        return report

    def reset(self) -> int:
        """Free everything, keep the configuration. Returns how many allocations were freed."""
        freed = len(self._allocs)
        self._reset_free_structure()
        self._allocs.clear()
        self.blockmap.clear()
        self.requested_total = 0
        for ext in list(self.extensions.values()):
            ext.on_pool_reset()
        self.events.record("reset", freed)
        return freed

    # -- extensions ---------------------------------------------------------------------------
    def attach(self, name: str, extension: PoolExtension) -> None:
        """Let `extension` (the KV cache as "cache", the history as "history") hear of resets and
        add its stats (when it has any) under `name`; one per name (a new one replaces the old)."""
        self.extensions[name] = extension

    @property
    def cache(self):
        """The KV cache built on this pool, or None (the extension named "cache")."""
        return self.extensions.get("cache")

    @cache.setter
    def cache(self, cache) -> None:
        # The old way a cache announced itself (`pool.cache = self`): kept working, as `attach`.
        if cache is None:
            self.extensions.pop("cache", None)
        else:
            self.attach("cache", cache)

    @property
    def history(self):
        """The event history kept of this pool (allocator/history/history.py History, the
        extension named "history"), or None: a pool keeps none unless one is attached
        (`History(pool)`, `create_pool(..., history=True)`; the server attaches one to each
        pool it serves)."""
        return self.extensions.get("history")

    @history.setter
    def history(self, history) -> None:
        if history is None:
            old = self.extensions.pop("history", None)
            if old is not None:
                old.detach()  # it takes the ring's events so far and stops draining it
        else:
            self.attach("history", history)

    # -- stats ---------------------------------------------------------------------------
    def _frag_summary(self) -> dict:
        s = fragmentation_stats(
            self._free_lengths(), self._free_unit_bytes(), self.requested_total, self.allocated_total
        )
        return {
            "external_fragmentation": s["external_fragmentation"],
            "largest_free_bytes": s["largest_free_bytes"],
            "free_extent_count": s["free_extent_count"],
        }

    def stats(self) -> dict:
        """The metrics of docs/ALLOCATOR.md (Metrics), as plain values. `stranded_free_bytes`: free
        bytes outside the largest free extent when scattered free space can fail a request, else 0."""
        frag = fragmentation_stats(
            self._free_lengths(), self._free_unit_bytes(), self.requested_total, self.allocated_total
        )
        counts = self.blockmap.counts()
        out = {
            "strategy": self.strategy,
            "total_blocks": self.num_blocks,
            "used_blocks": self.used_blocks,
            "free_blocks": self.num_blocks - self.used_blocks,
            "blocks_by_state": counts,
            "block_bytes": self.block_bytes,
            "capacity_bytes": self.capacity_bytes,
            "utilization": self.used_blocks / self.num_blocks,
            "requested_bytes": self.requested_total,
            "allocated_bytes": self.allocated_total,
            "allocation_count": len(self._allocs),
            **frag,
            "scatter_fails": self.scatter_fails,
            "stranded_free_bytes": frag["free_bytes"] - frag["largest_free_bytes"] if self.scatter_fails else 0,
            "counters": {"allocations": self._last_id, "frees": self._frees, **self.counters},
            "ooms": {
                "capacity": self.counters["ooms_capacity"],
                "fragmentation": self.counters["ooms_fragmentation"],
            },
            "last_event_seq": self.events.last_seq,
        }
        out.update(self._extra_stats())
        for name, ext in self.extensions.items():
            figures = ext.stats()
            if figures is not None:
                out[name] = figures
        return out

    def config(self) -> dict:
        return {
            "name": self.name,
            "strategy": self.strategy,
            "num_blocks": self.num_blocks,
            "block_bytes": self.block_bytes,
            "capacity_bytes": self.capacity_bytes,
            "device": str(self.storage.device),
            "model": self.model.to_dict() if self.model else None,
            "tokens_per_block": self.tokens_per_block,
            **self._extra_config(),
        }

    # -- invariants ------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Verify every invariant; returns the problems found (empty = ok). Not for hot paths."""
        problems: list[str] = []
        expected = np.full(self.num_blocks, NO_OWNER, dtype=np.int64)
        requested = allocated = used = 0
        for aid, rec in self._allocs.items():
            try:
                blocks = np.asarray(list(self._block_ids(aid)), dtype=np.int64)
            except CorruptState as broken:  # a compiled walk stopped at a bad link
                problems.append(str(broken))
                continue
            except NotFound:  # a record whose id the id lookup does not know
                problems.append(f"allocation {aid} is recorded but not found by its id")
                continue
            if blocks.size == 0:
                problems.append(f"allocation {aid} holds no blocks")
                continue
            if rec[0] > blocks.size * self.block_bytes or rec[0] <= 0:
                problems.append(f"allocation {aid}: requested {rec[0]} bytes but holds {blocks.size} blocks")
            if (blocks < 0).any() or (blocks >= self.num_blocks).any():
                problems.append(f"allocation {aid} holds a block outside the pool")
                continue
            clash = blocks[expected[blocks] != NO_OWNER]
            if clash.size or np.unique(blocks).size != blocks.size:
                b = int(clash[0]) if clash.size else int(blocks[0])
                problems.append(f"block {b} is owned twice (allocation {aid} and {int(expected[b])})")
            expected[blocks] = aid
            requested += rec[0]
            allocated += blocks.size * self.block_bytes
            used += blocks.size
        owners = self.blockmap.owners_np().astype(np.int64)
        diff = np.flatnonzero(owners != expected)
        if diff.size:
            b = int(diff[0])
            problems.append(
                f"block map owner of block {b} is {int(owners[b])}, expected {int(expected[b])} "
                f"({diff.size} blocks differ)"
            )
        states = self.blockmap.states_np()
        bad = np.flatnonzero((states == FREE) != (owners == NO_OWNER))
        if bad.size:
            b = int(bad[0])
            problems.append(f"block {b} has state {STATE_NAMES.get(int(states[b]), states[b])} "
                            f"but owner {int(owners[b])}")
        unknown = np.flatnonzero(~np.isin(states, list(STATE_NAMES)))
        if unknown.size:
            problems.append(f"block {int(unknown[0])} has an unknown state code {int(states[unknown[0]])}")
        problems += self._free_problems(expected == NO_OWNER)
        for what, have, want in (
            ("requested_total", self.requested_total, requested),
            ("allocated_total", self.allocated_total, allocated),
            ("used_blocks", self.used_blocks, used),
        ):
            if have != want:
                problems.append(f"counter {what} is {have}, allocations add up to {want}")
        return list(dict.fromkeys(problems))  # a broken chain is named by two of the checks

    # -- what each strategy implements ------------------------------------------------------
    # NOTE: not abstract: a strategy whose hot path is written out in full (paged) overrides
    # the public allocate/free/allocate_many/free_many instead of these two.
    def _allocate(self, aid: int, nbytes: int, state: int) -> None:
        """Place a new allocation `aid` of `nbytes` (already checked), or raise via `_oom`."""
        raise NotImplementedError

    @abstractmethod
    def _extend(self, aid: int, nbytes: int) -> bool:
        """Grow `aid` by `nbytes`; True when its data moved. Unchanged on OutOfMemory."""

    @abstractmethod
    def _truncate(self, aid: int, nbytes: int) -> None:
        """Shrink `aid` to `nbytes`, returning the blocks past the new end."""

    def _release(self, aid: int) -> None:
        """Return every block of `aid` to the free structure and forget it."""
        raise NotImplementedError

    @abstractmethod
    def _block_ids(self, aid: int):
        """Storage rows of `aid` in data order (a sequence of ints; no copy promised)."""

    @abstractmethod
    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        """Move live blocks to the low end: the (src, dst, count) runs, and whether disjoint."""

    @abstractmethod
    def _free_lengths(self) -> np.ndarray:
        """Lengths of the free runs, in units of `_free_unit_bytes()`."""

    @abstractmethod
    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        """Where the free structure disagrees with the blocks no allocation holds."""

    @abstractmethod
    def _reset_free_structure(self) -> None:
        """Everything free again (reset)."""

    # -- helpers for subclasses ----------------------------------------------------------
    def _record(self, aid):
        if aid.__class__ is not int:  # 1.0 and True hash like 1: they must not find id 1
            raise NotFound("allocation", aid)
        try:
            return self._allocs[aid]
        except (KeyError, TypeError):
            raise NotFound("allocation", aid) from None

    def _bad_size(self, nbytes: object) -> None:
        if isinstance(nbytes, int) and not isinstance(nbytes, bool):
            raise InvalidRequest(f"size must be positive, got {nbytes} bytes")
        raise InvalidRequest(f"size must be an integer number of bytes, got {nbytes!r}")

    def _oom(self, requested: int, free_bytes: int, largest_free: int, cause: str,
             one_request: bool = True) -> OutOfMemory | ExceedsCapacity:
        """The error for a refused request: ExceedsCapacity when one request exceeds the whole
        pool (it never fits; not counted as an OOM), else OutOfMemory (counted, logged). A batch
        (`one_request=False`) is an OOM like the calls it stands for."""
        if one_request and requested > self.capacity_bytes:
            return ExceedsCapacity(requested, self.capacity_bytes)
        self.counters["ooms_" + cause] += 1
        self.events.record("oom", requested, free_bytes, largest_free, cause)
        return OutOfMemory(requested, free_bytes, largest_free, cause)

    @property
    def allocated_total(self) -> int:
        """Bytes held by live allocations (every strategy allocates whole units)."""
        return self.used_blocks * self.block_bytes

    def _free_unit_bytes(self) -> int:
        return self.block_bytes

    def _tier_name(self, aid: int) -> str | None:
        return None

    def _block_runs(self, aid: int) -> list[list[int]]:
        ids = self._block_ids(aid)
        if isinstance(ids, range):  # one extent (contiguous): no need to walk it
            return [[ids.start, len(ids)]] if len(ids) else []
        return runs_of(ids)

    def _extra_stats(self) -> dict:
        return {}

    def _extra_config(self) -> dict:
        return {}


__all__ = ["Allocation", "DefragReport", "Pool", "runs_of", "FREE", "USED", "CACHED", "PINNED"]
