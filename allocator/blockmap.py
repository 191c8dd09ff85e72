"""BlockMap: who owns each block and in what state, with change tracking for the stream."""

from __future__ import annotations

from array import array

import numpy as np

from .vocab import BLOCK_STATES, STATE_NAMES

# State codes (allocator/vocab.py names them; the codes are the stream's wire format).
FREE, USED, CACHED, PINNED = (BLOCK_STATES[n] for n in ("free", "used", "cached", "pinned"))
NO_OWNER = -1

# A change marks the chunk of CHUNK blocks holding it. 64 blocks keep a delta's overhead small
# (a run of 64 changed cells costs 64*5 bytes) while the version array of a 1M-block pool stays
# at 15,625 entries, scanned with numpy in microseconds.
CHUNK_SHIFT = 6
CHUNK = 1 << CHUNK_SHIFT


class BlockMap:
    """Compact per-block owner and state arrays (no Python object per block).

    - `owner[b]`: allocation id owning block b, or -1 when free (array 'i', 4 bytes/block).
    - `state[b]`: FREE, USED (raw allocation), CACHED (evictable entry) or PINNED (bytearray).
    - `chunk_version[c]`: the map `version` current when chunk c last changed. Writers only
      stamp (no counter bump on the hot path); a reader's `changes_since(v)` reports chunks
      stamped >= v and then advances `version`, returning the value to pass next time. Any
      number of readers can track changes independently; none clears anything.

    Invariant: owner[b] == -1 iff state[b] == FREE.
    """

    __slots__ = ("num_blocks", "owner", "state", "chunk_version", "version")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.owner = array("i", np.full(num_blocks, NO_OWNER, dtype=np.int32).tobytes())
        self.state = bytearray(num_blocks)
        self.chunk_version = array("I", bytes(4 * ((num_blocks + CHUNK - 1) >> CHUNK_SHIFT)))
        self.version = 1

    def clear(self) -> None:
        """Every block free and unowned; every chunk marked changed."""
        self.owner[:] = array("i", np.full(self.num_blocks, NO_OWNER, dtype=np.int32).tobytes())
        self.state[:] = bytes(self.num_blocks)
        self.touch_all()

    # -- mutation (hot path) -------------------------------------------------------------
    def assign(self, blocks, owner: int, state: int) -> None:
        """Set owner and state of the given block indices (iterable of ints)."""
        v = self.version
        own, st, cv = self.owner, self.state, self.chunk_version
        for b in blocks:
            own[b] = owner
            st[b] = state
            cv[b >> CHUNK_SHIFT] = v

    def assign_range(self, start: int, count: int, owner: int, state: int) -> None:
        """Set owner and state of blocks [start, start+count) with slice writes."""
        v = self.version
        end = start + count
        self.owner[start:end] = array("i", (owner,)) * count
        self.state[start:end] = bytes((state,)) * count
        cv = self.chunk_version
        for c in range(start >> CHUNK_SHIFT, ((end - 1) >> CHUNK_SHIFT) + 1):
            cv[c] = v

    def set_state(self, blocks, state: int) -> None:
        v = self.version
        st, cv = self.state, self.chunk_version
        for b in blocks:
            st[b] = state
            cv[b >> CHUNK_SHIFT] = v

    def touch_all(self) -> None:
        """Mark every block changed (after reset or a defragmentation)."""
        self.chunk_version[:] = array("I", (self.version,)) * len(self.chunk_version)

    # -- reading -------------------------------------------------------------------------
    def owners_np(self) -> np.ndarray:
        return np.frombuffer(self.owner, dtype=np.int32)

    def states_np(self) -> np.ndarray:
        return np.frombuffer(self.state, dtype=np.uint8)

    def checkpoint(self) -> int:
        """Start tracking from now: pass the result to `changes_since` next time."""
        self.version += 1
        return self.version

    def changes_since(self, since: int) -> tuple[int, list[tuple[int, int]]]:
        """(next `since`, [(start, count), ...] block runs changed since the checkpoint `since`)."""
        cv = np.frombuffer(self.chunk_version, dtype=np.uint32)
        changed = np.flatnonzero(cv >= since)
        self.version += 1
        if changed.size == 0:
            return self.version, []
        # Split where consecutive changed chunks are not adjacent.
        breaks = np.flatnonzero(np.diff(changed) != 1)
        starts = np.concatenate(([changed[0]], changed[breaks + 1]))
        ends = np.concatenate((changed[breaks], [changed[-1]])) + 1
        runs = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            b0 = s << CHUNK_SHIFT
            b1 = min(e << CHUNK_SHIFT, self.num_blocks)
            runs.append((b0, b1 - b0))
        return self.version, runs

    def free_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of maximal runs of free blocks, in block order."""
        free = np.frombuffer(self.state, dtype=np.uint8) == FREE
        if not free.any():
            return np.empty(0, np.int64), np.empty(0, np.int64)
        padded = np.concatenate(([False], free, [False])).astype(np.int8)
        edges = np.diff(padded)
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1)
        return starts, ends - starts

    def counts(self) -> dict[str, int]:
        counts = np.bincount(np.frombuffer(self.state, dtype=np.uint8), minlength=max(STATE_NAMES) + 1)
        return {STATE_NAMES[i]: int(counts[i]) for i in STATE_NAMES}
