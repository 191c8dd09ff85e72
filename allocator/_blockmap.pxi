# Included by _core.pyx: the block map.

from array import array as _array

from libc.string cimport memset

cdef enum:
    CHUNK_SHIFT_C = 6


cdef class BlockMap:
    """Compact per-block owner and state arrays (no Python object per block), compiled so the
    pool's C code stamps them directly.

    - `owner[b]`: allocation id owning block b, or -1 when free (array 'i', 4 bytes/block).
    - `state[b]`: FREE, USED (raw allocation), CACHED (evictable entry) or PINNED (bytearray).
    - `chunk_version[c]`: the map `version` current when chunk c (64 blocks) last changed.
      Writers only stamp (no counter bump on the hot path); a reader's `changes_since(v)`
      reports chunks stamped >= v and then advances `version`, returning the value to pass next
      time. Any number of readers can track changes independently; none clears anything.

    Invariant: owner[b] == -1 iff state[b] == FREE. The three arrays are never resized (their
    buffers are held by the compiled code; writes go in place).
    """

    def __cinit__(self, Py_ssize_t num_blocks):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.owner = _array("i", (-1,)) * num_blocks  # one allocation, filled by repetition
        self.state = bytearray(num_blocks)
        self.chunk_version = _array("I", bytes(4 * ((num_blocks + 63) >> CHUNK_SHIFT_C)))
        self.version = 1
        cdef int32_t[::1] o = self.owner
        cdef uint8_t[::1] s = self.state
        cdef uint32_t[::1] c = self.chunk_version
        self.own, self.st, self.cv = &o[0], &s[0], &c[0]
        self._views = (o, s, c)

    def clear(self) -> None:
        """Every block free and unowned; every chunk marked changed."""
        cdef Py_ssize_t b
        for b in range(self.num_blocks):
            self.own[b] = -1
        memset(self.st, 0, self.num_blocks)
        self.touch_all()

    # -- mutation ------------------------------------------------------------------------
    def assign(self, blocks, int32_t owner, uint8_t state) -> None:
        """Set owner and state of the given block indices (iterable of ints)."""
        cdef uint32_t v = self.version
        cdef Py_ssize_t b
        for b in blocks:
            if b < 0 or b >= self.num_blocks:
                raise IndexError(f"block {b} outside the map")
            self.own[b] = owner
            self.st[b] = state
            self.cv[b >> CHUNK_SHIFT_C] = v

    def assign_range(self, Py_ssize_t start, Py_ssize_t count, int32_t owner, uint8_t state) -> None:
        """Set owner and state of blocks [start, start+count)."""
        if start < 0 or count < 0 or start > self.num_blocks or count > self.num_blocks - start:
            raise IndexError(f"blocks [{start}, {start} + {count}) outside the map")  # no overflowing sum
        cdef Py_ssize_t b
        cdef uint32_t v = self.version
        for b in range(start, start + count):
            self.own[b] = owner
            self.st[b] = state
        if count:
            for b in range(start >> CHUNK_SHIFT_C, ((start + count - 1) >> CHUNK_SHIFT_C) + 1):
                self.cv[b] = v

    def set_state(self, blocks, uint8_t state) -> None:
        cdef uint32_t v = self.version
        cdef Py_ssize_t b
        for b in blocks:
            if b < 0 or b >= self.num_blocks:
                raise IndexError(f"block {b} outside the map")
            self.st[b] = state
            self.cv[b >> CHUNK_SHIFT_C] = v

    def touch_all(self) -> None:
        """Mark every block changed (after reset or a defragmentation)."""
        cdef Py_ssize_t c
        for c in range((self.num_blocks + 63) >> CHUNK_SHIFT_C):
            self.cv[c] = self.version

    # -- reading -------------------------------------------------------------------------
    def owners_np(self):
        return np.frombuffer(self.owner, dtype=np.int32)

    def states_np(self):
        return np.frombuffer(self.state, dtype=np.uint8)

    def checkpoint(self) -> int:
        """Start tracking from now: pass the result to `changes_since` next time."""
        self.version += 1
        return self.version

    def changes_since(self, since: int) -> tuple:
        """(next `since`, [(start, count), ...] block runs changed since the checkpoint `since`)."""
        cv = np.frombuffer(self.chunk_version, dtype=np.uint32)
        changed = np.flatnonzero(cv >= since)
        self.version += 1
        if changed.size == 0:
            return self.version, []
        breaks = np.flatnonzero(np.diff(changed) != 1)  # split where chunks are not adjacent
        starts = np.concatenate(([changed[0]], changed[breaks + 1]))
        ends = np.concatenate((changed[breaks], [changed[-1]])) + 1
        runs = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            b0 = s << CHUNK_SHIFT_C
            b1 = min(e << CHUNK_SHIFT_C, self.num_blocks)
            runs.append((b0, b1 - b0))
        return self.version, runs

    def free_runs(self) -> tuple:
        """(starts, lengths) of maximal runs of free blocks, in block order."""
        free = np.frombuffer(self.state, dtype=np.uint8) == 0
        if not free.any():
            return np.empty(0, np.int64), np.empty(0, np.int64)
        padded = np.concatenate(([False], free, [False])).astype(np.int8)
        edges = np.diff(padded)
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1)
        return starts, ends - starts

    def counts(self) -> dict:
        from .vocab import STATE_NAMES
        counts = np.bincount(np.frombuffer(self.state, dtype=np.uint8), minlength=max(STATE_NAMES) + 1)
        return {STATE_NAMES[i]: int(counts[i]) for i in STATE_NAMES}


def map_summary(const int32_t[::1] owner, const uint8_t[::1] state):
    """One pass over a block map: (blocks with an owner, count of each state code 0..7 as an
    int64 array, the lengths of the maximal runs of FREE blocks in block order as int64).
    What Pool.stats() derives from the map, for a map rebuilt from history
    (allocator/history/view.py stats_of) without numpy's several passes over a 1M-block map."""
    cdef Py_ssize_t n = min(owner.shape[0], state.shape[0]), b, used = 0, run = 0, nruns = 0
    counts = np.zeros(8, dtype=np.int64)
    cdef int64_t[::1] c = counts
    lengths = np.empty(n // 2 + 1, dtype=np.int64)  # at most every other block starts a run
    cdef int64_t[::1] L = lengths
    cdef uint8_t s
    for b in range(n):
        if owner[b] != -1:
            used += 1
        s = state[b]
        c[s & 7] += 1
        if s == 0:
            run += 1
        elif run:
            L[nruns] = run
            nruns += 1
            run = 0
    if run:
        L[nruns] = run
        nruns += 1
    return used, counts, lengths[:nruns].copy()
