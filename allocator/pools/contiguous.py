"""ContiguousPool: variable-size extents in one arena; the strategy that fragments."""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from ..errors import InvalidRequest
from ..vocab import FITS
from .blockmap import FREE, NO_OWNER
from .pool import Pool, free_mismatch


class ContiguousPool(Pool):
    """One arena of `num_blocks` units; each allocation is a single run [start, start+units).

    Free space is a set of maximal extents: `_starts` (sorted list of starts), `_len_at`
    (start -> length) and `_start_of_end` (end -> start) so a freed extent coalesces with both
    neighbours in O(log n). A record is `[requested_bytes, start, units]`.

    This is the strategy that shows external fragmentation: a request fails with cause
    "fragmentation" when the free total suffices but no single extent does. `extend` grows in
    place when the following extent is free and large enough, else moves the data (a real copy)
    to a new extent, else fails.
    """

    strategy = "contiguous"

    def __init__(self, num_blocks: int, block_bytes: int, fit: str = "first", **kw) -> None:
        if fit not in FITS:  # allocator/vocab.py
            raise InvalidRequest(f"unknown fit {fit!r}; choose one of {list(FITS)}")
        super().__init__(num_blocks, block_bytes, **kw)
        self.fit = fit
        self._allocs: dict[int, list] = {}
        self._reset_free_structure()

    def _reset_free_structure(self) -> None:
        n = self.num_blocks
        self._starts = [0]
        self._len_at = {0: n}
        self._start_of_end = {n: 0}
        self._free_units = n
        self._rover = 0  # next-fit resumes its scan here

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._free_units

    # -- free-extent structure --------------------------------------------------------------
    def _add_free(self, start: int, length: int) -> None:
        """Insert a free extent, merging with free neighbours."""
        self._free_units += length
        end = start + length
        prev = self._start_of_end.pop(start, None)
        if prev is not None:  # merge with the extent ending where this one starts
            length += self._len_at.pop(prev)
            self._starts.pop(bisect_left(self._starts, prev))
            start = prev
        nxt = self._len_at.pop(end, None)
        if nxt is not None:  # merge with the extent starting where this one ends
            del self._start_of_end[end + nxt]
            self._starts.pop(bisect_left(self._starts, end))
            end += nxt
            length += nxt
        insort(self._starts, start)
        self._len_at[start] = length
        self._start_of_end[end] = start

    def _take_from(self, start: int, units: int) -> None:
        """Carve `units` from the front of free extent `start`."""
        length = self._len_at.pop(start)
        i = bisect_left(self._starts, start)
        del self._start_of_end[start + length]
        if length > units:
            self._starts[i] = start + units
            self._len_at[start + units] = length - units
            self._start_of_end[start + length] = start + units
        else:
            self._starts.pop(i)
        self._free_units -= units

    def _find(self, units: int) -> int | None:
        starts, len_at = self._starts, self._len_at
        if self.fit == "first":
            for s in starts:
                if len_at[s] >= units:
                    return s
            return None
        if self.fit == "next":
            i = bisect_left(starts, self._rover)
            for s in starts[i:] + starts[:i]:
                if len_at[s] >= units:
                    return s
            return None
        fits = [s for s in starts if len_at[s] >= units]
        if not fits:
            return None
        key = len_at.__getitem__
        return min(fits, key=key) if self.fit == "best" else max(fits, key=key)

    def _largest_free(self) -> int:
        return max(self._len_at.values(), default=0)

    def _fail(self, nbytes: int, units: int):
        bb = self.block_bytes
        cause = "fragmentation" if self._free_units >= units else "capacity"
        return self._oom(nbytes, self._free_units * bb, self._largest_free() * bb, cause)

    # -- strategy hooks -------------------------------------------------------------------
    def _allocate(self, aid: int, nbytes: int, state: int) -> None:
        bb = self.block_bytes
        units = -(-nbytes // bb)
        start = self._find(units)
        if start is None:
            raise self._fail(nbytes, units)
        self._take_from(start, units)
        self._rover = start + units
        self.blockmap.assign_range(start, units, aid, state)
        self._allocs[aid] = [nbytes, start, units]
        self.requested_total += nbytes
        self.events.record("allocate", aid, nbytes, units * bb, units, range(start, start + units), state)

    def _extend(self, aid: int, nbytes: int) -> bool:
        rec = self._allocs[aid]
        bb = self.block_bytes
        requested, start, units = rec
        new_units = -(-(requested + nbytes) // bb)
        extra = new_units - units
        moved = False
        state = self.blockmap.state[start]
        taken = freed = None
        if extra > 0:
            end = start + units
            following = self._len_at.get(end, 0)
            if following >= extra:  # grow in place
                self._take_from(end, extra)
                self.blockmap.assign_range(end, extra, aid, state)
                rec[2] = new_units
                taken = range(end, end + extra)
            else:
                new_start = self._find_for_move(start, units, new_units)
                if new_start is None:
                    raise self._fail(extra * bb, extra)
                self._move_extent(aid, rec, new_start, new_units, state)
                moved = True
                taken, freed = range(new_start, new_start + new_units), range(start, start + units)
                self.counters["moves"] += 1
                self.counters["moved_blocks"] += units
        rec[0] += nbytes
        self.requested_total += nbytes
        self.counters["extends"] += 1
        self.events.record("extend", aid, rec[0], rec[2] * bb, moved, taken, freed, nbytes, state)
        return moved

    def _find_for_move(self, start: int, units: int, new_units: int) -> int | None:
        """A start for `new_units` units elsewhere, or in the old place widened by free neighbours."""
        found = self._find(new_units)
        if found is not None:
            return found
        # The old extent plus its free neighbours may hold the new size once the old one is
        # released; only then would a slide within that window work.
        before = self._start_of_end.get(start)
        lo = before if before is not None else start
        hi = start + units + self._len_at.get(start + units, 0)
        return lo if hi - lo >= new_units else None

    def _move_extent(self, aid: int, rec: list, new_start: int, new_units: int, state: int) -> None:
        _, start, units = rec
        # Release the old extent first so that a window overlapping it can be used.
        self._add_free(start, units)
        self._carve(new_start, new_units)
        self.storage.move_range(start, new_start, units)
        self.blockmap.assign_range(start, units, NO_OWNER, FREE)
        self.blockmap.assign_range(new_start, new_units, aid, state)
        rec[1], rec[2] = new_start, new_units

    def _containing_free(self, pos: int) -> int:
        i = bisect_left(self._starts, pos + 1) - 1
        return self._starts[i]

    def _carve(self, start: int, units: int) -> None:
        """Mark [start, start+units) used; it must lie inside one free extent."""
        ext = self._containing_free(start)
        length = self._len_at[ext]
        assert ext <= start and start + units <= ext + length, "carve outside a free extent"
        self._take_from(ext, length)
        if start > ext:
            self._add_free(ext, start - ext)
        if ext + length > start + units:
            self._add_free(start + units, ext + length - start - units)

    def _cursor(self) -> int:
        return self._rover

    def _restore_cursor(self, cursor: int) -> None:
        self._rover = cursor

    def _truncate(self, aid: int, nbytes: int):
        rec = self._allocs[aid]
        requested, start, units = rec
        keep = -(-nbytes // self.block_bytes)
        freed = None
        if keep < units:
            self._add_free(start + keep, units - keep)
            self.blockmap.assign_range(start + keep, units - keep, NO_OWNER, FREE)
            rec[2] = keep
            freed = range(start + keep, start + units)
        rec[0] = nbytes
        self.requested_total += nbytes - requested
        return freed

    def _release(self, aid: int) -> None:
        requested, start, units = self._allocs.pop(aid)
        self._add_free(start, units)
        self.blockmap.assign_range(start, units, NO_OWNER, FREE)
        self.requested_total -= requested
        self._frees += 1
        self.events.record("free", aid, units, range(start, start + units), requested)

    def _block_ids(self, aid: int):
        _, start, units = self._allocs[aid]
        return range(start, start + units)

    def _compact(self) -> tuple[list[tuple[int, int, int]], bool]:
        """Slide every extent, in address order, down to the lowest free address. Applied in
        that order the moves never overwrite a source not yet copied (each destination lies
        below its source and above every earlier extent)."""
        runs: list[tuple[int, int, int]] = []
        bm = self.blockmap
        order = sorted(self._allocs.items(), key=lambda kv: kv[1][1])
        states = {aid: bm.state[rec[1]] for aid, rec in order}
        cursor = 0
        for _aid, rec in order:
            start, units = rec[1], rec[2]
            if start != cursor:
                runs.append((start, cursor, units))
                rec[1] = cursor
            cursor += units
        bm.clear()
        for aid, rec in order:
            bm.assign_range(rec[1], rec[2], aid, states[aid])
        self._reset_free_structure()
        if cursor:
            self._take_from(0, cursor)
        self.counters["moves"] += len(runs)
        return runs, False

    def _free_lengths(self) -> np.ndarray:
        return np.fromiter(self._len_at.values(), dtype=np.int64, count=len(self._len_at))

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        problems = []
        in_free = np.zeros(self.num_blocks, dtype=bool)
        if sorted(self._len_at) != self._starts:
            problems.append("free extent index is out of order or out of sync")
        prev_end = -1
        for s in self._starts:
            length = self._len_at.get(s, 0)
            if length <= 0:
                problems.append(f"free extent at {s} has length {length}")
                continue
            if s == prev_end:
                problems.append(f"free extents at unit {s} are adjacent but not coalesced")
            if s < prev_end:
                problems.append(f"free extent at {s} overlaps the previous one")
            if self._start_of_end.get(s + length) != s:
                problems.append(f"free extent at {s} is missing from the end index")
            in_free[s : s + length] = True
            prev_end = s + length
        if len(self._start_of_end) != len(self._len_at):
            problems.append("free extent end index has stale entries")
        if int(in_free.sum()) != self._free_units:
            problems.append(f"free unit counter is {self._free_units}, extents hold {int(in_free.sum())}")
        problems += free_mismatch(in_free, expected_free, "unit", "a free extent")
        return problems

    def _extra_stats(self) -> dict:
        return {"fit": self.fit}

    def _extra_config(self) -> dict:
        return {"fit": self.fit}
