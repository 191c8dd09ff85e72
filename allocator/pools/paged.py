"""PagedPool: fixed-size blocks handed out from a free list, vLLM style (compiled core)."""

from __future__ import annotations

import numpy as np

from .._core import PagedCore
from ..errors import NotFound, block_state
from .blockmap import FREE, NO_OWNER, USED
from .events import stored_ids
from .pool import Pool, free_mismatch, pair_runs


class PagedPool(Pool):
    """Fixed-size blocks; an allocation holds any blocks, in any order.

    The per-operation state (free list, per-allocation records, block-map stamps, events) is
    `_core`, a compiled `PagedCore` (allocator/_paged.pxi): an allocation's blocks are a chain
    of int32 links, the free blocks another, records sit in flat arrays behind an id table. A
    fresh pool fills from block 0, and freed blocks are handed out again first, in the order
    they were held (a LIFO of block runs, like a stack of block ids).

    NOTE: `allocate`, `free`, `allocate_many` and `free_many` are bound per instance to the
    core's methods, so a call from Python goes straight into C without a Python frame; the
    methods below say what they do and serve `PagedPool.allocate(pool, ...)` callers.

    NOTE: there is no external fragmentation to fail on: any n free blocks serve an n-block
    request. `external_fragmentation` is still reported, since the map shows the scatter.
    """

    strategy = "paged"
    _core: PagedCore | None = None

    def __init__(self, num_blocks: int, block_bytes: int, **kw) -> None:
        super().__init__(num_blocks, block_bytes, **kw)
        core = self._core = PagedCore(self.blockmap, self.events, block_bytes, self._oom,
                                      self._bad_size, NotFound)
        self.allocate = core.allocate
        self.free = self._release = core.free
        self.allocate_many = core.allocate_many
        self.free_many = core.free_many

    # -- counters kept by the core (Pool.__init__ / reset assign them) ------------------------
    def _counter(name: str):  # noqa: N805 -- a property factory used in the class body
        def get(self):
            return getattr(self._core, name) if self._core is not None else 0

        def put(self, value):
            if self._core is not None:
                setattr(self._core, name, value)
        return property(get, put)

    requested_total = _counter("requested_total")
    _last_id = _counter("last_id")
    _frees = _counter("frees")
    del _counter

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._core.free_count

    @property
    def _allocs(self) -> dict[int, tuple[int]]:
        """id -> (requested_bytes,): a snapshot for check() and reports, never the hot path."""
        aids, req = self._core.records()[:2]
        return {int(a): (int(r),) for a, r in zip(aids, req)}

    # -- Pool interface -------------------------------------------------------------------------
    def allocate(self, nbytes: int, state: int = USED) -> int:
        """Allocate `nbytes` as ceil(nbytes / block_bytes) blocks; returns the allocation id.

        Raises InvalidRequest (size not a positive int) or OutOfMemory (cause "capacity").
        """
        return self._core.allocate(nbytes, state)

    def free(self, aid: int) -> None:
        """Return every block of `aid` to the pool. Raises NotFound (also on double free)."""
        self._core.free(aid)

    def allocate_many(self, sizes: list[int], state: int = USED) -> list[int]:
        """Allocate each of `sizes` (bytes), all or nothing; returns the ids in order.
        Raises InvalidRequest or OutOfMemory (nothing allocated; the OOM is logged)."""
        return self._core.allocate_many(sizes, state)

    def free_many(self, ids: list[int]) -> None:
        """Free every id in `ids`, all or nothing. Raises NotFound (unknown or repeated id)."""
        self._core.free_many(ids)

    def __contains__(self, aid: int) -> bool:
        return aid in self._core

    def __len__(self) -> int:
        return self._core.live

    def ids(self) -> list[int]:
        return self._core.ids()

    def _record(self, aid):
        return (self._core.requested(aid),)

    def held_bytes(self, aid: int) -> int:
        return self._core.count(aid) * self.block_bytes

    def state_of(self, aid: int) -> int:
        return self.blockmap.state[self._core.first_block(aid)]

    def set_state(self, aid: int, state: int) -> None:
        """Mark the blocks of `aid` USED, CACHED or PINNED (the cache does this). Raises
        NotFound, InvalidRequest (another state)."""
        self._core.count(aid)  # NotFound first, as every pool answers
        self._core.set_state(aid, block_state(state))
        self.events.record("state", aid, state, stored_ids(self._core.block_ids(aid)))

    def _reset_free_structure(self) -> None:
        if self._core is not None:
            self._core.reset()

    def _extend(self, aid: int, nbytes: int) -> bool:
        new = self._core.extend(aid, nbytes)
        self.counters["extends"] += 1
        self.events.record("extend", aid, self._core.requested(aid), self.held_bytes(aid), False,
                           stored_ids(new), None, nbytes, self.state_of(aid))
        return False

    def _truncate(self, aid: int, nbytes: int) -> list[int]:
        return self._core.truncate(aid, nbytes)

    def _block_ids(self, aid: int) -> list[int]:
        return self._core.block_ids(aid)

    def _block_runs(self, aid: int) -> list[list[int]]:
        return self._core.block_runs(aid)

    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        """Two-finger compaction: the live blocks above the `used` line move into the free holes
        below it, lowest hole first. Only blocks that must move do; each allocation keeps its
        data order (its chain is relinked through the moved ids). Sources (live) and
        destinations (free) are disjoint, so the copies may run in any order, batched."""
        used = self.used_blocks
        owners = self.blockmap.owners_np()
        states = self.blockmap.states_np()
        src = np.flatnonzero(owners[used:] != NO_OWNER) + used
        dst = np.flatnonzero(owners[:used] == NO_OWNER)
        assert src.size == dst.size, "live blocks above the line must equal holes below it"
        if src.size == 0:
            return [], True
        touched = np.unique(owners[src]).size
        owners[dst] = owners[src]
        states[dst] = states[src]
        owners[src] = NO_OWNER
        states[src] = FREE
        self._core.compact_chains(src, dst)
        self.counters["moves"] += touched
        return pair_runs(src, dst), True

    def _free_lengths(self) -> np.ndarray:
        return self.blockmap.free_runs()[1]

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        problems = self._core.check()
        free = self._core.free_blocks()
        if free is None:
            return problems
        if np.unique(free).size != free.size:
            problems.append("a block appears twice in the free list")
        in_list = np.zeros(self.num_blocks, dtype=bool)
        in_list[free] = True
        problems += free_mismatch(in_list, expected_free, "block", "the free list")
        return problems
