# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""PrefixCore: the compiled bookkeeping of a prefix-caching paged pool (vLLM's BlockPool semantics).

Per block, in fixed numpy arrays (no Python object per block): a reference count, a 64-bit
chained hash and whether it is indexed, its depth in its prefix chain, intrusive prev/next links
for the evictable lists, heap slots and keys for the ordered policies, and timestamps for the
lifetime / idle / reuse-gap histograms. A Python dict maps hash -> block (one entry per cached
hash; hashes are Python ints in [0, 2**64)).

Invariants (checked by `PrefixPool.check` from the outside):
- a block is in exactly one of: the free stack (refcount 0, unhashed), the evictable structure
  (refcount 0, hashed: "cached"), or held (refcount >= 1 = the holders: sequences holding it,
  or 1 for a plain allocation);
- `index[h] == b` iff block b is hashed with h;
- the evictable structure holds exactly the idle hashed blocks, `n_evictable` of them.

Policies order the evictable (idle, hashed) blocks, in one `BlockOrder` (allocator/_eviction.pxi,
where the keyed cache's policies take their algorithms from too):
- lru: one intrusive doubly-linked list (O(1) append, O(1) removal from the middle on a hit),
  blocks appended when they become idle, so a sequence closed tail-first loses its tail first;
- fifo / lfu / belady: an indexed binary heap (O(log n) insert, removal from the middle and
  victim) keyed by (store tick) / (hits, idle tick) / (-next_use, idle tick);
- s3fifo: two intrusive lists (small, main) over the same links plus a bounded ghost of hashes.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

from allocator._core cimport (
    DETACHED,
    NIL,
    BlockMap,
    DList,
    EventRing,
    Ghost,
    Stack,
    stack_pop,
    stack_push,
    wall_time,
)
from allocator._core cimport (  # the eviction algorithms (_eviction.pxi)
    P_BELADY,
    P_FIFO,
    P_LFU,
    P_LRU,
    P_S3FIFO,
    Q_MAIN,
    Q_SMALL,
    BlockOrder,
    heap_less,
    order_evicted,
    order_insert,
    order_is_list,
    order_remove,
    order_stored,
    order_victim,
    s3_drain,
    s3_hit,
)
from cpython cimport array as carray
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_DelItem, PyDict_GetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.math cimport INFINITY
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import numpy as np
from array import array

from .errors import CorruptState

cdef enum:
    FREE = 0
    USED = 1
    CACHED = 2
    PINNED = 3
    SHARED = 4
    CHUNK_SHIFT = 6
    # where a block lives
    W_FREE = 0
    W_HELD = 1
    W_EVICT = 2
    NBUCKETS = 20
    # an operation on up to this many blocks keeps its per-block scratch (the ids and hashes
    # its events name) on the C stack; a bigger one allocates it once for the operation
    SMALL_OP = 64

POLICY_CODES = {"lru": P_LRU, "fifo": P_FIFO, "lfu": P_LFU, "s3fifo": P_S3FIFO, "belady": P_BELADY}
HIST_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
               20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, float("inf"))
HIST_NAMES = ("lifetime", "idle_before_evict", "reuse_gap")
cdef double[20] _BOUNDS
for _i in range(NBUCKETS):
    _BOUNDS[_i] = HIST_BOUNDS[_i]

cdef uint64_t ROOT_SEED = 0x6B7673636F706531ULL  # "kvscope1"
cdef uint64_t M1 = 0xBF58476D1CE4E5B9ULL
cdef uint64_t M2 = 0x94D049BB133111EBULL
cdef uint64_t GOLD = 0x9E3779B97F4A7C15ULL
cdef carray.array I32 = array("i")  # the template of a sequence's block array (int32 items)
assert I32.itemsize == sizeof(int32_t)


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
    ctypedef struct PyObject
    # returns a borrowed reference: compared by address only
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL


cdef inline list _frozen(list ints):
    """`ints` (a list of ints, going into the event ring) taken off the cyclic GC's books: it
    holds no container, so it can never be part of a cycle. 10,000 tracked lists in the ring
    would otherwise reach the oldest generation and trigger full collections of the process.
    NOTE: readers get these lists from `EventLog.after()`; they must not put containers in them."""
    PyObject_GC_UnTrack(<void *>ints)
    return ints


cdef inline object _ids(int32_t *ids, Py_ssize_t n):
    """n block ids as native int32 bytes (the form history events store), None when n == 0."""
    if n == 0:
        return None
    return PyBytes_FromStringAndSize(<char *>ids, n * sizeof(int32_t))


cdef inline bytes _id_run(int32_t *ids, Py_ssize_t n):
    """n block ids as native int32 bytes (b"" when n == 0): a prefix event's `blocks`."""
    return PyBytes_FromStringAndSize(<char *>ids, n * sizeof(int32_t))


cdef inline bytes _hash_run(uint64_t *hashes, Py_ssize_t n):
    """n block hashes as native uint64 bytes: a prefix event's `block_hashes`."""
    return PyBytes_FromStringAndSize(<char *>hashes, n * sizeof(uint64_t))


cdef inline uint64_t mix64(uint64_t z) nogil:
    z = (z ^ (z >> 30)) * M1
    z = (z ^ (z >> 27)) * M2
    return z ^ (z >> 31)


cdef inline double mono() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


def root_hash(salt=None):
    """The chain's seed: a constant, or derived from `salt` (str or bytes) so salted prompts never
    share blocks with unsalted ones."""
    if salt is None:
        return ROOT_SEED
    data = salt.encode() if isinstance(salt, str) else bytes(salt)
    cdef uint64_t h = 0xCBF29CE484222325ULL  # FNV-1a 64 over the salt, then mixed
    cdef unsigned char c
    for c in data:
        h = (h ^ c) * 0x100000001B3ULL
    return mix64(h ^ ROOT_SEED)


