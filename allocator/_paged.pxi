# Included by _core.pyx: the per-operation state of a paged pool.

from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport INT64_MAX, uint64_t


cdef inline int64_t exact_int(object x) noexcept:
    """x as an int64 when it is exactly an int (not bool, not float): INT64_MAX when it is an
    int too large for int64, 0 when it is not an int (callers treat <= 0 as invalid)."""
    cdef int overflow = 0
    cdef long long v
    if type(x) is not int:
        return 0
    v = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow:
        return INT64_MAX if overflow > 0 else 0
    return v


cdef class PagedCore:
    """Everything a paged pool touches per operation, in flat C arrays: the free list, the
    block map stamps (through its BlockMap), the per-allocation records and the event ring.

    Blocks form singly linked chains through `next_arr`: each live allocation's blocks in data
    order (record: head, tail, count, requested bytes), and the freed blocks as one more chain
    from `free_head`; blocks never handed out are `fresh` .. num_blocks-1 (a bump pointer, so
    creating a pool writes no link). Taking n blocks walks the free chain, then bumps `fresh`;
    freeing splices the allocation's chain back in front, so the next request gets the same
    blocks in the same order, exactly what a LIFO stack of block ids gives, and a new pool
    fills from block 0.

    NOTE: a chain, not a fixed-capacity stack plus a per-allocation id list: the one int32 link
    per block serves both the free set and the allocations' block lists, so a 1M-block pool
    full of 16-block allocations costs about 11 bytes per block instead of 16+.

    Records live in parallel arrays indexed by a slot; an open-addressing table (linear probing,
    backward-shift deletion, Fibonacci hashing) maps allocation id -> slot. No Python object per
    block or per allocation.

    Invariants (`check()` verifies them): the free chain and the allocations' chains partition
    the blocks; each chain has its record's count and ends at its tail; owner[b] is the id of
    the allocation whose chain holds b (-1 on the free chain); the table finds every live
    record; the unused record slots form one chain through `r_tail`; requested_total is the sum
    of requested bytes.

    NOTE: the hot paths (allocate, free, the cache's put) trust those invariants and check no
    index. Every reader that walks a structure for Python (`block_ids`, `free_blocks`,
    `check`, the id lookups of `slot_of`) walks at most the steps the structure claims, never
    more than the pool or table holds, and checks each index before following it: a broken
    structure is a problem string from check() or a CorruptState, never a read out of bounds.
    """

    def __cinit__(self, BlockMap bm, EventRing events, int64_t block_bytes, oom, bad_size,
                  not_found):
        self.bm = bm
        self.ev = events
        self.num_blocks = bm.num_blocks
        self.block_bytes = block_bytes
        self.own, self.st, self.cv = bm.own, bm.st, bm.cv
        self.code_alloc = events.code("allocate")
        self.code_free = events.code("free")
        self._oom, self._bad_size, self._not_found = oom, bad_size, not_found
        self.next_arr = np.empty(self.num_blocks, dtype=np.int32)
        self.nxt = i32_ptr(self.next_arr)
        self.rcap = 0
        self._rec = None
        self.reset()

    def reset(self) -> None:
        """Every block free and fresh (handed out 0, 1, 2, ...), no records; counters other
        than ids kept."""
        self.free_head = NIL
        self.fresh = 0
        self.free_count = self.num_blocks
        self.live = 0
        self.requested_total = 0
        self._rec = None
        self.rcap = 0
        self.slot_free = NIL
        self.tags = None
        self.last_slot = 0
        self.grow_records()
        self.rehash(64)

    # -- records -------------------------------------------------------------------------
    cdef int grow_records(self) except -1:
        cdef Py_ssize_t old = self.rcap, cap = max(64, 2 * old), i
        names = ("aid", "req", "head", "tail", "n")
        dtypes = (np.int64, np.int64, np.int32, np.int32, np.int32)
        arrays = []
        for k in range(5):
            a = np.zeros(cap, dtype=dtypes[k])
            if old:
                a[:old] = self._rec[k]
            arrays.append(a)
        self._rec = tuple(arrays)
        cdef int64_t[::1] aid = arrays[0]
        cdef int64_t[::1] req = arrays[1]
        self.r_aid, self.r_req = &aid[0], &req[0]
        self.r_head, self.r_tail, self.r_n = i32_ptr(arrays[2]), i32_ptr(arrays[3]), i32_ptr(arrays[4])
        # Called only with no unused slot left: the new ones become the unused chain
        # (r_aid 0 marks an unused slot; ids start at 1).
        for i in range(old, cap - 1):
            self.r_tail[i] = <int32_t>(i + 1)
        self.r_tail[cap - 1] = NIL
        self.slot_free = <int32_t>old
        self.rcap = cap
        if self.tags is not None:
            self.tags.extend([None] * (cap - old))
        return 0

    cdef int rehash(self, Py_ssize_t cap) except -1:
        cdef Py_ssize_t s, i
        cdef int bits = 0
        while (<Py_ssize_t>1 << bits) < cap:
            bits += 1
        self._htab = np.full(<Py_ssize_t>1 << bits, -1, dtype=np.int32)
        self.htab = i32_ptr(self._htab)
        self.hmask = (<int64_t>1 << bits) - 1
        self.hshift = 64 - bits
        for s in range(self.rcap):
            if self.r_aid[s]:
                i = <Py_ssize_t>((<uint64_t>self.r_aid[s] * <uint64_t>11400714819323198485ULL) >> self.hshift)
                while self.htab[i] != -1:
                    i = (i + 1) & self.hmask
                self.htab[i] = <int32_t>s
        return 0

    cdef inline Py_ssize_t home(self, int64_t aid) noexcept:
        return <Py_ssize_t>((<uint64_t>aid * <uint64_t>11400714819323198485ULL) >> self.hshift)

    cdef Py_ssize_t find(self, int64_t aid) noexcept:
        """The table position holding `aid`, or -1."""
        cdef Py_ssize_t i = self.home(aid)
        cdef int32_t s
        while True:
            s = self.htab[i]
            if s == -1:
                return -1
            if self.r_aid[s] == aid:
                return i
            i = (i + 1) & self.hmask

    cdef Py_ssize_t find_safe(self, int64_t aid) noexcept:
        """find() for the readers and check(): at most one pass over the table, and a slot
        outside the records stops it (-2: the table is corrupt) instead of being followed."""
        cdef Py_ssize_t i = self.home(aid), k
        cdef int32_t s
        for k in range(self.hmask + 1):
            s = self.htab[i]
            if s == -1:
                return -1
            if s < 0 or s >= self.rcap:
                return -2
            if self.r_aid[s] == aid:
                return i
            i = (i + 1) & self.hmask
        return -2

    cdef Py_ssize_t slot_of(self, object aid) except -1:
        """The record slot of allocation `aid`; NotFound for anything else (1.0 and True hash
        like 1: they must not find id 1); CorruptState when the id table is broken."""
        cdef int64_t a = exact_int(aid)
        cdef Py_ssize_t pos = self.find_safe(a) if 0 < a <= self.last_id else -1
        if pos == -2:
            raise _CorruptState(f"the id table is corrupt (looking up allocation {a}): check() names it")
        if pos < 0:
            raise self._not_found("allocation", aid)
        return self.htab[pos]

    cdef Py_ssize_t new_record(self, int64_t aid) except -1:
        cdef Py_ssize_t s, i
        if self.slot_free == NIL:
            self.grow_records()
        if 2 * (self.live + 1) > self.hmask + 1:  # load above 1/2: double
            self.rehash(2 * (self.hmask + 1))
        s = self.slot_free
        self.slot_free = self.r_tail[s]
        self.r_aid[s] = aid
        i = self.home(aid)
        while self.htab[i] != -1:
            i = (i + 1) & self.hmask
        self.htab[i] = <int32_t>s
        self.live += 1
        self.last_slot = s
        return s

    cdef void drop_record(self, Py_ssize_t pos) noexcept:
        """Remove the table entry at `pos` and free its slot (backward-shift deletion)."""
        cdef Py_ssize_t s = self.htab[pos], i = pos, j = pos, k
        self.r_aid[s] = 0
        if self.tags is not None:
            list_put(self.tags, s, None)
        self.r_tail[s] = self.slot_free
        self.slot_free = <int32_t>s
        self.live -= 1
        self.htab[i] = -1
        while True:
            j = (j + 1) & self.hmask
            if self.htab[j] == -1:
                return
            k = self.home(self.r_aid[self.htab[j]])
            # Move j back to the hole at i unless its home lies cyclically in (i, j].
            if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                self.htab[i] = self.htab[j]
                self.htab[j] = -1
                i = j

    # -- tags: one object per live allocation, for its owner (the cache's key) -------------
    cdef int set_tag(self, int64_t aid, object tag) except -1:
        """Attach `tag` to live allocation `aid` (dropped with its record). The list is made
        on first use: a pool nobody tags pays nothing."""
        cdef Py_ssize_t s = self.last_slot
        if self.r_aid[s] != aid:
            s = self.htab[self.find(aid)]
        if self.tags is None:
            self.tags = [None] * self.rcap
        list_put(self.tags, s, tag)
        return 0

    def tag_of(self, aid):
        """The tag of allocation `aid`, or None (untagged, or no such allocation)."""
        cdef int64_t a = exact_int(aid)
        cdef Py_ssize_t pos = self.find_safe(a) if 0 < a <= self.last_id and self.tags is not None else -1
        return None if pos < 0 else self.tags[self.htab[pos]]

    def tagged_ids(self):
        """The ids of the tagged live allocations, as an int64 numpy array (slot order)."""
        cdef Py_ssize_t s, n = 0
        out = np.empty(self.live, dtype=np.int64)
        cdef int64_t[::1] o = out
        if self.tags is None:
            return out[:0]
        cdef list tags = self.tags
        for s in range(min(self.rcap, len(tags))):
            if self.r_aid[s] and tags[s] is not None and n < o.shape[0]:
                o[n] = self.r_aid[s]
                n += 1
        return out[:n]

    def tagged(self) -> dict:
        """{allocation id: tag} of every tagged live allocation."""
        if self.tags is None:
            return {}
        return {self.r_aid[s]: t for s, t in enumerate(self.tags) if t is not None and self.r_aid[s]}

    # -- blocks --------------------------------------------------------------------------
    cdef int32_t take(self, Py_ssize_t n, int64_t aid, uint8_t state, int32_t *ids,
                      int32_t *last) noexcept:
        """Take n (<= free_count, > 0) blocks, the free chain's first, then fresh ones, link
        them as one chain and stamp them; returns the first, sets *last (its link is NIL);
        writes the ids to `ids` unless NULL."""
        cdef int32_t b, first = NIL, prev = NIL, head = self.free_head
        cdef uint32_t v = self.bm.version
        cdef Py_ssize_t i
        cdef int32_t *own = self.own
        cdef uint8_t *st = self.st
        cdef uint32_t *cv = self.cv
        cdef int32_t *nxt = self.nxt
        for i in range(n):
            if head != NIL:
                b = head
                head = nxt[b]
            else:
                b = self.fresh
                self.fresh += 1
            if prev == NIL:
                first = b
            else:
                nxt[prev] = b
            own[b] = <int32_t>aid
            st[b] = state
            cv[b >> CHUNK_SHIFT_C] = v
            if ids != NULL:
                ids[i] = b
            prev = b
        self.free_head = head
        nxt[prev] = NIL
        self.free_count -= n
        last[0] = prev
        return first

    cdef void give_back(self, int32_t head, int32_t tail, Py_ssize_t n, int32_t *ids) noexcept:
        """Unstamp the n-block chain head..tail and splice it in front of the free chain (a
        walk of exactly n steps: `ids` has room for n)."""
        cdef int32_t b = head
        cdef uint32_t v = self.bm.version
        cdef Py_ssize_t i
        cdef int32_t *own = self.own
        cdef uint8_t *st = self.st
        cdef uint32_t *cv = self.cv
        cdef int32_t *nxt = self.nxt
        for i in range(n):
            own[b] = -1
            st[b] = 0
            cv[b >> CHUNK_SHIFT_C] = v
            if ids != NULL:
                ids[i] = b
            if i + 1 < n:
                b = nxt[b]
        self.free_count += n
        nxt[tail] = self.free_head
        self.free_head = head

    cdef int64_t alloc_one(self, int64_t nbytes, Py_ssize_t n, uint8_t state, double now) except -1:
        cdef int64_t aid = self.last_id + 1
        cdef Py_ssize_t s = self.new_record(aid)
        cdef int32_t last
        cdef int32_t *ids = self.ev.record_num(self.code_alloc, aid, nbytes, n * self.block_bytes,
                                               n, n, now)
        self.ev.set_aux(state)
        self.last_id = aid
        self.r_head[s] = self.take(n, aid, state, ids, &last)
        self.r_tail[s] = last
        self.r_n[s] = <int32_t>n
        self.r_req[s] = nbytes
        self.requested_total += nbytes
        self.ev.maybe_spill()
        return aid

    cdef int free_slot(self, Py_ssize_t pos, double now) except -1:
        cdef Py_ssize_t s = self.htab[pos]
        cdef int64_t aid = self.r_aid[s]
        cdef int32_t n = self.r_n[s]
        cdef int32_t *ids = self.ev.record_num(self.code_free, aid, n, self.r_req[s], 0, n, now)
        self.give_back(self.r_head[s], self.r_tail[s], n, ids)
        self.requested_total -= self.r_req[s]
        self.frees += 1
        self.drop_record(pos)
        self.ev.maybe_spill()
        return 0

    # -- operations (the pool binds these as its methods) --------------------------------
    def allocate(self, nbytes, state=1):
        """Allocate `nbytes` as ceil(nbytes / block_bytes) blocks; returns the allocation id.

        Raises InvalidRequest (size not a positive int, state not USED / CACHED / PINNED) or
        OutOfMemory (cause "capacity")."""
        cdef int64_t nb = exact_int(nbytes)
        cdef int64_t free_bytes = self.free_count * self.block_bytes
        if nb <= 0:
            self._bad_size(nbytes)
        if not (state is 1 or state is 2 or state is 3):  # the cached small ints: no compare
            _block_state(state)
        if nb > free_bytes:
            raise self._oom(nbytes, free_bytes, free_bytes, "capacity")
        return self.alloc_one(nb, (nb + self.block_bytes - 1) // self.block_bytes, <uint8_t>state,
                              wall_time())

    def free(self, aid) -> None:
        """Return every block of `aid` to the pool. Raises NotFound (also on double free)."""
        cdef int64_t a = exact_int(aid)
        cdef Py_ssize_t pos = self.find(a) if 0 < a <= self.last_id else -1
        if pos < 0:
            raise self._not_found("allocation", aid)
        self.free_slot(pos, wall_time())

    def allocate_many(self, sizes, state=1) -> list:
        """Allocate each of `sizes` (bytes), all or nothing; returns the ids in order.
        Raises InvalidRequest or OutOfMemory (then nothing was allocated)."""
        cdef int64_t nb, total = 0, cap = self.num_blocks * self.block_bytes
        cdef list out = []
        _block_state(state)
        for nbytes in sizes:
            nb = exact_int(nbytes)
            if nb <= 0:
                self._bad_size(nbytes)
            total += (min(nb, cap + 1) + self.block_bytes - 1) // self.block_bytes
            total = min(total, self.num_blocks + 1)
        if total > self.free_count:
            free_bytes = self.free_count * self.block_bytes
            raise self._oom(sum(sizes), free_bytes, free_bytes, "capacity", False)  # a batch: an OOM
        cdef double now = wall_time()
        for nbytes in sizes:
            nb = nbytes
            out.append(self.alloc_one(nb, (nb + self.block_bytes - 1) // self.block_bytes,
                                      <uint8_t>state, now))
        return out

    def free_many(self, ids) -> None:
        """Free every id in `ids`, all or nothing. Raises NotFound (unknown or repeated id)."""
        cdef list positions = []
        cdef Py_ssize_t pos
        if len(set(ids)) != len(ids):
            self._not_found_in(ids)
        for aid in ids:
            self.slot_of(aid)
        cdef double now = wall_time()
        for aid in ids:  # table positions move as entries go: find each again
            self.free_slot(self.find(<int64_t>aid), now)

    def _not_found_in(self, ids):
        seen = set()
        for aid in ids:
            if aid in seen:
                raise self._not_found("allocation", aid)  # the second free of a double free
            self.slot_of(aid)
            seen.add(aid)

    def extend(self, aid, int64_t nbytes) -> list:
        """Grow `aid` by `nbytes` (> 0) requested bytes, taking the blocks that needs (same
        state as its first block); returns the new block ids. NotFound / OutOfMemory (then
        unchanged); ValueError for nbytes <= 0 (Pool.extend says so in its own words first)."""
        cdef Py_ssize_t s = self.slot_of(aid)
        if nbytes <= 0:
            raise ValueError(f"extend by {nbytes} bytes: must be positive")
        cdef int64_t need = (self.r_req[s] + nbytes + self.block_bytes - 1) // self.block_bytes - self.r_n[s]
        cdef int32_t last, first
        cdef int64_t free_bytes = self.free_count * self.block_bytes
        if need > self.free_count:
            raise self._oom(need * self.block_bytes, free_bytes, free_bytes, "capacity")
        ids = np.empty(max(need, 0), dtype=np.int32)
        if need > 0:
            first = self.take(need, self.r_aid[s], self.st[self.r_head[s]], i32_ptr(ids), &last)
            self.nxt[self.r_tail[s]] = first
            self.r_tail[s] = last
            self.r_n[s] += <int32_t>need
        self.r_req[s] += nbytes
        self.requested_total += nbytes
        return ids.tolist()

    def truncate(self, aid, int64_t nbytes) -> list:
        """Shrink `aid` to `nbytes` (0 < nbytes <= its size), freeing the blocks past the new
        end; returns their ids. NotFound for an unknown id, ValueError for a size outside
        1..its size (Pool.truncate says so in its own words first)."""
        cdef Py_ssize_t s = self.slot_of(aid), i
        if nbytes <= 0 or nbytes > self.r_req[s]:
            raise ValueError(f"truncate allocation {aid} of {self.r_req[s]} bytes to {nbytes}: "
                             f"must be 1..{self.r_req[s]}")
        cdef int64_t keep = (nbytes + self.block_bytes - 1) // self.block_bytes
        cdef int32_t b = self.r_head[s], cut
        ids = np.empty(self.r_n[s] - keep, dtype=np.int32)
        if keep < self.r_n[s]:
            for i in range(keep - 1):
                b = self.nxt[b]
            cut = self.nxt[b]
            self.nxt[b] = NIL
            self.give_back(cut, self.r_tail[s], self.r_n[s] - keep, i32_ptr(ids))
            self.r_tail[s] = b
            self.r_n[s] = <int32_t>keep
        self.requested_total += nbytes - self.r_req[s]
        self.r_req[s] = nbytes
        return ids.tolist()

    def set_state(self, aid, uint8_t state) -> None:
        """Mark every block of `aid` with `state` (stamping the map). NotFound."""
        cdef Py_ssize_t s = self.slot_of(aid), i
        cdef int32_t b = self.r_head[s]
        cdef uint32_t v = self.bm.version
        if self.chain_problem(s, None) is not None:
            raise _CorruptState(self.chain_problem(s, None))
        for i in range(self.r_n[s]):
            self.st[b] = state
            self.cv[b >> CHUNK_SHIFT_C] = v
            b = self.nxt[b]

    # -- reading -------------------------------------------------------------------------
    def __contains__(self, aid) -> bool:
        cdef int64_t a = exact_int(aid)
        return 0 < a <= self.last_id and self.find_safe(a) >= 0

    def requested(self, aid) -> int:
        """Requested bytes of `aid`. NotFound."""
        return self.r_req[self.slot_of(aid)]

    def count(self, aid) -> int:
        """Blocks held by `aid`. NotFound."""
        return self.r_n[self.slot_of(aid)]

    def first_block(self, aid) -> int:
        return self.r_head[self.slot_of(aid)]

    def block_ids(self, aid) -> list:
        """Blocks of `aid` in data order. NotFound; CorruptState when its chain is broken (the
        walk stops at the first bad link instead of following it)."""
        cdef Py_ssize_t s = self.slot_of(aid)
        cdef list out = []
        problem = self.chain_problem(s, out)
        if problem is not None:
            raise _CorruptState(problem)
        return out

    def block_runs(self, aid) -> list:
        """[start, count] runs of consecutive ascending blocks of `aid`, in data order (what
        REST and batch results show; a fresh allocation is usually one run). NotFound."""
        cdef Py_ssize_t s = self.slot_of(aid), i
        cdef int32_t b = self.r_head[s], start = b, count = 0
        cdef list out = []
        for i in range(self.r_n[s]):
            if count and b != start + count:
                out.append([start, count])
                start, count = b, 0
            count += 1
            b = self.nxt[b]
        if count:
            out.append([start, count])
        return out

    cdef object chain_problem(self, Py_ssize_t s, list out):
        """What is wrong with the chain of record slot `s` (None: sound). Walks at most the
        count its record claims, never past the pool, checking each block before reading its
        link; the blocks walked go to `out` unless it is None."""
        cdef int64_t aid = self.r_aid[s]
        cdef int32_t n = self.r_n[s], b = self.r_head[s], prev = NIL
        cdef Py_ssize_t i
        if n <= 0 or n > self.num_blocks:
            return f"allocation {aid}: its record claims {n} blocks, the pool has {self.num_blocks}"
        for i in range(n):
            if b < 0 or b >= self.num_blocks:
                where = "starts at" if i == 0 else f"runs from block {prev} to"
                return f"allocation {aid}: its chain {where} block {b}, outside 0..{self.num_blocks - 1}"
            if b >= self.fresh or self.own[b] == -1:
                return f"allocation {aid}: its chain runs into block {b}, which is free"
            if out is not None:
                out.append(b)
            prev = b
            b = self.nxt[b]
        if prev != self.r_tail[s]:
            return f"allocation {aid}: its chain of {n} blocks ends at block {prev}, not at its tail {self.r_tail[s]}"
        if b != NIL:
            return f"allocation {aid}: its tail block {prev} links on to {b}"
        return None

    def ids(self) -> list:
        """Live allocation ids, oldest first."""
        aids = self._rec[0]
        return np.sort(aids[aids > 0]).tolist()

    def records(self) -> tuple:
        """(aid, requested, head, tail, count) numpy arrays of the live records, by id."""
        aids = self._rec[0]
        live = np.flatnonzero(aids > 0)
        live = live[np.argsort(aids[live])]
        return tuple(a[live] for a in self._rec)

    def free_blocks(self) -> object:
        """The free blocks in the order they would be handed out (numpy int32): the free
        chain, then the fresh ones; None when the free structure is broken (check() says how)."""
        if not (0 <= self.free_count <= self.num_blocks):
            return None
        out = np.empty(self.free_count, dtype=np.int32)
        if self.free_chain_problem(out) is not None:
            return None
        return out

    cdef object free_chain_problem(self, int32_t[::1] out):
        """What is wrong with the free blocks (None: sound): the chain from free_head holds
        exactly free_count - (num_blocks - fresh) blocks, each handed out before (below
        `fresh`). Walks at most that many links, checking each before following it; writes
        the chain, then the fresh blocks, to `out` (free_count long) unless it is None."""
        cdef Py_ssize_t n = self.num_blocks, i = 0, chained
        cdef int32_t b = self.free_head
        if not 0 <= self.fresh <= n:
            return f"the fresh-block mark is {self.fresh}, outside 0..{n}"
        if not 0 <= self.free_count <= n:
            return f"the free count is {self.free_count}, outside 0..{n}"
        chained = self.free_count - (n - self.fresh)
        if chained < 0:
            return f"the free count is {self.free_count}, but {n - self.fresh} blocks were never handed out"
        while b != NIL:
            if i >= chained:
                return f"the free chain runs past its {chained} freed blocks (to block {b})"
            if b < 0 or b >= self.fresh:
                return f"the free chain runs into block {b}, which was never handed out"
            if out is not None:
                out[i] = b
            i += 1
            b = self.nxt[b]
        if i != chained:
            return f"the free chain from block {self.free_head} holds {i} blocks, not the {chained} freed"
        if out is not None:
            for b in range(self.fresh, n):
                out[i] = b
                i += 1
        return None

    def check(self) -> list:
        """Problems with the records, chains and table (empty = ok); names the first culprit.
        Every walk is bounded and every index checked before it is followed (see the NOTE)."""
        problems = []
        cdef Py_ssize_t s, i, seen = 0, entries = 0, unused = 0, pos
        cdef int64_t aid
        cdef int32_t t
        if self.rcap != self._rec[0].shape[0]:
            return [f"the records claim {self.rcap} slots, their arrays hold {self._rec[0].shape[0]}"]
        total = 0
        for s in range(self.rcap):
            aid = self.r_aid[s]
            if not aid:
                continue
            seen += 1
            total += self.r_req[s]
            pos = self.find_safe(aid)
            if pos < 0 or self.htab[pos] != s:
                problems.append(f"allocation {aid}: the id table does not find its record")
            problem = self.chain_problem(s, None)
            if problem is not None:
                problems.append(problem)
        bad = None
        for i in range(self.hmask + 1):
            t = self.htab[i]
            if t == -1:
                continue
            entries += 1
            if bad is None and (t < 0 or t >= self.rcap):
                bad = f"id table position {i} holds slot {t}, outside 0..{self.rcap - 1}"
            elif bad is None and not self.r_aid[t]:
                bad = f"id table position {i} names the unused record slot {t}"
        if bad is not None:
            problems.append(bad)
        if entries != self.live:
            problems.append(f"the id table holds {entries} entries for {self.live} live allocations")
        if seen != self.live:
            problems.append(f"{seen} live records, the count says {self.live}")
        t = self.slot_free
        while t != NIL:
            if t < 0 or t >= self.rcap:
                problems.append(f"the unused-slot chain runs to slot {t}, outside 0..{self.rcap - 1}")
                break
            if self.r_aid[t]:
                problems.append(f"the unused-slot chain runs into slot {t} of live allocation {self.r_aid[t]}")
                break
            unused += 1
            if unused > self.rcap - seen:
                problems.append(f"the unused-slot chain holds more than the {self.rcap - seen} unused slots")
                break
            t = self.r_tail[t]
        else:
            if unused != self.rcap - seen:
                problems.append(f"the unused-slot chain holds {unused} slots, {self.rcap - seen} are unused")
        if total != self.requested_total:
            problems.append(f"requested_total is {self.requested_total}, records add up to {total}")
        problem = self.free_chain_problem(None)
        if problem is not None:
            problems.append(problem)
        return problems

    def _raw(self) -> dict:
        """The compiled arrays as writable numpy views, by name: `next` (the chain links),
        `htab` (the id table) and the record columns `aid`, `req`, `head`, `tail`, `n`. For
        corruption tests and debugging: a write bypasses every invariant, and check() must
        then name the damage."""
        return {"next": self.next_arr, "htab": self._htab, "aid": self._rec[0], "req": self._rec[1],
                "head": self._rec[2], "tail": self._rec[3], "n": self._rec[4]}

    def _poke(self, str field, int64_t value) -> int:
        """Overwrite one scalar field (free_head, fresh, free_count, live, slot_free, rcap) and
        return what it held; corruption tests only, like `_raw`."""
        cdef int64_t old
        if field == "free_head":
            old, self.free_head = self.free_head, <int32_t>value
        elif field == "fresh":
            old, self.fresh = self.fresh, <int32_t>value
        elif field == "free_count":
            old, self.free_count = self.free_count, value
        elif field == "live":
            old, self.live = self.live, value
        elif field == "slot_free":
            old, self.slot_free = self.slot_free, <int32_t>value
        elif field == "rcap":
            old, self.rcap = self.rcap, value
        else:
            raise KeyError(field)
        return old

    def compact_chains(self, src, dst) -> None:
        """Rewrite chains, records and the free chain after blocks src[i] -> dst[i] moved (the
        caller moved the map cells); the free blocks become the ascending tail of the pool."""
        remap = np.arange(self.num_blocks, dtype=np.int32)
        remap[src] = dst
        nx = self.next_arr
        owned = np.frombuffer(self.bm.owner, dtype=np.int32) != -1  # after the move
        moved_links = nx[src].copy()
        nx[dst] = moved_links
        links = nx[owned]
        ok = links >= 0
        links[ok] = remap[links[ok]]
        nx[owned] = links
        live = self._rec[0] > 0
        for k in (2, 3):
            col = self._rec[k]
            col[live] = remap[col[live]]
        self.free_head = NIL  # every free block is now above the used line, in order: fresh
        self.fresh = self.num_blocks - self.free_count
