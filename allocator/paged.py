"""PagedPool: fixed-size blocks handed out from a free stack, vLLM style."""

from __future__ import annotations

from array import array
from time import time as _now

import numpy as np

from .blockmap import CHUNK_SHIFT, FREE, NO_OWNER, USED
from .errors import NotFound
from .pool import Pool, free_mismatch, pair_runs


class PagedPool(Pool):
    """Fixed-size blocks; an allocation holds any blocks, in any order.

    `_free` is an array('i') stack of free block ids, highest first, so pops hand out the lowest
    ids and a fresh pool fills from block 0. n blocks are taken as one slice. A record is the
    tuple `(requested_bytes, blocks)` with `blocks` an array('i') in data order: a tuple of
    untracked values leaves the cyclic GC's books at its first pass (a list never would), so a
    pool full of live allocations adds nothing to full collections.

    NOTE: there is no external fragmentation to fail on: any n free blocks serve an n-block
    request. `external_fragmentation` is still reported, since the map shows the scatter.
    """

    strategy = "paged"

    def __init__(self, num_blocks: int, block_bytes: int, **kw) -> None:
        super().__init__(num_blocks, block_bytes, **kw)
        self._allocs: dict[int, tuple[int, array]] = {}
        self._reset_free_structure()

    def _reset_free_structure(self) -> None:
        self._free = array("i", np.arange(self.num_blocks - 1, -1, -1, dtype=np.int32).tobytes())

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def _take(self, n: int) -> array:
        free = self._free
        blocks = free[-n:]
        del free[-n:]
        blocks.reverse()
        return blocks

    # NOTE: allocate and free are written out in full, without helper calls, because they are
    # the hot path that every benchmark and every serving step goes through: each Python call
    # saved is ~5% of a single-block allocate+free.
    def allocate(self, nbytes: int, state: int = USED) -> int:
        """Allocate `nbytes` as ceil(nbytes / block_bytes) blocks; returns the allocation id.

        Raises InvalidRequest (size not a positive int) or OutOfMemory (cause "capacity").
        """
        if nbytes.__class__ is not int or nbytes <= 0:
            self._bad_size(nbytes)
        n = -(-nbytes // self.block_bytes)
        free = self._free
        if n > len(free):
            free_bytes = len(free) * self.block_bytes
            raise self._oom(nbytes, free_bytes, free_bytes, "capacity")
        self._last_id = aid = self._last_id + 1
        blocks = free[-n:]
        del free[-n:]
        v = self._bm.version
        own, st, cv = self._own, self._st, self._cv
        if n == 1:
            b = blocks[0]
            own[b] = aid
            st[b] = state
            cv[b >> CHUNK_SHIFT] = v
        else:
            blocks.reverse()
            for b in blocks:
                own[b] = aid
                st[b] = state
                cv[b >> CHUNK_SHIFT] = v
            b = blocks.tobytes()  # events hold ids as an int or int32 bytes (fast to pack)
        self._allocs[aid] = (nbytes, blocks)
        self.requested_total += nbytes
        ev = self.events
        ev.last_seq = seq = ev.last_seq + 1
        ev._append((seq, _now(), "allocate", aid, nbytes, n * self.block_bytes, n, b, state))
        if seq >= ev.spill_at:
            ev.sink.spill()
        return aid

    def allocate_many(self, sizes: list[int], state: int = USED) -> list[int]:
        """Allocate each of `sizes` (bytes), all or nothing; returns the ids in order.

        One call per scheduler step instead of one per request: sizes are validated and the
        total checked against the free stack before anything changes, then each allocation is
        made with the loop-invariant lookups hoisted. Raises InvalidRequest or OutOfMemory.
        """
        bb = self.block_bytes
        counts = []
        for nbytes in sizes:
            if nbytes.__class__ is not int or nbytes <= 0:
                self._bad_size(nbytes)
            counts.append(-(-nbytes // bb))
        free = self._free
        total = sum(counts)
        if total > len(free):
            free_bytes = len(free) * bb
            raise self._oom(sum(sizes), free_bytes, free_bytes, "capacity")
        ev = self.events
        ev.reserve(len(sizes))
        v = self._bm.version
        own, st, cv = self._own, self._st, self._cv
        allocs, append = self._allocs, ev._append
        seq = ev.last_seq
        aid = self._last_id
        now = _now()
        ids = []
        for nbytes, n in zip(sizes, counts):
            aid += 1
            blocks = free[-n:]
            del free[-n:]
            if n > 1:
                blocks.reverse()
            for b in blocks:
                own[b] = aid
                st[b] = state
                cv[b >> CHUNK_SHIFT] = v
            allocs[aid] = (nbytes, blocks)
            seq += 1
            append((seq, now, "allocate", aid, nbytes, n * bb, n, blocks.tobytes() if n > 1 else blocks[0], state))
            ids.append(aid)
        self._last_id = aid
        ev.last_seq = seq
        self.requested_total += sum(sizes)
        return ids

    def free_many(self, ids: list[int]) -> None:
        """Free every id in `ids`, all or nothing. Raises NotFound (unknown or repeated id)."""
        allocs = self._allocs
        if len(set(ids)) != len(ids) or not all(aid.__class__ is int and aid in allocs for aid in ids):
            self._check_ids(ids)  # names the offending id
        ev = self.events
        ev.reserve(len(ids))
        v = self._bm.version
        own, st, cv = self._own, self._st, self._cv
        free = self._free
        append = ev._append
        seq = ev.last_seq
        now = _now()
        requested = 0
        for aid in ids:
            req, blocks = allocs.pop(aid)
            requested += req
            for b in blocks:
                own[b] = NO_OWNER
                st[b] = FREE
                cv[b >> CHUNK_SHIFT] = v
            # Reversed as a copy: the allocate event still holds `blocks` (events never change).
            free.extend(blocks[::-1] if len(blocks) > 1 else blocks)
            seq += 1
            append((seq, now, "free", aid, len(blocks), blocks.tobytes() if len(blocks) > 1 else blocks[0], req))
        ev.last_seq = seq
        self.requested_total -= requested
        self._frees += len(ids)

    def _extend(self, aid: int, nbytes: int) -> bool:
        rec = self._allocs[aid]
        bb = self.block_bytes
        blocks = rec[1]
        need = -(-(rec[0] + nbytes) // bb) - len(blocks)
        if need > len(self._free):
            free_bytes = len(self._free) * bb
            raise self._oom(need * bb, free_bytes, free_bytes, "capacity")
        state = self.blockmap.state[blocks[0]]
        new = None
        if need:
            new = self._take(need)
            self.blockmap.assign(new, aid, state)
            blocks = blocks + new  # a new array: events recorded earlier hold the old one
        self._allocs[aid] = (rec[0] + nbytes, blocks)
        self.requested_total += nbytes
        self.counters["extends"] += 1
        self.events.record("extend", aid, rec[0] + nbytes, len(blocks) * bb, False,
                           new and new.tobytes(), None, nbytes, state)
        return False

    def free(self, aid: int) -> None:
        """Return every block of `aid` to the pool. Raises NotFound (also on double free)."""
        if aid.__class__ is not int:  # 1.0 and True hash like 1: they must not free id 1
            raise NotFound("allocation", aid)
        try:
            requested, blocks = self._allocs.pop(aid)
        except (KeyError, TypeError):
            raise NotFound("allocation", aid) from None
        v = self._bm.version
        own, st, cv = self._own, self._st, self._cv
        n = len(blocks)
        if n == 1:
            b = blocks[0]
            own[b] = NO_OWNER
            st[b] = FREE
            cv[b >> CHUNK_SHIFT] = v
            self._free.append(b)
            blocks = b  # the event names one block as an int
        else:
            for b in blocks:
                own[b] = NO_OWNER
                st[b] = FREE
                cv[b >> CHUNK_SHIFT] = v
            self._free.extend(blocks[::-1])  # a copy: the allocate event still holds `blocks`
        self.requested_total -= requested
        self._frees += 1
        ev = self.events
        ev.last_seq = seq = ev.last_seq + 1
        ev._append((seq, _now(), "free", aid, n, blocks if n == 1 else blocks.tobytes(), requested))
        if seq >= ev.spill_at:
            ev.sink.spill()

    _release = free

    def _truncate(self, aid: int, nbytes: int):
        requested, blocks = self._allocs[aid]
        keep = -(-nbytes // self.block_bytes)
        tail = blocks[keep:]
        if tail:
            blocks = blocks[:keep]  # a new array: events recorded earlier hold the old one
            self.blockmap.assign(tail, NO_OWNER, FREE)
            self._free.extend(tail[::-1])
        self._allocs[aid] = (nbytes, blocks)
        self.requested_total += nbytes - requested
        return tail.tobytes()

    def _block_ids(self, aid: int):
        return self._allocs[aid][1]

    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        """Two-finger compaction: the live blocks above the `used` line move into the free holes
        below it, lowest hole first. Only blocks that must move do; each allocation keeps its
        data order (its block ids are substituted in place). Sources (live) and destinations
        (free) are disjoint, so the copies may run in any order, batched."""
        used = self.used_blocks
        owners = self.blockmap.owners_np()
        states = self.blockmap.states_np()
        src = np.flatnonzero(owners[used:] != NO_OWNER) + used
        dst = np.flatnonzero(owners[:used] == NO_OWNER)
        assert src.size == dst.size, "live blocks above the line must equal holes below it"
        if src.size == 0:
            return [], True
        remap = np.arange(self.num_blocks, dtype=np.int32)
        remap[src] = dst
        touched = np.unique(owners[src]).tolist()
        for aid in touched:
            rec = self._allocs[aid]
            self._allocs[aid] = (rec[0], array("i", remap[np.frombuffer(rec[1], dtype=np.int32)].tobytes()))
        owners[dst] = owners[src]
        states[dst] = states[src]
        owners[src] = NO_OWNER
        states[src] = FREE
        self._free = array("i", np.arange(self.num_blocks - 1, used - 1, -1, dtype=np.int32).tobytes())
        self.counters["moves"] += len(touched)
        return pair_runs(src, dst), True

    def _free_lengths(self) -> np.ndarray:
        return self.blockmap.free_runs()[1]

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        free = np.frombuffer(self._free, dtype=np.int32)
        problems = []
        if np.unique(free).size != free.size:
            problems.append("a block appears twice in the free stack")
        in_stack = np.zeros(self.num_blocks, dtype=bool)
        in_stack[free] = True
        problems += free_mismatch(in_stack, expected_free, "block", "the free stack")
        return problems