cdef inline uint64_t chain_hash(uint64_t parent, int64_t[:] toks, Py_ssize_t start, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = mix64(parent ^ GOLD)
    cdef Py_ssize_t i
    for i in range(start, start + n):
        h = mix64(h ^ (<uint64_t>toks[i] + GOLD))
    return mix64(h + <uint64_t>n)


def _next_use(values, Py_ssize_t nblocks):
    if type(values) is not list and type(values) is not tuple:
        raise ValueError("'next_use' must be a list of numbers")
    if len(values) != nblocks:
        raise ValueError(f"'next_use' needs one number per block ({nblocks}), got {len(values)}")
    out = []
    for i, v in enumerate(values):
        if type(v) is not int and type(v) is not float or v != v:
            raise ValueError(f"next_use[{i}] must be a number (inf = never), got {v!r}")
        out.append(float(v))
    return out


def block_hash(parent, tokens):
    """Hash of one full block: chains `parent` (a block hash, or `root_hash(salt)` for the first
    block) with its token ids. Deterministic across processes, 64-bit."""
    arr = np.asarray(tokens, dtype=np.int64)
    return chain_hash(<uint64_t>parent, arr, 0, arr.shape[0])


@cython.no_gc
cdef class Seq:
    """One open sequence: its blocks in data order and how to hash its next full block.

    `mode` 0: no hashing (nothing it fills is cached), 1: token ids (pending = the partial last
    block's tokens), 2: caller-supplied hashes. `nhashed` leading blocks have a chain hash;
    `last_hash` is the hash of block nhashed-1 (or the root seed when nhashed == 0).
    """
    cdef public int64_t id, num_tokens, cached_tokens, nhashed
    cdef public int mode
    cdef public uint64_t last_hash
    cdef public object blocks  # array('i')
    cdef public list pending
    cdef public double opened_at


cdef class PrefixCore:
    cdef readonly int num_blocks, block_size, policy
    cdef public object refcnt_np, hash_np, hashed_np, depth_np
    cdef int32_t[:] refcnt
    cdef uint64_t[:] bhash
    cdef uint8_t[:] hashed
    cdef int32_t[:] depth
    cdef uint8_t[:] where
    cdef int32_t[:] prev
    cdef int32_t[:] nxt
    cdef int32_t[:] heap
    cdef int32_t[:] hpos
    cdef double[:] key1
    cdef int64_t[:] key2
    cdef int32_t[:] hits
    cdef uint8_t[:] queue
    cdef uint8_t[:] freq
    cdef double[:] next_use
    cdef int64_t[:] stored_tick
    cdef double[:] born
    cdef double[:] last_access
    cdef double[:] released
    cdef int32_t[:] free_stack
    cdef int32_t[:] mark
    cdef Stack fs  # the free stack (allocator/_core.pxd), over `free_stack`
    cdef public int n_evictable
    # the evictable blocks in policy order (allocator/_eviction.pxi): lists over prev/nxt, or the
    # heap over heap/hpos/key1/key2
    cdef BlockOrder ord
    cdef int32_t op
    cdef int64_t tick
    cdef public dict index
    # hkey[b]: the very int object that keys block b in `index` (the caller's, or made once), so
    # eviction deletes it from `index` without building a new int from bhash[b]
    cdef list hkey
    cdef public Ghost ghost  # s3fifo's: hashes evicted from small
    # block map views
    cdef BlockMap bm
    cdef int32_t[:] owner
    cdef uint8_t[:] state
    cdef uint32_t[:] cv
    # the pool's event ring, recorded into directly, and the codes of the kinds recorded here
    cdef EventRing ring
    cdef uint8_t k_open, k_append, k_close, k_stored, k_removed, k_cleared
    cdef int64_t[:, :] hist
    cdef double[3] hist_sum
    cdef public int64_t queries, hit_tokens, query_blocks, hit_blocks, stored, evicted
    cdef public int64_t slack_tokens, opens, appends, closes
    cdef readonly int64_t block_bytes

    def __init__(self, int num_blocks, int block_size, str policy, blockmap, events,
                 int64_t block_bytes=0):
        if policy not in POLICY_CODES:
            raise ValueError(policy)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.policy = POLICY_CODES[policy]
        n = num_blocks
        self.refcnt_np = np.zeros(n, np.int32)
        self.hash_np = np.zeros(n, np.uint64)
        self.hashed_np = np.zeros(n, np.uint8)
        self.depth_np = np.zeros(n, np.int32)
        self.refcnt, self.bhash, self.hashed, self.depth = self.refcnt_np, self.hash_np, self.hashed_np, self.depth_np
        self.where = np.zeros(n, np.uint8)
        self.prev = np.full(n, DETACHED, np.int32)
        self.nxt = np.full(n, DETACHED, np.int32)
        self.heap = np.zeros(n, np.int32)
        self.hpos = np.full(n, NIL, np.int32)
        self.key1 = np.zeros(n, np.float64)
        self.key2 = np.zeros(n, np.int64)
        self.hits = np.zeros(n, np.int32)
        self.queue = np.zeros(n, np.uint8)
        self.freq = np.zeros(n, np.uint8)
        self.next_use = np.full(n, INFINITY, np.float64)
        self.stored_tick = np.zeros(n, np.int64)
        self.born = np.zeros(n, np.float64)
        self.last_access = np.zeros(n, np.float64)
        self.released = np.zeros(n, np.float64)
        self.free_stack = np.arange(n - 1, -1, -1, dtype=np.int32)
        self.hkey = [None] * n
        self.mark = np.zeros(n, np.int32)
        self.fs.items = &self.free_stack[0]
        self.fs.capacity = n
        self.fs.top = n
        self.hist = np.zeros((3, NBUCKETS), np.int64)
        self.bm = blockmap
        self.owner = blockmap.owner
        self.state = blockmap.state
        self.cv = blockmap.chunk_version
        self.ring = events
        self.k_open, self.k_append = events.code("open"), events.code("append")
        self.k_close, self.k_cleared = events.code("close"), events.code("cleared")
        self.k_stored, self.k_removed = events.code("stored"), events.code("removed")
        self.ord.policy = self.policy
        self.ord.heap.items = &self.heap[0]
        self.ord.heap.pos = &self.hpos[0]
        self.ord.heap.key1 = &self.key1[0]
        self.ord.heap.key2 = &self.key2[0]
        self.ord.s3hits = &self.freq[0]
        self.ord.queue = &self.queue[0]
        self.ord.stored_tick = &self.stored_tick[0]
        self.ord.hits = &self.hits[0]
        self.ord.next_use = &self.next_use[0]
        self._clear_structures()

    cdef _clear_structures(self):
        self.index = {}
        self.ghost = Ghost()
        self.n_evictable = 0
        self.ord.heap.size = 0
        cdef int q
        for q in range(2):
            self.ord.lst[q].prev = &self.prev[0]
            self.ord.lst[q].next = &self.nxt[0]
            self.ord.lst[q].head = NIL
            self.ord.lst[q].tail = NIL
            self.ord.lst[q].size = 0

    def reset_all(self):
        """Everything free and unhashed (the pool's reset clears the block map itself)."""
        self.slack_tokens = 0
        n = self.num_blocks
        self.refcnt_np[:] = 0
        self.hashed_np[:] = 0
        np.asarray(self.where)[:] = W_FREE
        np.asarray(self.prev)[:] = DETACHED
        np.asarray(self.nxt)[:] = DETACHED
        np.asarray(self.hpos)[:] = NIL
        np.asarray(self.next_use)[:] = INFINITY
        np.asarray(self.free_stack)[:] = np.arange(n - 1, -1, -1, dtype=np.int32)
        self.fs.top = n
        self.hkey = [None] * n
        self._clear_structures()

    @property
    def policy_name(self):
        return [k for k, v in POLICY_CODES.items() if v == self.policy][0]

    # -- the evictable structure ---------------------------------------------------------
    @property
    def free_top(self):
        """Blocks on the free stack."""
        return self.fs.top

    cdef inline void _ev_insert(self, int b) noexcept:
        """Block b just became idle (refcount 0) and is hashed: make it evictable."""
        self.tick += 1
        self.where[b] = W_EVICT
        self.n_evictable += 1
        order_insert(&self.ord, b, self.tick)

    cdef inline void _ev_remove(self, int b) noexcept:
        """Take an idle block out of the evictable structure (a hit, or its eviction)."""
        self.where[b] = W_HELD
        self.n_evictable -= 1
        order_remove(&self.ord, b)

    cdef inline int _ev_victim(self) noexcept:
        """The next block to evict (policy order), without removing it. -1 when none."""
        if self.n_evictable == 0:
            return NIL
        return order_victim(&self.ord, self.n_evictable)

    cdef inline void _observe(self, int which, double v) noexcept:
        cdef int i = 0
        while i < NBUCKETS - 1 and v > _BOUNDS[i]:
            i += 1
        self.hist[which, i] += 1
        self.hist_sum[which] += v

    # -- taking and returning blocks -------------------------------------------------------
    cdef inline void _stamp(self, int b, int32_t owner, uint8_t st, uint32_t v) noexcept:
        self.owner[b] = owner
        self.state[b] = st
        self.cv[b >> CHUNK_SHIFT] = v

    cdef inline int _record(self, uint8_t kind, tuple values) except -1:
        """Append one event of `kind` (its EVENT_FIELDS values, in order) to the pool's ring,
        as EventLog.record would."""
        self.ring.record_values(kind, values, wall_time())
        return 0

    def available(self):
        """Blocks a new allocation could get: free plus idle cached (evictable)."""
        return self.fs.top + self.n_evictable

    cdef inline int64_t _requested_delta(self, int64_t held, int64_t slack_before) noexcept:
        """How much the pool's requested bytes changed when `held` blocks came to sequences
        (negative: left them) while the slack went from slack_before to slack_tokens: the
        pool counts sequence bytes as blocks * block_bytes - slack * block_bytes // block_size
        (PrefixPool.requested_total), so the events carry the exact difference."""
        cdef int64_t bb = self.block_bytes, bs = self.block_size
        return held * bb - (self.slack_tokens * bb // bs - slack_before * bb // bs)

    cdef object _take_into(self, int32_t *o, Py_ssize_t n, int32_t owner, uint8_t st,
                           uint32_t v, double now):
        """Take n blocks into o[0:n]: the free stack first, then evictions in policy order.
        Returns (blocks, hashes) of the evicted ones as native int32 / uint64 bytes (what their
        `removed` event names), or None. Caller checked n <= available()."""
        cdef Py_ssize_t i, nev = 0, most = n - self.fs.top
        cdef int b
        cdef int32_t sb[SMALL_OP]
        cdef uint64_t sh[SMALL_OP]
        cdef int32_t *evb = sb
        cdef uint64_t *evh = sh
        cdef dict index = self.index
        cdef list hkey = self.hkey
        cdef object ho
        if most > SMALL_OP:
            evb = <int32_t *>PyMem_Malloc(most * sizeof(int32_t))
            evh = <uint64_t *>PyMem_Malloc(most * sizeof(uint64_t))
            if evb == NULL or evh == NULL:
                PyMem_Free(evb)
                PyMem_Free(evh)
                raise MemoryError()
        try:
            for i in range(n):
                if self.fs.top > 0:
                    b = stack_pop(&self.fs)
                else:
                    b = self._ev_victim()
                    self._ev_remove(b)
                    ho = hkey[b]
                    hkey[b] = None
                    evb[nev] = b
                    evh[nev] = self.bhash[b]
                    nev += 1
                    order_evicted(&self.ord, self.ghost, b, ho)
                    PyDict_DelItem(index, ho)
                    self.hashed[b] = 0
                    self.evicted += 1
                    self._observe(0, now - self.born[b])
                    self._observe(1, now - self.released[b])
                self.where[b] = W_HELD
                self.refcnt[b] = 1
                self.next_use[b] = INFINITY
                self.hits[b] = 0
                self.freq[b] = 0
                self.born[b] = now
                self.last_access[b] = now
                self._stamp(b, owner, st, v)
                o[i] = b
            return None if nev == 0 else (_id_run(evb, nev), _hash_run(evh, nev))
        finally:
            if evb != sb:
                PyMem_Free(evb)
                PyMem_Free(evh)

    def take(self, int n, int32_t owner, int st):
        """n blocks for a plain allocation (refcount 1 each), evicting idle cached blocks when
        the free stack runs out. Returns (array('i'), evicted): evicted is None or (blocks,
        hashes) as native int32 / uint64 bytes, for the caller to record as `removed` after its
        own event (see `_removed`). Caller checks n <= available()."""
        if n < 0:
            raise ValueError(f"cannot take {n} blocks")
        cdef carray.array out = carray.clone(I32, n, False)
        if n == 0:
            return out, None
        return out, self._take_into(<int32_t *>out.data.as_ints, n, owner, <uint8_t>st,
                                    self.bm.version, mono())

    def removed(self, evicted, int64_t taken_by):
        """Record the `removed` event of blocks `take` evicted for `taken_by`."""
        self._removed(evicted, taken_by)

    cdef _removed(self, tuple evicted, int64_t taken_by):
        # NOTE: recorded after the event of the operation that took the blocks (which names
        # them with their new owner), never before: a history keyframe may be taken after any
        # event, and one taken between the two would hold the operation's effects already, so
        # replaying its (relative) numbers on top would count them twice. `taken_by` tells the
        # replay this eviction changed no block beyond what that event said.
        self._record(self.k_removed, (evicted[0], evicted[1], "evicted", taken_by))

    def give_back(self, blocks):
        """Return the blocks of a plain allocation (refcount 1, never hashed) to the free stack."""
        cdef int32_t[:] bl = blocks
        cdef Py_ssize_t i
        cdef int b
        cdef uint32_t v = self.bm.version
        for i in range(bl.shape[0] - 1, -1, -1):
            b = bl[i]
            self.refcnt[b] = 0
            self.where[b] = W_FREE
            stack_push(&self.fs, b)
            self._stamp(b, NIL, FREE, v)

    cdef int _release(self, int b, uint32_t v, double now) noexcept:
        """Drop one reference to b; returns the state it took (SHARED: unchanged, still
        shared; USED: one holder left; CACHED: idle and hashed; FREE)."""
        cdef int r = self.refcnt[b] - 1
        self.refcnt[b] = r
        if r >= 2:
            return SHARED
        if r == 1:
            self.state[b] = USED
            self.cv[b >> CHUNK_SHIFT] = v
            return USED
        self.released[b] = now
        if self.hashed[b]:
            self._ev_insert(b)
            self.state[b] = CACHED
            self.cv[b >> CHUNK_SHIFT] = v
            return CACHED
        self.where[b] = W_FREE
        stack_push(&self.fs, b)
        self._stamp(b, NIL, FREE, v)
        return FREE

    # -- sequences -------------------------------------------------------------------------
    cdef _hash_tokens(self, object tokens, Py_ssize_t nfull, uint64_t parent):
        """Validated int64 token array and the chain hashes of its first nfull blocks."""
        cdef Py_ssize_t i, n = len(tokens), bs = self.block_size
        toks = np.empty(n, np.int64)
        cdef int64_t[:] t = toks
        for i in range(n):
            x = tokens[i]
            if type(x) is not int:
                raise ValueError(f"tokens[{i}] must be an integer token id in [0, 2**63), got {x!r}")
            try:
                t[i] = x
            except OverflowError:
                t[i] = -1
            if t[i] < 0:
                raise ValueError(f"tokens[{i}] must be an integer token id in [0, 2**63), got {x!r}")
        cdef list hashes = [None] * nfull
        cdef uint64_t h = parent
        for i in range(nfull):
            h = chain_hash(h, t, i * bs, bs)
            hashes[i] = h
        return toks, hashes

    cdef list _check_hashes(self, object values, Py_ssize_t n):
        """The first n caller-supplied hashes as a list, each an int in [0, 2**64)."""
        cdef list out = list(values[:n]) if type(values) is not list or len(values) != n else values
        cdef Py_ssize_t i
        for i in range(n):
            x = out[i]
            if type(x) is not int:
                raise ValueError(f"block_hashes[{i}] must be an integer in [0, 2**64), got {x!r}")
            try:
                <uint64_t>x
            except OverflowError:
                raise ValueError(f"block_hashes[{i}] must be an integer in [0, 2**64), got {x!r}") from None
        return out

    cdef int64_t _shape(self, tokens, block_hashes, num_tokens) except -1:
        """Validate what a sequence is opened with; returns its number of tokens."""
        cdef Py_ssize_t bs = self.block_size, nh = 0
        if tokens is not None:
            if block_hashes is not None:
                raise ValueError("give 'tokens' or 'block_hashes' (with 'num_tokens'), not both")
            if type(tokens) is not list and type(tokens) is not tuple:
                raise ValueError("'tokens' must be a list of integers")
            if len(tokens) == 0:
                raise ValueError("'tokens' is empty; a sequence holds at least one token")
            if num_tokens is not None and num_tokens != len(tokens):
                raise ValueError(f"'num_tokens' ({num_tokens!r}) disagrees with len(tokens) ({len(tokens)}); give one")
            return len(tokens)
        if block_hashes is not None:
            if type(block_hashes) is not list and type(block_hashes) is not tuple:
                raise ValueError("'block_hashes' must be a list of integers")
            nh = len(block_hashes)
            if num_tokens is None:
                num_tokens = nh * bs
        elif num_tokens is None:
            raise ValueError("give 'tokens', or 'block_hashes' and/or 'num_tokens'")
        if type(num_tokens) is not int or num_tokens <= 0 or num_tokens >= (1 << 62):
            raise ValueError(f"'num_tokens' must be a positive integer, got {num_tokens!r}")
        if block_hashes is not None and not (num_tokens // bs <= nh <= (num_tokens + bs - 1) // bs):
            raise ValueError(
                f"{num_tokens} tokens fill {num_tokens // bs} blocks of {bs}: give one hash per full "
                f"block ({num_tokens // bs}, or {(num_tokens + bs - 1) // bs} with the partial last "
                f"one), got {nh}")
        return num_tokens

    cdef Py_ssize_t _match(self, list hashes, Py_ssize_t nhash, int32_t *out, int *idle_matched):
        """How many leading `hashes` name cached blocks (the longest cached prefix; a block
        already matched in this sequence ends it), written to out[0:matched] unless out is
        NULL; *idle_matched counts those no sequence holds."""
        cdef Py_ssize_t i, matched = 0
        cdef int b
        cdef PyObject *got
        cdef dict index = self.index
        self.op += 1
        for i in range(nhash):
            got = PyDict_GetItem(index, hashes[i])
            if got == NULL:
                break
            b = <object>got
            if self.mark[b] == self.op:
                break
            self.mark[b] = self.op
            if self.refcnt[b] == 0:
                idle_matched[0] += 1
            if out != NULL:
                out[i] = b
            matched += 1
        return matched

    def open(self, int64_t seq_id, tokens, block_hashes, num_tokens_in, salt, next_use):
        """Open sequence `seq_id` of `tokens`, or `num_tokens_in` tokens named by `block_hashes`
        (one per full block), or of `num_tokens_in` alone. Returns its Seq. Raises ValueError
        (bad input) or MemoryError(needed, available) when the blocks it needs exceed free +
        evictable; nothing changes on either."""
        cdef Py_ssize_t bs = self.block_size, i, nfull, nblocks, matched = 0, nhash
        cdef int b, need, idle_matched = 0
        cdef int64_t num_tokens = self._shape(tokens, block_hashes, num_tokens_in)
        cdef uint64_t root = ROOT_SEED
        cdef list hashes
        if salt is not None:
            if type(salt) is not str or len(salt) > 256:
                raise ValueError("'salt' must be a string of at most 256 characters")
            root = root_hash(salt)
        toks = None
        nfull = num_tokens // bs
        nblocks = (num_tokens + bs - 1) // bs
        if next_use is not None:
            next_use = _next_use(next_use, nblocks)
        mode = 0
        if tokens is not None:
            toks, hashes = self._hash_tokens(tokens, nfull, root)
            mode = 1
        elif block_hashes is not None:
            hashes = self._check_hashes(block_hashes, nfull)
            mode = 2
        else:
            hashes = []
        nhash = len(hashes)
        if nblocks > self.num_blocks:
            # More blocks than the pool has can never fit: refused before anything of the
            # sequence's size is built, with the numbers the full check below would give.
            matched = self._match(hashes, nhash, NULL, &idle_matched)
            raise MemoryError(nblocks - matched, self.fs.top + self.n_evictable - idle_matched)
        cdef carray.array blocks = carray.clone(I32, nblocks, False)
        cdef int32_t *bl = <int32_t *>blocks.data.as_ints
        matched = self._match(hashes, nhash, bl, &idle_matched)
        need = nblocks - matched
        if need > self.fs.top + self.n_evictable - idle_matched:
            raise MemoryError(need, self.fs.top + self.n_evictable - idle_matched)
        cdef double now = mono()
        cdef uint32_t v = self.bm.version
        cdef int32_t owner
        cdef uint8_t st
        cdef int64_t slack_before = self.slack_tokens
        # hits on blocks other sequences hold: they become SHARED, owner unchanged (the event
        # names them; every other block of the sequence becomes USED by it)
        cdef int32_t held_small[SMALL_OP]
        cdef int32_t *held = held_small
        cdef Py_ssize_t nheld = 0
        if matched - idle_matched > SMALL_OP:
            held = <int32_t *>PyMem_Malloc((matched - idle_matched) * sizeof(int32_t))
            if held == NULL:
                raise MemoryError()
        for i in range(matched):
            b = bl[i]
            if self.refcnt[b] == 0:
                self._ev_remove(b)
                owner, st = <int32_t>seq_id, USED
            else:
                owner, st = self.owner[b], SHARED
                held[nheld] = b
                nheld += 1
            self.refcnt[b] += 1
            self.hits[b] += 1
            s3_hit(self.ord.s3hits, b)
            self._observe(2, now - self.last_access[b])
            self.last_access[b] = now
            self.depth[b] = i
            self._stamp(b, owner, st, v)
        shared = _ids(held, nheld)
        if held != held_small:
            PyMem_Free(held)
        removed = None
        if need:
            removed = self._take_into(bl + matched, need, <int32_t>seq_id, USED, v, now)
        if next_use is not None:
            for i in range(nblocks):
                self.next_use[bl[i]] = next_use[i]
        seq = Seq()
        seq.id = seq_id
        seq.num_tokens = num_tokens
        seq.cached_tokens = matched * bs
        seq.blocks = blocks
        seq.mode = mode
        seq.opened_at = now
        seq.nhashed = matched
        seq.last_hash = hashes[matched - 1] if matched else root
        self.queries += num_tokens
        self.hit_tokens += matched * bs
        self.query_blocks += nblocks
        self.hit_blocks += matched
        self.slack_tokens += nblocks * bs - num_tokens
        self.opens += 1
        self._record(self.k_open, (seq_id, num_tokens, matched * bs, _id_run(bl, nblocks), shared,
                                   self._requested_delta(idle_matched + need, slack_before)))
        if removed is not None:
            self._removed(removed, seq_id)
        if mode == 1:
            seq.pending = toks[nfull * bs:].tolist()
        if nhash > matched:
            self._register(seq, hashes, 0, matched, nhash, toks, 0)
        elif matched:
            seq.nhashed = matched
        return seq

    cdef _register(self, Seq seq, list hashes, Py_ssize_t first, Py_ssize_t start, Py_ssize_t stop,
                   toks, Py_ssize_t tok_base):
        """Index blocks first+start .. first+stop-1 of `seq`, hashes[k] naming block first+k.

        A hash already indexed (another sequence filled the same prefix meanwhile) leaves the
        block private and unhashed, so each hash names one block; the stored events are split
        into runs that each chain from their parent, as vLLM's BlockStored expects."""
        cdef Py_ssize_t i, run = 0, run_start = 0
        cdef int b
        cdef uint64_t hv
        cdef object parent, run_parent = None, h, bo
        cdef dict index = self.index
        cdef list hkey = self.hkey
        cdef carray.array arr = seq.blocks
        cdef int32_t *blocks = <int32_t *>arr.data.as_ints
        # the run of newly indexed blocks and their hashes, for its `stored` event
        cdef int32_t sb[SMALL_OP]
        cdef uint64_t sh[SMALL_OP]
        cdef int32_t *rb = sb
        cdef uint64_t *rh = sh
        if start > 0:
            parent = hashes[start - 1]
        elif first > 0:
            parent = seq.last_hash
        else:
            parent = None
        if stop - start > SMALL_OP:
            rb = <int32_t *>PyMem_Malloc((stop - start) * sizeof(int32_t))
            rh = <uint64_t *>PyMem_Malloc((stop - start) * sizeof(uint64_t))
            if rb == NULL or rh == NULL:
                PyMem_Free(rb)
                PyMem_Free(rh)
                raise MemoryError()
        try:
            for i in range(start, stop):
                b = blocks[first + i]
                h = hashes[i]
                bo = b  # one int object for the index and hkey
                self.depth[b] = first + i
                if PyDict_SetDefault(index, h, bo) == <PyObject *>bo:  # one lookup: inserted, was not indexed
                    hv = h
                    self.bhash[b] = hv
                    hkey[b] = h
                    self.hashed[b] = 1
                    self.tick += 1
                    self.stored_tick[b] = self.tick
                    self.stored += 1
                    order_stored(&self.ord, self.ghost, b, h)
                    if run == 0:
                        run_parent = parent
                        run_start = first + i
                    rb[run] = b
                    rh[run] = hv
                    run += 1
                elif run:
                    self._stored_event(seq, rb, rh, run, run_parent, run_start, toks, tok_base)
                    run = 0
                parent = h
            if run:
                self._stored_event(seq, rb, rh, run, run_parent, run_start, toks, tok_base)
        finally:
            if rb != sb:
                PyMem_Free(rb)
                PyMem_Free(rh)
        if stop > 0:
            seq.nhashed = first + stop
            seq.last_hash = hashes[stop - 1]

    cdef _stored_event(self, Seq seq, int32_t *blocks, uint64_t *hashes, Py_ssize_t n, parent,
                       Py_ssize_t first_block, toks, Py_ssize_t tok_base):
        cdef Py_ssize_t bs = self.block_size, a
        token_ids = None
        if toks is not None:
            a = (first_block - tok_base) * bs
            token_ids = toks[a:a + n * bs].tobytes()  # native int64
        self._record(self.k_stored, (_id_run(blocks, n), _hash_run(hashes, n), parent, token_ids, bs,
                                     seq.id))

    def append(self, Seq seq, tokens, int64_t num_new, block_hashes):
        """Grow `seq` by num_new tokens (given as `tokens` in token mode); newly full blocks are
        hashed and indexed. Raises MemoryError(needed, available) with nothing changed, or
        ValueError for bad token ids / hashes."""
        cdef Py_ssize_t bs = self.block_size, i
        cdef int64_t old = seq.num_tokens, total = old + num_new
        cdef Py_ssize_t old_full = old // bs, new_full = total // bs
        cdef Py_ssize_t have = len(seq.blocks), nblocks = (total + bs - 1) // bs
        cdef Py_ssize_t need = nblocks - have
        cdef list hashes = []
        toks = None
        if num_new <= 0 or num_new >= (1 << 62):
            raise ValueError(f"'num_tokens' must be a positive integer below 2**62, got {num_new}")
        if seq.mode == 1:
            toks, hashes = self._hash_tokens(seq.pending + list(tokens), new_full - old_full,
                                             seq.last_hash)
        elif seq.mode == 2 and block_hashes is not None:
            hashes = self._check_hashes(block_hashes, len(block_hashes))
        if need > self.fs.top + self.n_evictable:
            raise MemoryError(need, self.fs.top + self.n_evictable)
        cdef double now = mono()
        cdef uint32_t v = self.bm.version
        cdef int64_t slack_before = self.slack_tokens
        cdef carray.array new = None
        removed = None
        if need > 0:
            new = carray.clone(I32, need, False)
            removed = self._take_into(<int32_t *>new.data.as_ints, need, <int32_t>seq.id, USED, v, now)
            seq.blocks.extend(new)
        seq.num_tokens = total
        self.slack_tokens += need * bs - num_new
        self.appends += 1
        added = _id_run(<int32_t *>new.data.as_ints, need) if need > 0 else b""
        self._record(self.k_append, (seq.id, total, added, self._requested_delta(need, slack_before)))
        if removed is not None:
            self._removed(removed, seq.id)
        if seq.mode == 1:
            seq.pending = toks[(new_full - old_full) * bs:].tolist()
            self._register(seq, hashes, old_full, 0, new_full - old_full, toks, old_full)
        elif seq.mode == 2:
            if block_hashes is None and new_full > old_full:
                seq.mode = 0  # the chain breaks: nothing after this is cached
            else:
                self._register(seq, hashes, old_full, 0, len(hashes), None, old_full)
        return new

    def close(self, Seq seq):
        """Drop the sequence's references, tail first: idle hashed blocks become evictable (so
        with equal recency a prefix's tail goes before its head), the rest return free."""
        cdef carray.array blocks = seq.blocks
        cdef int32_t *bl = <int32_t *>blocks.data.as_ints
        cdef Py_ssize_t i, n = len(blocks), nfreed = 0, ncached = 0, nused = 0
        cdef double now = mono()
        cdef uint32_t v = self.bm.version
        cdef int64_t slack_before = self.slack_tokens
        cdef int b, st
        # what each block became, for the event: freed (owner gone), idle cached, one holder left
        cdef int32_t went_small[3 * SMALL_OP]
        cdef int32_t *went = went_small
        if n > SMALL_OP:
            went = <int32_t *>PyMem_Malloc(3 * n * sizeof(int32_t))
            if went == NULL:
                raise MemoryError()
        cdef int32_t *freed = went
        cdef int32_t *cached = went + n
        cdef int32_t *used = went + 2 * n
        for i in range(n - 1, -1, -1):
            b = bl[i]
            st = self._release(b, v, now)
            if st == FREE:
                freed[nfreed] = b
                nfreed += 1
            elif st == CACHED:
                cached[ncached] = b
                ncached += 1
            elif st == USED:
                used[nused] = b
                nused += 1
        self.slack_tokens -= n * self.block_size - seq.num_tokens
        self.closes += 1
        try:
            freed_ids, cached_ids, used_ids = _ids(freed, nfreed), _ids(cached, ncached), _ids(used, nused)
        finally:
            if went != went_small:
                PyMem_Free(went)
        self._record(self.k_close, (seq.id, _id_run(bl, n), freed_ids, cached_ids, used_ids,
                                    self._requested_delta(-(nfreed + ncached), slack_before)))

    def reset_prefix(self):
        """Forget every hash: idle cached blocks go free, held ones stay held but unhashed.
        Returns (blocks, hashes) forgotten."""
        cdef int b
        cdef uint32_t v = self.bm.version
        blocks, hashes = [], []
        freed = array("i")  # the idle ones: held blocks keep their owner and state
        for h, bo in self.index.items():
            b = bo
            blocks.append(b)
            hashes.append(h)
            self.hashed[b] = 0
            self.hkey[b] = None
            if self.where[b] == W_EVICT:
                self._ev_remove(b)
                self.where[b] = W_FREE
                stack_push(&self.fs, b)
                self._stamp(b, NIL, FREE, v)
                freed.append(b)
        self.index = {}
        self.ghost = Ghost()
        self._record(self.k_cleared, (_frozen(blocks), _frozen(hashes), freed.tobytes()))
        return blocks, hashes

    def set_next_use(self, blocks, next_use):
        """Update the Bélády keys of held blocks (caller-supplied next-use times)."""
        for i in range(len(blocks)):
            self.next_use[blocks[i]] = next_use[i]

    # -- reading ---------------------------------------------------------------------------
    def eviction_order(self, limit=None):
        """Idle cached blocks, next victim first (at most `limit`). O(n log n) for heaps."""
        cdef int b, q
        n = self.n_evictable if limit is None else min(limit, self.n_evictable)
        out = []
        if n <= 0:
            return out
        if self.policy == P_LRU:
            return self._walk(0)[:n]
        if self.policy != P_S3FIFO:
            items = [(self.key1[b], self.key2[b], b) for b in self._heap_blocks()]
            items.sort()
            return [x[2] for x in items[:n]]
        # s3fifo: run the policy on copies of the two queues' links, hit counts and queue codes
        self._walk(Q_SMALL)
        self._walk(Q_MAIN)  # (both walks check the links the copies follow)
        return self._s3_order(n)

    cdef list _s3_order(self, Py_ssize_t n):
        prev, nxt = np.array(self.prev, dtype=np.int32), np.array(self.nxt, dtype=np.int32)
        hits, queue = np.array(self.freq, dtype=np.uint8), np.array(self.queue, dtype=np.uint8)
        got = np.empty(n, dtype=np.int32)
        cdef int32_t[::1] pv = prev, nv = nxt, gv = got
        cdef uint8_t[::1] hv = hits, qv = queue
        cdef DList q[2]
        cdef int i
        for i in range(2):
            q[i] = self.ord.lst[i]
            q[i].prev = &pv[0]
            q[i].next = &nv[0]
        k = s3_drain(&q[Q_SMALL], &q[Q_MAIN], &hv[0], &qv[0], Q_MAIN, False, &gv[0], n)
        return got[:k].tolist()

    def evictable_blocks(self):
        """Every idle cached block, in no particular order (for check)."""
        if order_is_list(&self.ord):
            return self._walk(0) + self._walk(1)
        return self._heap_blocks()

    cdef list _walk(self, int q):
        """The blocks of list q, head first. CorruptState at a link outside the pool or past
        the list's size (check() names it): the walk never follows a bad index."""
        cdef list out = []
        cdef int b = self.ord.lst[q].head
        while b != NIL:
            if b < 0 or b >= self.num_blocks or len(out) >= self.ord.lst[q].size:
                raise CorruptState(f"eviction list {q} links to block {b} (check() names it)")
            out.append(b)
            b = self.nxt[b]
        return out

    cdef list _heap_blocks(self):
        """The blocks in the eviction heap. CorruptState when its size or an entry lies
        outside the pool (check() names it)."""
        cdef Py_ssize_t i
        if not 0 <= self.ord.heap.size <= self.num_blocks:
            raise CorruptState(f"the eviction heap claims {self.ord.heap.size} blocks (check() names it)")
        out = [self.heap[i] for i in range(self.ord.heap.size)]
        for b in out:
            if not 0 <= b < self.num_blocks:
                raise CorruptState(f"the eviction heap holds block {b} (check() names it)")
        return out

    cdef object _list_problem(self, int q):
        """What is wrong with eviction list q (None: sound): walked at most its size and
        never past the pool, each block checked before its links are read."""
        cdef int b = self.ord.lst[q].head, p = NIL
        cdef Py_ssize_t n = 0, size = self.ord.lst[q].size
        if not 0 <= size <= self.num_blocks:
            return f"eviction list {q} claims {size} blocks, the pool has {self.num_blocks}"
        while b != NIL:
            if b < 0 or b >= self.num_blocks:
                return f"eviction list {q} links from block {p} to {b}, outside 0..{self.num_blocks - 1}"
            if self.prev[b] != p:
                return f"eviction list {q}: block {b} links back to {self.prev[b]}, not {p}"
            if self.where[b] != W_EVICT:
                return f"eviction list {q} runs into block {b}, which is not evictable (location {self.where[b]})"
            if self.policy == P_S3FIFO and self.queue[b] != q:
                return f"eviction list {q} holds block {b} of queue {self.queue[b]}"
            n += 1
            if n > size:
                return f"eviction list {q} runs past its size of {size} (a cycle or a stray link)"
            p, b = b, self.nxt[b]
        if p != self.ord.lst[q].tail or n != size:
            return f"eviction list {q}: {n} blocks walked to {p}, its size is {size} and tail {self.ord.lst[q].tail}"
        return None

    def check(self) -> list:
        """Problems with the compiled structures alone (empty = ok): the free stack, the
        eviction list(s) or heap, the location codes and the blocks the hash index names.
        Every walk is bounded by what the structure claims and by the pool, and every index
        is checked before it is followed; PrefixPool.check compares them with its records
        once they hold."""
        cdef Py_ssize_t n = self.num_blocks, i, q
        cdef int b
        if not 0 <= self.fs.top <= n:
            return [f"the free stack claims {self.fs.top} blocks, the pool has {n}"]
        for i in range(self.fs.top):
            b = self.free_stack[i]
            if b < 0 or b >= n:
                return [f"free stack entry {i} is block {b}, outside 0..{n - 1}"]
        bad = np.flatnonzero(np.asarray(self.where) > W_EVICT)
        if bad.size:
            return [f"block {int(bad[0])} has location code {self.where[int(bad[0])]}"]
        if not 0 <= self.n_evictable <= n:
            return [f"the evictable count is {self.n_evictable}, the pool has {n}"]
        if self.policy == P_S3FIFO:
            bad = np.flatnonzero(np.asarray(self.queue) > Q_MAIN)
            if bad.size:
                return [f"block {int(bad[0])} is filed for s3fifo queue {self.queue[int(bad[0])]}"]
        if order_is_list(&self.ord):
            for q in range(2):
                problem = self._list_problem(q)
                if problem is not None:
                    return [problem]
            if self.ord.heap.size != 0:
                return [f"the eviction heap holds {self.ord.heap.size} blocks under a list policy"]
            if self.ord.lst[0].size + self.ord.lst[1].size != self.n_evictable:
                return [f"the eviction lists hold {self.ord.lst[0].size + self.ord.lst[1].size} blocks, "
                        f"the evictable count is {self.n_evictable}"]
        else:
            for q in range(2):
                if self.ord.lst[q].head != NIL or self.ord.lst[q].tail != NIL or self.ord.lst[q].size:
                    return [f"eviction list {q} claims blocks under a heap policy"]
            if self.ord.heap.size != self.n_evictable:
                return [f"the eviction heap holds {self.ord.heap.size} blocks, the evictable count is {self.n_evictable}"]
            for i in range(self.ord.heap.size):
                b = self.heap[i]
                if b < 0 or b >= n:
                    return [f"eviction heap position {i} holds block {b}, outside 0..{n - 1}"]
                if self.hpos[b] != i:
                    return [f"eviction heap position {i} holds block {b}, whose position says {self.hpos[b]}"]
                if self.where[b] != W_EVICT:
                    return [f"the eviction heap holds block {b}, which is not evictable (location {self.where[b]})"]
                if i > 0 and heap_less(&self.ord.heap, b, self.heap[(i - 1) >> 1]):
                    return [f"the eviction heap is out of order at position {i}"]
        for h, bo in self.index.items():
            if type(bo) is not int or not 0 <= bo < n:
                return [f"hash {h!r} indexes block {bo!r}, outside 0..{n - 1}"]
        return []

    def _raw(self) -> dict:
        """The per-block arrays as writable numpy views, by name, for corruption tests and
        debugging: a write bypasses every invariant, and check() must then name the damage."""
        return {"refcnt": self.refcnt_np, "hash": self.hash_np, "hashed": self.hashed_np,
                "where": np.asarray(self.where), "prev": np.asarray(self.prev),
                "next": np.asarray(self.nxt), "heap": np.asarray(self.heap),
                "hpos": np.asarray(self.hpos), "free_stack": np.asarray(self.free_stack),
                "queue": np.asarray(self.queue), "freq": np.asarray(self.freq)}

    def _poke(self, str field, int64_t value) -> int:
        """Overwrite one scalar field, `top` (the free stack's), `heap_size`, `n_evictable`
        or `list<q>.head|tail|size`, and return what it held (corruption tests only, like
        `_raw`)."""
        cdef int q
        cdef int64_t old
        if field == "top":
            old, self.fs.top = self.fs.top, value
        elif field == "heap_size":
            old, self.ord.heap.size = self.ord.heap.size, <int>value
        elif field == "n_evictable":
            old, self.n_evictable = self.n_evictable, <int>value
        elif field.startswith("list") and "." in field:
            index, part = field[4:].split(".")
            q = int(index)
            if q not in (0, 1):
                raise KeyError(field)
            if part == "head":
                old, self.ord.lst[q].head = self.ord.lst[q].head, <int32_t>value
            elif part == "tail":
                old, self.ord.lst[q].tail = self.ord.lst[q].tail, <int32_t>value
            elif part == "size":
                old, self.ord.lst[q].size = self.ord.lst[q].size, value
            else:
                raise KeyError(field)
        else:
            raise KeyError(field)
        return old

    def free_blocks(self):
        return np.asarray(self.free_stack)[:self.fs.top].copy()

    def where_np(self):
        return np.asarray(self.where)

    def heap_ok(self):
        """Whether the heap property and positions hold (fifo/lfu/belady)."""
        cdef int i
        if not 0 <= self.ord.heap.size <= self.num_blocks:
            return False
        for i in range(self.ord.heap.size):
            if not 0 <= self.heap[i] < self.num_blocks or self.hpos[self.heap[i]] != i:
                return False
            if i > 0 and heap_less(&self.ord.heap, self.heap[i], self.heap[(i - 1) >> 1]):
                return False
        return True

    def block_hits(self, int b):
        """Hits on block b since it was last taken. IndexError outside the pool."""
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} outside 0..{self.num_blocks - 1}")
        return self.hits[b]

    def next_use_of(self, int b):
        """Block b's Bélády key (its next use). IndexError outside the pool."""
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} outside 0..{self.num_blocks - 1}")
        return self.next_use[b]

    def histograms(self):
        """{name: {"bounds", "counts", "sum", "count"}} for lifetime, idle_before_evict and
        reuse_gap: seconds; counts per bucket, not cumulative; `counts[k]` is for values up to
        `bounds[k]`, and the one extra last count for values past the last bound (no infinity
        in the output, so it stays valid JSON)."""
        h = np.asarray(self.hist)
        return {name: {"bounds": list(HIST_BOUNDS[:NBUCKETS - 1]), "counts": h[i].tolist(),
                       "sum": self.hist_sum[i], "count": int(h[i].sum())}
                for i, name in enumerate(HIST_NAMES)}
