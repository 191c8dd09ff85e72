# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""FleetCore: one prefix index over the cached blocks of many engines (at most 1,024).

Engines name the same tokens with different block hashes (vLLM seeds its root hash per process,
SGLang hashes its own way), so a block is keyed here by its content: `key = H(parent key, lora,
the block's token ids)`, chained from the root (key 0). Each engine keeps a table from its own
hashes to these keys (the two-key design of llm-d's kvblock index), through which its removes
and the parents of its stores are resolved. A store that carries no token ids falls back to a
key made from the engine's own hash (`H(FALLBACK, hash)`): engines that hash alike still share
those, engines that do not, never do.

Per indexed block (a "node", in flat arrays grown by doubling; no Python object per block):
`node_key` (u64), `node_parent` (the parent's key, 0 for a root) and the engines holding it.
Engines are grouped in pages of 64 (engine e: page e >> 6, bit e & 63). A node whose holders all
sit in one page keeps them inline: `node_page` (u8) names the page and `node_bits` (u64) holds
its bits, so a fleet of up to 64 engines is one bit mask per block. A node held across pages
(`node_page == EXT`) has `node_bits` point to a chunk of its pages: the sorted page ids and one
u64 of bits each (`ext_*` below), grown by doubling, back inline when one page is left. The DP
ranks of a server take consecutive ids, so they share a page. Keys map to nodes through an
open-addressing table of int32 node ids (linear probing, backward-shift deletion, load <= 3/4)
that compares `node_key[id]`; each engine's table maps its hashes to node ids the same way with
the hash in the slot.

A node lives while some engine holds it (`node_bits != 0`). Engine e holds node n while one of
its hashes maps to n; a second hash of e mapping to the same node (rare: the same tokens under
different extra keys) is counted in `multi[(n, e)]`, and a hash stored again while held (vLLM
does not de-duplicate) in `extra[(e, hash)]`, so every remove drops exactly one copy.

Invariants (checked by `FleetIndex.check`): the key table holds exactly the live nodes; a live
node holds engine e iff engine e's table maps some hash to it; a chunk has at least two pages,
each with bits, sorted; `unique`, `duplicated` and `holdings` equal the counts over the nodes.
"""

cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport qsort
from libc.string cimport memcpy, memmove, memset

import numpy as np

cdef uint64_t FALLBACK = 0x6b7673636f706531ULL
cdef uint64_t ORPHAN = 0x6f727068616e6564ULL
cdef uint64_t K1 = 0x9e3779b97f4a7c15ULL
cdef uint64_t K2 = 0xff51afd7ed558ccdULL
cdef uint64_t SET_SALT = 0x736574736f66656eULL

COUNTERS = ("batches", "stored_events", "removed_events", "cleared_events", "stored_blocks",
            "removed_blocks", "duplicate_stores", "unknown_removes", "orphan_stores",
            "fallback_blocks", "other_medium", "malformed_events", "cross_engine_recomputes",
            "recompute_tokens", "over_capacity_blocks", "block_size_changes")
cdef enum:
    MAX_ENGINES = 1024
    PAGES = 16           # MAX_ENGINES / 64
    EXT = 255            # node_page of a node held across pages
# The block map's colour groups (`layout_of`): a group holds at most 1/GROUP_DIVISOR of the
# live blocks, or MIN_GROUP blocks in a small index.
GROUP_DIVISOR = 8
MIN_GROUP = 64

cdef enum:
    C_BATCHES = 0
    C_STORED_EV = 1
    C_REMOVED_EV = 2
    C_CLEARED_EV = 3
    C_STORED_BL = 4
    C_REMOVED_BL = 5
    C_DUP = 6
    C_UNKNOWN_RM = 7
    C_ORPHAN = 8
    C_FALLBACK = 9
    C_OTHER_MEDIUM = 10
    C_MALFORMED = 11
    C_RECOMPUTE = 12
    C_RECOMPUTE_TOK = 13
    C_OVER_CAP = 14      # blocks a store would have held past the engine's block limit
    C_BS_CHANGED = 15    # blocks stored at another block size than the engine's first
    N_COUNTERS = 16

# Blocks one engine may hold in the index when its KV block count is not known (given as
# `num_blocks` or read from its /metrics): SGLang's token-level pages reach millions.
DEFAULT_ENGINE_BLOCKS = 1 << 22
ALL_ENGINES = (1 << <object>MAX_ENGINES) - 1  # every engine id, as a mask


cdef inline uint64_t mix64(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL
    return z ^ (z >> 31)


cdef inline uint64_t nonzero(uint64_t k) noexcept nogil:
    return k if k != 0 else 1  # 0 is the root's key


cdef extern from *:
    int __builtin_popcountll(unsigned long long) nogil
    int __builtin_ctzll(unsigned long long) nogil
    int __builtin_ctz(unsigned int) nogil


cdef inline int popcount(uint64_t m) noexcept nogil:
    return __builtin_popcountll(m)


cdef list ENGINE_IDS = list(range(MAX_ENGINES))  # the ids as ints, made once


cdef inline int emit(dict out, int page, uint64_t bits, Py_ssize_t blocks) except -1:
    """out[e] = blocks for every engine e of `bits` in `page` (a match's answer)."""
    cdef int base = page << 6
    cdef object v = blocks
    while bits:
        PyDict_SetItem(out, <object>PyList_GET_ITEM(ENGINE_IDS, base + __builtin_ctzll(bits)), v)
        bits &= bits - 1
    return 0


# -- a node's chunk of pages (a node held across pages) ------------------------------------------
# byte 0: pages used; byte 1: capacity (2, 4, 8 or 16); then the page ids, sorted; then, 8-aligned,
# one u64 of bits per page.
cdef inline int ext_hdr(int cap) noexcept nogil:
    return (2 + cap + 7) & ~7


cdef inline uint64_t *ext_bits(uint8_t *x) noexcept nogil:
    return <uint64_t *>(x + ext_hdr(x[1]))


cdef inline int64_t ext_bytes_of(int cap) noexcept nogil:
    """What a chunk of `cap` pages takes from the small-object allocator (16-byte classes)."""
    return (ext_hdr(cap) + 8 * cap + 15) & ~15


cdef inline uint8_t *ext_of(uint64_t bits) noexcept nogil:
    return <uint8_t *><uintptr_t>bits


# A set of engines as a match walks: bits per page and the pages that have any.
cdef struct ESet:
    uint64_t w[PAGES]
    uint32_t pm



# -- engine tables: hash -> node id, open addressing ---------------------------------------------
cdef packed struct Slot:  # a hash and its node side by side: one cache line a probe
    uint64_t key
    int32_t val     # -1: empty


cdef struct HTable:
    Slot *s
    int64_t cap     # a power of two
    int64_t n


cdef int ht_init(HTable *t, int64_t cap) except -1:
    t.s = <Slot *> PyMem_Malloc(cap * sizeof(Slot))
    if t.s == NULL:
        raise MemoryError()
    memset(t.s, 0xff, cap * sizeof(Slot))
    t.cap = cap
    t.n = 0
    return 0


cdef void ht_free(HTable *t) noexcept:
    PyMem_Free(t.s)
    t.s = NULL
    t.cap = 0
    t.n = 0


cdef inline int64_t ht_find(HTable *t, uint64_t k) noexcept nogil:
    cdef int64_t mask = t.cap - 1
    cdef int64_t i = <int64_t>(mix64(k) & <uint64_t>mask)
    while t.s[i].val >= 0:
        if t.s[i].key == k:
            return i
        i = (i + 1) & mask
    return -1


cdef int ht_grow(HTable *t) except -1:
    cdef HTable old = t[0]
    cdef int64_t i
    ht_init(t, old.cap * 2)
    for i in range(old.cap):
        if old.s[i].val >= 0:
            ht_put_new(t, old.s[i].key, old.s[i].val)
    ht_free(&old)
    return 0


cdef inline void ht_put_new(HTable *t, uint64_t k, int32_t v) noexcept nogil:
    """Insert a key known to be absent (the caller keeps the load under 3/4)."""
    cdef int64_t mask = t.cap - 1
    cdef int64_t i = <int64_t>(mix64(k) & <uint64_t>mask)
    while t.s[i].val >= 0:
        i = (i + 1) & mask
    t.s[i].key = k
    t.s[i].val = v
    t.n += 1


cdef inline int ht_put(HTable *t, uint64_t k, int32_t v) except -1:
    if (t.n + 1) * 4 > t.cap * 3:
        ht_grow(t)
    ht_put_new(t, k, v)
    return 0


cdef void ht_del_at(HTable *t, int64_t i) noexcept nogil:
    """Backward-shift deletion: no tombstones, probes stay short."""
    cdef int64_t mask = t.cap - 1
    cdef int64_t j = i, home
    while True:
        j = (j + 1) & mask
        if t.s[j].val < 0:
            break
        home = <int64_t>(mix64(t.s[j].key) & <uint64_t>mask)
        # move j back into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            t.s[i].key = t.s[j].key
            t.s[i].val = t.s[j].val
            i = j
    t.s[i].val = -1
    t.n -= 1



cdef inline bint holds_at(const uint64_t *bits, const uint8_t *pages, int32_t node, int e) noexcept nogil:
    """Whether engine e holds `node`, read off a core's arrays (FleetCore.holds, and a walk over
    several cores without their objects)."""
    cdef uint64_t b = bits[node]
    cdef int pg = pages[node], p = e >> 6, j
    cdef uint8_t *x
    if pg != EXT:
        return pg == p and (b >> (e & 63)) & 1
    x = ext_of(b)
    for j in range(x[0]):
        if x[2 + j] == p:
            return (ext_bits(x)[j] >> (e & 63)) & 1
    return False


cdef class FleetCore:
    """The compiled index; `kvevents.index.FleetIndex` adds names and the checks."""

    cdef uint64_t *node_key
    cdef uint64_t *node_parent
    cdef uint64_t *node_bits     # inline: the holders' bits in node_page; EXT: its chunk
    cdef uint8_t *node_page
    cdef int64_t free_head     # first free node id (-1: none); a free node's parent is the next
    cdef int64_t node_cap
    cdef int64_t node_top      # nodes ever handed out from the bump pointer
    cdef int64_t ext_pages     # pages in the chunks of the nodes held across pages
    cdef int64_t ext_bytes     # what those chunks take
    # key -> node id: slots hold node ids only (-1 empty); the key is node_key[id]
    cdef int32_t *kslots
    cdef int64_t kcap
    cdef int64_t kn
    cdef HTable etab[MAX_ENGINES]
    cdef uint64_t act_w[PAGES]       # bit e of page e >> 6: engine e exists
    cdef int64_t counters[MAX_ENGINES][N_COUNTERS]
    cdef int64_t held[MAX_ENGINES]   # hashes in engine e's table
    cdef int32_t bsize[MAX_ENGINES]  # tokens per block, from the engine's events (0: not seen)
    cdef int32_t bs_other[MAX_ENGINES]  # the last other block size its events used (0: none)
    cdef int64_t cap[MAX_ENGINES]    # most hashes engine e may hold (its KV block count)
    cdef readonly int64_t unique     # live nodes
    cdef readonly int64_t duplicated  # live nodes held by 2+ engines
    cdef readonly int64_t holdings   # (engine, node) pairs
    cdef int64_t epoch               # changes not seen in the counters (clears, engines added/dropped)
    cdef uint64_t *scratch_h         # a store's hashes and keys, converted once (no PyLong per block)
    cdef uint64_t *scratch_k
    cdef Py_ssize_t scratch_cap
    cdef public dict extra           # (engine, hash) -> further copies of a held hash
    cdef public dict multi           # (node, engine) -> further hashes of e on the node
    # Tiers (kvevents/tiers.py): this core indexes one storage tier. The GPU's core is the
    # fleet's own (`tier_id` 0) and routes an event of another medium to that tier's core,
    # which `tier_index(medium)` gives (None: a medium not indexed, counted in other_medium).
    # `peers` (the GPU's core only): the other tiers' cores. A store resolves a hash its core
    # does not know on the other tiers (a parent held on another tier; a store without token
    # ids of a block held elsewhere); a tier's core is handed them with each event, so no core
    # refers back to the GPU's (no reference cycle).
    cdef public int tier_id
    cdef public dict media           # medium -> its core (or None), as tier_index answered
    cdef public tuple peers

    def __cinit__(self, int64_t capacity=1024, *args, **kwargs):
        self._alloc(capacity)
        memset(self.counters, 0, sizeof(self.counters))
        memset(self.held, 0, sizeof(self.held))
        memset(self.bsize, 0, sizeof(self.bsize))
        memset(self.bs_other, 0, sizeof(self.bs_other))
        memset(self.etab, 0, sizeof(self.etab))
        memset(self.act_w, 0, sizeof(self.act_w))
        self.extra = {}
        self.multi = {}
        self.tier_id = 0
        self.media = {}
        self.peers = ()

    cdef int _alloc(self, int64_t capacity) except -1:
        cdef int64_t cap = 16
        while cap < capacity:
            cap *= 2
        self.node_cap = cap
        self.node_top = 0
        self.ext_pages = 0
        self.ext_bytes = 0
        self.node_key = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.node_parent = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.node_bits = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.node_page = <uint8_t *> PyMem_Malloc(cap * sizeof(uint8_t))
        self.free_head = -1
        self.kcap = cap * 2
        self.kn = 0
        self.kslots = <int32_t *> PyMem_Malloc(self.kcap * sizeof(int32_t))
        if (self.node_key == NULL or self.node_parent == NULL or self.node_bits == NULL
                or self.node_page == NULL or self.kslots == NULL):
            raise MemoryError()
        memset(self.kslots, 0xff, self.kcap * sizeof(int32_t))
        self.scratch_cap = 64
        self.scratch_h = <uint64_t *> PyMem_Malloc(self.scratch_cap * sizeof(uint64_t))
        self.scratch_k = <uint64_t *> PyMem_Malloc(self.scratch_cap * sizeof(uint64_t))
        if self.scratch_h == NULL or self.scratch_k == NULL:
            raise MemoryError()
        return 0

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        cdef int e
        cdef int64_t i
        for e in range(MAX_ENGINES):
            if self.etab[e].s != NULL:
                ht_free(&self.etab[e])
        if self.node_bits != NULL and self.node_page != NULL:
            for i in range(self.node_top):
                if self.node_page[i] == EXT and self.node_bits[i] != 0:
                    PyMem_Free(ext_of(self.node_bits[i]))
        PyMem_Free(self.node_key)
        PyMem_Free(self.node_parent)
        PyMem_Free(self.node_bits)
        PyMem_Free(self.node_page)
        PyMem_Free(self.kslots)
        PyMem_Free(self.scratch_h)
        PyMem_Free(self.scratch_k)
        self.node_key = self.node_parent = self.node_bits = NULL
        self.node_page = NULL
        self.kslots = NULL
        self.scratch_h = self.scratch_k = NULL
        self.node_top = 0
        self.ext_pages = self.ext_bytes = 0

    def release(self) -> None:
        """Free every array now (a deleted fleet's memory goes back at once, whoever still
        holds the object) and start over empty, with no engines."""
        self._free()
        memset(self.act_w, 0, sizeof(self.act_w))
        self.unique = self.duplicated = self.holdings = 0
        memset(self.held, 0, sizeof(self.held))
        self.extra = {}
        self.multi = {}
        self._alloc(16)
        self.epoch += 1

    # -- engines ------------------------------------------------------------------------------
    cdef inline bint _active(self, int e) noexcept:
        return 0 <= e < MAX_ENGINES and (self.act_w[e >> 6] >> (e & 63)) & 1

    @property
    def active(self) -> int:
        """The engines of the index, as a bit mask (bit e: engine e)."""
        return int.from_bytes((<char *>self.act_w)[:PAGES * 8], "little")

    def add_engine(self, int e) -> None:
        if not 0 <= e < MAX_ENGINES:
            raise ValueError(f"engine id {e} outside 0..{MAX_ENGINES - 1}")
        if self._active(e):
            raise ValueError(f"engine id {e} is taken")
        ht_init(&self.etab[e], 64)
        self.epoch += self._changes_of(e) + 1  # its counters restart at 0: the version must not
        memset(self.counters[e], 0, sizeof(self.counters[e]))
        self.held[e] = 0
        self.bsize[e] = 0
        self.bs_other[e] = 0
        self.cap[e] = DEFAULT_ENGINE_BLOCKS
        self.act_w[e >> 6] |= (<uint64_t>1) << (e & 63)

    def drop_engine(self, int e) -> None:
        """Forget engine e and everything it held."""
        self._check_engine(e)
        self.clear(e)
        self.epoch += 1
        ht_free(&self.etab[e])
        self.act_w[e >> 6] &= ~((<uint64_t>1) << (e & 63))

    cdef int _check_engine(self, int e) except -1:
        if not self._active(e):
            raise KeyError(f"no engine {e}")
        return 0

    cdef inline int64_t _changes_of(self, int e) noexcept:
        cdef int64_t *c = self.counters[e]
        return c[C_BATCHES] + c[C_STORED_EV] + c[C_REMOVED_EV]

    def version(self) -> int:
        """A change counter: it rises with every apply, store, remove and clear and with every
        engine added or dropped (applies, stores and removes through the counters they bump, the
        rest through `epoch`), so what was computed at one version holds while it is the same."""
        cdef int64_t v = self.epoch
        cdef int e
        for e in range(MAX_ENGINES):
            v += self._changes_of(e)
        return v

    # -- the key table ------------------------------------------------------------------------
    cdef inline int64_t kfind(self, uint64_t k) noexcept:
        cdef int64_t mask = self.kcap - 1
        cdef int64_t i = <int64_t>(mix64(k) & <uint64_t>mask)
        cdef int32_t v
        while True:
            v = self.kslots[i]
            if v < 0:
                return -1
            if self.node_key[v] == k:
                return i
            i = (i + 1) & mask

    cdef inline int32_t node_of(self, uint64_t k) noexcept:
        cdef int64_t i = self.kfind(k)
        return self.kslots[i] if i >= 0 else -1

    cdef void kput_new(self, int32_t node) noexcept:
        cdef int64_t mask = self.kcap - 1
        cdef int64_t i = <int64_t>(mix64(self.node_key[node]) & <uint64_t>mask)
        while self.kslots[i] >= 0:
            i = (i + 1) & mask
        self.kslots[i] = node
        self.kn += 1

    cdef void kdel_at(self, int64_t i) noexcept:
        cdef int64_t mask = self.kcap - 1
        cdef int64_t j = i, home
        while True:
            j = (j + 1) & mask
            if self.kslots[j] < 0:
                break
            home = <int64_t>(mix64(self.node_key[self.kslots[j]]) & <uint64_t>mask)
            if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
                self.kslots[i] = self.kslots[j]
                i = j
        self.kslots[i] = -1
        self.kn -= 1

    cdef int grow_nodes(self) except -1:
        cdef int64_t cap = self.node_cap * 2, i
        cdef void *p
        p = PyMem_Realloc(self.node_key, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.node_key = <uint64_t *> p
        p = PyMem_Realloc(self.node_parent, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.node_parent = <uint64_t *> p
        p = PyMem_Realloc(self.node_bits, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.node_bits = <uint64_t *> p
        p = PyMem_Realloc(self.node_page, cap * sizeof(uint8_t))
        if p == NULL:
            raise MemoryError()
        self.node_page = <uint8_t *> p
        self.node_cap = cap
        PyMem_Free(self.kslots)
        self.kcap = cap * 2
        self.kslots = <int32_t *> PyMem_Malloc(self.kcap * sizeof(int32_t))
        if self.kslots == NULL:
            raise MemoryError()
        memset(self.kslots, 0xff, self.kcap * sizeof(int32_t))
        self.kn = 0
        # re-insert the live nodes (bits != 0); free-listed ones are not in the table
        for i in range(self.node_top):
            if self.node_bits[i] != 0:
                self.kput_new(<int32_t>i)
        return 0

    cdef int32_t new_node(self, uint64_t k, uint64_t parent) except -2:
        cdef int32_t node
        if self.free_head >= 0:
            node = <int32_t>self.free_head
            self.free_head = <int64_t>self.node_parent[node] - 1
        else:
            if self.node_top == self.node_cap:
                self.grow_nodes()
            node = <int32_t>self.node_top
            self.node_top += 1
        self.node_key[node] = k
        self.node_parent[node] = parent
        self.node_bits[node] = 0
        self.node_page[node] = 0
        self.kput_new(node)
        return node

    # -- a node's engines -----------------------------------------------------------------------
    cdef inline bint holds(self, int32_t node, int e) noexcept:
        return holds_at(self.node_bits, self.node_page, node, e)

    cdef inline int holders(self, int32_t node) noexcept:
        """How many engines hold `node`."""
        cdef uint64_t b = self.node_bits[node]
        cdef uint8_t *x
        cdef uint64_t *xb
        cdef int j, c = 0
        if self.node_page[node] != EXT:
            return popcount(b)
        x = ext_of(b)
        xb = ext_bits(x)
        for j in range(x[0]):
            c += popcount(xb[j])
        return c

    cdef uint8_t *ext_new(self, int cap) except NULL:
        cdef uint8_t *x = <uint8_t *> PyMem_Malloc(ext_hdr(cap) + 8 * cap)
        if x == NULL:
            raise MemoryError()
        x[0] = 0
        x[1] = cap
        self.ext_bytes += ext_bytes_of(cap)
        return x

    cdef void ext_free(self, uint8_t *x) noexcept:
        self.ext_bytes -= ext_bytes_of(x[1])
        PyMem_Free(x)

    cdef int hold(self, int32_t node, int e) except -1:
        """Engine e holds `node` now (it did not)."""
        cdef uint64_t b = self.node_bits[node], bit = (<uint64_t>1) << (e & 63)
        cdef int pg = self.node_page[node], p = e >> 6, j, n
        cdef uint8_t *x
        cdef uint8_t *y
        cdef uint64_t *xb
        cdef uint64_t *yb
        if b == 0:
            self.node_page[node] = p
            self.node_bits[node] = bit
            return 0
        if pg == p:
            self.node_bits[node] = b | bit
            return 0
        if pg != EXT:  # a second page: the node's chunk
            x = self.ext_new(2)
            xb = ext_bits(x)
            x[0] = 2
            if pg < p:
                x[2], x[3], xb[0], xb[1] = pg, p, b, bit
            else:
                x[2], x[3], xb[0], xb[1] = p, pg, bit, b
            self.node_bits[node] = <uint64_t><uintptr_t>x
            self.node_page[node] = EXT
            self.ext_pages += 2
            return 0
        x = ext_of(b)
        n = x[0]
        xb = ext_bits(x)
        j = 0
        while j < n and x[2 + j] < p:
            j += 1
        if j < n and x[2 + j] == p:
            xb[j] |= bit
            return 0
        if n == x[1]:  # full: twice the pages
            y = self.ext_new(2 * n)
            yb = ext_bits(y)
            y[0] = n
            memcpy(y + 2, x + 2, n)
            memcpy(yb, xb, n * sizeof(uint64_t))
            self.ext_free(x)
            x, xb = y, yb
            self.node_bits[node] = <uint64_t><uintptr_t>x
        memmove(x + 3 + j, x + 2 + j, n - j)
        memmove(xb + j + 1, xb + j, (n - j) * sizeof(uint64_t))
        x[2 + j] = p
        xb[j] = bit
        x[0] = n + 1
        self.ext_pages += 1
        return 0

    cdef void unhold(self, int32_t node, int e) noexcept:
        """Engine e no longer holds `node` (it did)."""
        cdef uint64_t bit = (<uint64_t>1) << (e & 63)
        cdef int p = e >> 6, j, n
        cdef uint8_t *x
        cdef uint64_t *xb
        if self.node_page[node] != EXT:
            self.node_bits[node] &= ~bit
            return
        x = ext_of(self.node_bits[node])
        n = x[0]
        xb = ext_bits(x)
        j = 0
        while x[2 + j] != p:
            j += 1
        xb[j] &= ~bit
        if xb[j]:
            return
        memmove(x + 2 + j, x + 3 + j, n - j - 1)
        memmove(xb + j, xb + j + 1, (n - j - 1) * sizeof(uint64_t))
        n -= 1
        x[0] = n
        self.ext_pages -= 1
        if n == 1:  # one page left: inline again
            self.node_page[node] = x[2]
            self.node_bits[node] = xb[0]
            self.ext_pages -= 1
            self.ext_free(x)

    cdef inline void release_bit(self, int32_t node, int e) noexcept:
        cdef int c = self.holders(node)
        self.unhold(node, e)
        self.holdings -= 1
        if c == 2:
            self.duplicated -= 1
        elif c == 1:
            self.unique -= 1
            self.kdel_at(self.kfind(self.node_key[node]))
            self.node_parent[node] = <uint64_t>(self.free_head + 1)
            self.free_head = node

    cdef object mask_int(self, int32_t node):
        """The engines holding `node` as a Python int (bit e: engine e)."""
        cdef uint64_t b = self.node_bits[node]
        cdef uint8_t *x
        cdef uint64_t *xb
        cdef int j
        if self.node_page[node] != EXT:
            return (<object>b) << (64 * self.node_page[node])
        x = ext_of(b)
        xb = ext_bits(x)
        out = 0
        for j in range(x[0]):
            out |= (<object>xb[j]) << (64 * x[2 + j])
        return out

    def chunk_of(self, uint64_t key):
        """(pages, their bits, capacity) of an indexed block's chunk; None while its engines
        share a page (for the checks)."""
        cdef int32_t node = self.node_of(key)
        if node < 0 or self.node_page[node] != EXT:
            return None
        cdef uint8_t *x = ext_of(self.node_bits[node])
        return [x[2 + j] for j in range(x[0])], [ext_bits(x)[j] for j in range(x[0])], x[1]

    # -- keys -----------------------------------------------------------------------------------
    cdef uint64_t block_key(self, uint64_t parent, uint64_t lora, list tokens, Py_ssize_t start,
                            Py_ssize_t n) except? 0:
        cdef uint64_t h = mix64(parent ^ K1) ^ (lora * K2)
        cdef Py_ssize_t j
        cdef int64_t t
        cdef object obj
        for j in range(start, start + n):
            obj = <object>PyList_GET_ITEM(tokens, j)
            if not PyLong_CheckExact(obj):
                raise TypeError(f"token id {obj!r} is not an int")
            t = PyLong_AsLongLong(obj)
            h = (h ^ <uint64_t>t) * 0x100000001b3ULL
            h ^= h >> 29
        return nonzero(mix64(h + <uint64_t>n))

    def keys_of(self, list tokens, int block_size, lora_id=None) -> list:
        """The keys of the full blocks of `tokens` (a prompt), root first."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        cdef Py_ssize_t nb = len(tokens) // block_size, i
        cdef uint64_t k = 0, lora = 0 if lora_id is None else <uint64_t><int64_t>lora_id
        out = []
        for i in range(nb):
            k = self.block_key(k, lora, tokens, i * block_size, block_size)
            out.append(k)
        return out

    # -- applying an engine's events ------------------------------------------------------------
    def set_max_blocks(self, int e, int64_t n) -> None:
        """Engine e holds at most `n` blocks (its KV block count): a store past that is counted
        in `over_capacity_blocks` and not indexed."""
        self._check_engine(e)
        if n < 1:
            raise ValueError("max blocks must be positive")
        self.cap[e] = n

    def max_blocks_of(self, int e) -> int:
        self._check_engine(e)
        return self.cap[e]

    def block_size_refused_of(self, int e):
        """The last block size engine e's stores used that was not its own (None: none)."""
        self._check_engine(e)
        return self.bs_other[e] or None

    def apply(self, int e, list events, bint new_batch=True) -> int:
        """Apply one batch of normalised events (objects with `kind` 'stored' / 'removed' /
        'cleared', as kvevents.codec makes) of engine e. An event of another medium than the GPU
        goes to its tier's core (`tier_index`), one of a medium no tier names is counted in
        `other_medium` and skipped; an event that cannot be read (token ids that are not ints,
        hashes outside 64 bits) is counted in `malformed_events` and changes nothing. Returns the
        number of malformed events. `new_batch=False`: these events continue the last batch
        (a batch applied in parts), not counted as another."""
        self._check_engine(e)
        cdef int64_t *c = self.counters[e]
        cdef int bad = 0
        if new_batch:
            c[C_BATCHES] += 1
        cdef FleetCore core
        cdef dict others = None  # a tier's core -> the cores of the other tiers, this batch
        cdef tuple pp, made = None  # `peers` when `others` was filled (a new tier refills it)
        for ev in events:
            kind = ev.kind
            medium = ev.medium
            if kind == "cleared":
                if medium is None:  # vLLM's / SGLang's: the engine's whole cache, every tier
                    c[C_CLEARED_EV] += 1
                    self.clear(e)
                    for core in self.peers:
                        core.clear(e)
                    continue
            cont = getattr(ev, "cont", False)  # a later part of an event applied in parts
            core = self
            pp = self.peers
            if medium is not None and medium != "GPU":
                core = self._core_of(medium)
                if core is None:
                    if not cont:
                        c[C_OTHER_MEDIUM] += 1
                    continue
                if core is not self:
                    if others is None or made is not self.peers:
                        others, made = {}, self.peers
                    pp = others.get(core)
                    if pp is None:
                        pp = others[core] = (self,) + tuple([o for o in self.peers if o is not core])
            if core._apply_one(e, ev, kind, cont, pp):
                bad += 1
        return bad

    def tier_index(self, medium):
        """The core indexing `medium`'s tier (None: not indexed; the core alone indexes no
        other medium than the GPU's: kvevents.index.FleetIndex makes the tiers)."""
        return None

    cdef FleetCore _core_of(self, medium):
        """The core of `medium`'s tier (None: not indexed), as `tier_index` answers, remembered
        (for at most 64 media: a publisher naming ever new ones is asked each time)."""
        core = self.media.get(medium, False)
        if core is False:
            core = self.tier_index(medium)
            if len(self.media) < 64:
                self.media[medium] = core
        return core

    cdef int _apply_one(self, int e, ev, str kind, bint cont, tuple peers) except -1:
        """One stored / removed / (a tier's) cleared event on this core, `peers` the other
        tiers' cores; 1 when malformed."""
        cdef int64_t *c = self.counters[e]
        try:
            if kind == "stored":
                self._store(e, ev.block_hashes, ev.parent, ev.token_ids, ev.block_size,
                            ev.lora_id, not cont, peers)
            elif kind == "removed":
                self.remove(e, ev.block_hashes, not cont)
            elif kind == "cleared":
                c[C_CLEARED_EV] += 1
                self.clear(e)
        except (TypeError, ValueError, OverflowError):
            c[C_MALFORMED] += 1
            return 1
        return 0

    cpdef list store(self, int e, list hashes, parent, tokens=None, block_size=None,
                     lora_id=None):
        """Engine e cached `hashes`, a chain under its block `parent` (None: a root), holding
        `tokens` (all the blocks' token ids, or None). Returns the keys. Raises ValueError /
        TypeError / OverflowError on unreadable input, before changing anything."""
        self._check_engine(e)
        self._store(e, hashes, parent, tokens, block_size, lora_id, True, self.peers)
        return [self.scratch_k[i] for i in range(len(hashes))]

    cdef int _grow_scratch(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t cap = self.scratch_cap
        while cap < n:
            cap *= 2
        cdef void *p = PyMem_Realloc(self.scratch_h, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.scratch_h = <uint64_t *> p
        p = PyMem_Realloc(self.scratch_k, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.scratch_k = <uint64_t *> p
        self.scratch_cap = cap
        return 0

    cdef int _store(self, int e, list hashes, parent, tokens, block_size, lora_id,
                    bint new_event, tuple peers) except -1:
        cdef Py_ssize_t n = len(hashes), i
        cdef int64_t *c = self.counters[e]
        cdef HTable *t = &self.etab[e]
        cdef uint64_t pk, pk0, k, h, lora
        cdef int64_t slot
        cdef int32_t node, bs = 0
        cdef int c_held
        cdef bint by_tokens, orphan = False
        if n > self.scratch_cap:
            self._grow_scratch(n)
        cdef uint64_t *hs = self.scratch_h
        cdef uint64_t *ks = self.scratch_k
        lora = 0 if lora_id is None else <uint64_t><int64_t>lora_id
        by_tokens = tokens is not None and len(tokens) > 0
        if block_size is not None:
            bs = block_size
            # vLLM's offloading connector announces a block it has no payload for as one hash,
            # no tokens, block size 0: another tier's core takes it (resolved through `peers`)
            if bs < 0 or (bs == 0 and (by_tokens or self.tier_id == 0)):
                raise ValueError(f"block_size {bs}")
        if by_tokens:
            if type(tokens) is not list:
                raise TypeError("token_ids is not a list")
            if bs == 0 or len(tokens) != n * bs:
                raise ValueError(f"{len(tokens)} token ids for {n} blocks of {bs}")
        # Pass 1: the keys (reads only, so bad input changes nothing).
        for i in range(n):
            hs[i] = hashes[i]
        if parent is None:
            pk = 0
        else:
            h = parent
            slot = ht_find(t, h)
            if slot >= 0:
                pk = self.node_key[t.s[slot].val]
            elif peers and _peer_key(peers, e, h, &pk):
                pass  # the parent is held on another tier: the chain goes on under its key
            else:  # parent unknown here: a chain detached from the root, never matched from it
                pk = nonzero(mix64(ORPHAN ^ mix64(h + <uint64_t>e)))
                orphan = True
        pk0 = pk
        for i in range(n):
            if by_tokens:
                pk = self.block_key(pk, lora, tokens, i * bs, bs)
            elif not (peers and _peer_key(peers, e, hs[i], &pk)):
                pk = nonzero(mix64(FALLBACK ^ mix64(hs[i] ^ lora * K2)))
            ks[i] = pk
        if bs and self.bsize[e] and bs != self.bsize[e]:
            # the engine's blocks changed size mid-stream: these tokens would never match
            # the blocks it stored before, nor these the prompts it serves; counted, not indexed
            if new_event:
                c[C_STORED_EV] += 1
            c[C_BS_CHANGED] += n
            self.bs_other[e] = bs
            return 0
        # Pass 2: apply.
        if bs and self.bsize[e] == 0:
            self.bsize[e] = bs
        if new_event:
            c[C_STORED_EV] += 1
            if orphan:
                c[C_ORPHAN] += 1
        if not by_tokens:
            c[C_FALLBACK] += n
        pk = pk0
        for i in range(n):
            h = hs[i]
            k = ks[i]
            slot = ht_find(t, h)
            if slot >= 0:  # this engine stored the hash again: one more copy
                c[C_STORED_BL] += 1
                c[C_DUP] += 1
                ek = (e, h)
                self.extra[ek] = self.extra.get(ek, 0) + 1
                pk = k
                continue
            if self.held[e] >= self.cap[e]:  # past the engine's blocks: the rest of the chain
                c[C_OVER_CAP] += n - i
                break
            c[C_STORED_BL] += 1
            node = self.node_of(k)
            if node < 0:
                node = self.new_node(k, pk)
            if self.holds(node, e):
                mk = (node, e)
                self.multi[mk] = self.multi.get(mk, 0) + 1
            else:
                c_held = self.holders(node)
                if c_held:
                    c[C_RECOMPUTE] += 1
                    c[C_RECOMPUTE_TOK] += bs
                    if c_held == 1:
                        self.duplicated += 1
                else:
                    self.unique += 1
                self.hold(node, e)
                self.holdings += 1
            ht_put(t, h, node)
            self.held[e] += 1
            pk = k
        return 0

    cpdef int remove(self, int e, list hashes, bint new_event=True) except -1:
        """Engine e dropped one copy of each of `hashes`. A hash it does not hold is counted in
        `unknown_removes`. Returns the blocks it no longer holds."""
        self._check_engine(e)
        cdef int64_t *c = self.counters[e]
        cdef HTable *t = &self.etab[e]
        cdef uint64_t h
        cdef int64_t slot
        cdef int32_t node
        cdef int gone = 0
        for x in hashes:  # validate first: a bad hash changes nothing
            h = x
        if new_event:
            c[C_REMOVED_EV] += 1
        for x in hashes:
            h = x
            slot = ht_find(t, h)
            if slot < 0:
                c[C_UNKNOWN_RM] += 1
                continue
            c[C_REMOVED_BL] += 1
            if self.extra:
                ek = (e, h)
                n = self.extra.get(ek)
                if n is not None:
                    if n == 1:
                        del self.extra[ek]
                    else:
                        self.extra[ek] = n - 1
                    continue
            node = t.s[slot].val
            ht_del_at(t, slot)
            self.held[e] -= 1
            if self.multi:
                mk = (node, e)
                n = self.multi.get(mk)
                if n is not None:
                    if n == 1:
                        del self.multi[mk]
                    else:
                        self.multi[mk] = n - 1
                    continue
            self.release_bit(node, e)
            gone += 1
        return gone

    cpdef int clear(self, int e) except -1:
        """Engine e dropped everything (AllBlocksCleared, or a restart). Returns blocks dropped."""
        self._check_engine(e)
        cdef HTable *t = &self.etab[e]
        cdef int64_t i
        cdef int32_t node
        cdef int gone = 0
        self.epoch += 1
        for i in range(t.cap):
            node = t.s[i].val
            if node >= 0 and self.holds(node, e):
                self.release_bit(node, e)
                gone += 1
        memset(t.s, 0xff, t.cap * sizeof(Slot))
        t.n = 0
        self.held[e] = 0
        if self.extra:
            self.extra = {k: v for k, v in self.extra.items() if k[0] != e}
        if self.multi:
            self.multi = {k: v for k, v in self.multi.items() if k[1] != e}
        return gone

    # -- matching ---------------------------------------------------------------------------------
    cdef int among_set(self, ESet *a, among) except -1:
        """`a` = the engines of `among` (a bit mask; None: every engine) that exist."""
        cdef int q
        cdef bytes raw
        if among is None:
            memcpy(a.w, self.act_w, sizeof(self.act_w))
        else:
            raw = (among & ALL_ENGINES).to_bytes(PAGES * 8, "little")
            memcpy(a.w, <const char *>raw, sizeof(self.act_w))
            for q in range(PAGES):
                a.w[q] &= self.act_w[q]
        a.pm = 0
        for q in range(PAGES):
            if a.w[q]:
                a.pm |= (<uint32_t>1) << q
        return 0

    cdef int step(self, ESet *a, int32_t node, Py_ssize_t i, dict out) except -1:
        """a &= the engines holding `node` (-1: not indexed, none); those dropped score `i`
        blocks (left out when `i` is 0). Returns whether any engine is left."""
        cdef uint64_t b = 0, keep, d
        cdef uint64_t *xb
        cdef uint32_t m = a.pm
        cdef int q, pg = -1, j = 0, n
        cdef uint8_t *x
        if node >= 0:
            b = self.node_bits[node]
            pg = self.node_page[node]
        if pg != EXT:  # every holder in page pg (none when b is 0)
            while m:
                q = __builtin_ctz(m)
                m &= m - 1
                keep = a.w[q] & b if q == pg else 0
                d = a.w[q] ^ keep
                if d:
                    if i:
                        emit(out, q, d, i)
                    a.w[q] = keep
                    if not keep:
                        a.pm &= ~((<uint32_t>1) << q)
            return a.pm != 0
        x = ext_of(b)
        n = x[0]
        xb = ext_bits(x)
        while m:
            q = __builtin_ctz(m)
            m &= m - 1
            while j < n and x[2 + j] < q:
                j += 1
            keep = a.w[q] & xb[j] if j < n and x[2 + j] == q else 0
            d = a.w[q] ^ keep
            if d:
                if i:
                    emit(out, q, d, i)
                a.w[q] = keep
                if not keep:
                    a.pm &= ~((<uint32_t>1) << q)
        return a.pm != 0

    cdef int finish(self, ESet *a, Py_ssize_t blocks, dict out) except -1:
        cdef uint32_t m = a.pm
        cdef int q
        while m:
            q = __builtin_ctz(m)
            m &= m - 1
            emit(out, q, a.w[q], blocks)
        return 0

    cdef dict walk(self, list nodes, among):
        """Dynamo's find_matches over a chain of node ids (-1: not indexed): each engine of
        `among` scores the number of leading blocks it holds, engines with 0 left out."""
        cdef ESet a
        cdef Py_ssize_t i, n = len(nodes)
        cdef dict out = {}
        self.among_set(&a, among)
        if not a.pm:
            return out
        for i in range(n):
            if not self.step(&a, <int32_t>nodes[i], i, out):
                return out
        self.finish(&a, n, out)
        return out

    def match_keys(self, list keys, among=None) -> dict:
        """{engine: leading blocks held} for a chain of keys (engines holding none left out).
        `among`: the engines to score, as a bit mask (None: all)."""
        cdef list nodes = [self.node_of(<uint64_t>k) for k in keys]
        return self.walk(nodes, among) if keys else {}

    def match_tokens(self, list tokens, int block_size, lora_id=None, among=None) -> dict:
        """{engine: leading blocks held} for a prompt's token ids, in blocks of `block_size`
        (hashing and walking in one pass; stops where the last engine drops out). `among`: the
        engines to score, as a bit mask (None: all)."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        cdef Py_ssize_t nb = len(tokens) // block_size, i
        cdef uint64_t k = 0
        cdef uint64_t lora = 0 if lora_id is None else <uint64_t><int64_t>lora_id
        cdef ESet a
        cdef dict out = {}
        if nb == 0:
            return out
        self.among_set(&a, among)
        for i in range(nb):
            k = self.block_key(k, lora, tokens, i * block_size, block_size)
            if a.pm and not self.step(&a, self.node_of(k), i, out):
                return out
        self.finish(&a, nb, out)
        return out

    def match_hashes(self, int e, list hashes) -> dict:
        """{engine: leading blocks held} for a chain named by engine e's own hashes (a hash e
        does not hold ends the chain)."""
        self._check_engine(e)
        cdef HTable *t = &self.etab[e]
        cdef int64_t slot
        cdef list nodes = []
        for x in hashes:
            slot = ht_find(t, <uint64_t>x)
            if slot < 0:
                break
            nodes.append(t.s[slot].val)
        return self.walk(nodes, None) if nodes else {}

    # -- reading ----------------------------------------------------------------------------------
    def counters_of(self, int e) -> dict:
        self._check_engine(e)
        return {name: self.counters[e][i] for i, name in enumerate(COUNTERS)}

    def counter_totals(self) -> dict:
        """Every counter summed over the engines (O(engines), in C)."""
        cdef int64_t tot[N_COUNTERS]
        cdef int e, i
        memset(tot, 0, sizeof(tot))
        for e in range(MAX_ENGINES):
            if self.act_w[e >> 6] >> (e & 63) & 1:
                for i in range(N_COUNTERS):
                    tot[i] += self.counters[e][i]
        return {name: tot[i] for i, name in enumerate(COUNTERS)}

    def held_of(self, int e) -> int:
        """Distinct hashes engine e holds."""
        self._check_engine(e)
        return self.held[e]

    def block_size_of(self, int e):
        self._check_engine(e)
        return self.bsize[e] or None

    def engine_table(self, int e) -> dict:
        """Engine e's hash -> key table (O(held); for checks and the page)."""
        self._check_engine(e)
        cdef HTable *t = &self.etab[e]
        cdef int64_t i
        return {t.s[i].key: self.node_key[t.s[i].val] for i in range(t.cap) if t.s[i].val >= 0}

    def nodes(self):
        """(keys, parents, masks) of the live nodes: keys and parents as numpy uint64 arrays,
        masks as a list of ints (bit e: engine e holds the block). O(nodes); for checks."""
        cdef int64_t i, j = 0
        keys = np.empty(self.unique, dtype=np.uint64)
        parents = np.empty(self.unique, dtype=np.uint64)
        cdef list masks = []
        cdef uint64_t[:] kv = keys, pv = parents
        for i in range(self.node_top):
            if self.node_bits[i] != 0 and j < self.unique:
                kv[j] = self.node_key[i]
                pv[j] = self.node_parent[i]
                masks.append(self.mask_int(<int32_t>i))
                j += 1
        return keys, parents, masks

    def key_of(self, int e, uint64_t h):
        """The key engine e's hash `h` maps to, or None."""
        self._check_engine(e)
        cdef int64_t slot = ht_find(&self.etab[e], h)
        return self.node_key[self.etab[e].s[slot].val] if slot >= 0 else None

    def chain_of(self, uint64_t key, int max_blocks=1 << 16) -> list:
        """The keys from the root down to `key` along indexed parents (root first); it starts
        below the root when an ancestor is no longer indexed, and at the block met again when
        the parents loop (a parent-hash cycle). [] when `key` is not indexed."""
        cdef list out = []
        cdef set seen = set()
        cdef int32_t node = self.node_of(key)
        while node >= 0 and len(out) < max_blocks and node not in seen:
            seen.add(node)
            out.append(self.node_key[node])
            if self.node_parent[node] == 0:
                break
            node = self.node_of(self.node_parent[node])
        out.reverse()
        return out

    def snapshot(self, out=None):
        """Copies of what a layout reads: node keys, parents and engines (node ids 0..top; a node
        held across pages has its pages copied into two flat arrays, its `bits` entry then
        `offset << 8 | pages`) and the key table, for `layout_of` to work on without the index
        (off the lock, in another thread). `out`, an earlier snapshot (or `snapshot_buffers`),
        has its arrays reused when they fit. O(nodes) at about memcpy speed."""
        cdef int64_t n = self.node_top, kc = self.kcap, xn = self.ext_pages, i, o = 0
        sizes = (n, kc, xn)
        if out is None or not snapshot_fits(out, sizes):
            out = snapshot_buffers(sizes, 0)
        keys, parents, bits, pages, slots, _n, xpages, xbits = out
        cdef uint64_t[::1] kv = keys, pv = parents, bv = bits, xbv = xbits
        cdef uint8_t[::1] pgv = pages, xpv = xpages
        cdef int32_t[::1] sv = slots
        cdef uint8_t *x
        cdef uint64_t *xb
        cdef uint64_t b
        cdef int j, c
        if n:
            memcpy(&kv[0], self.node_key, n * sizeof(uint64_t))
            memcpy(&pv[0], self.node_parent, n * sizeof(uint64_t))
            memcpy(&bv[0], self.node_bits, n * sizeof(uint64_t))
            memcpy(&pgv[0], self.node_page, n * sizeof(uint8_t))
        memcpy(&sv[0], self.kslots, kc * sizeof(int32_t))
        if xn:
            for i in range(n):
                b = self.node_bits[i]
                if self.node_page[i] == EXT and b != 0:
                    x = ext_of(b)
                    xb = ext_bits(x)
                    c = x[0]
                    for j in range(c):
                        xpv[o + j] = x[2 + j]
                        xbv[o + j] = xb[j]
                    bv[i] = (<uint64_t>o << 8) | <uint64_t>c
                    o += c
        return (keys, parents, bits, pages, slots, n, xpages, xbits)

    def snapshot_sizes(self) -> tuple:
        """(nodes, key table slots, chunk pages) a snapshot copies now: to reserve its buffers
        beforehand (`snapshot_buffers`)."""
        return self.node_top, self.kcap, self.ext_pages

    def layout(self, int divisor=GROUP_DIVISOR, int min_group=MIN_GROUP):
        """`layout_of(self.snapshot())`: every live node's root, colour group and engines, and
        the parent-hash cycles. O(nodes + holdings)."""
        return layout_of(self.snapshot(), divisor, min_group)

    def parent_of(self, uint64_t key):
        """The parent key of an indexed block (0: a root), or None when `key` is not indexed."""
        cdef int32_t node = self.node_of(key)
        return self.node_parent[node] if node >= 0 else None

    def mask_of(self, uint64_t key) -> int:
        """The engines holding `key`, as a bit mask (0: not indexed)."""
        cdef int32_t node = self.node_of(key)
        return self.mask_int(node) if node >= 0 else 0

    def table_size(self) -> int:
        """Keys in the key table (equals `unique` while the index is consistent)."""
        return self.kn

    def memory_bytes(self) -> int:
        """Bytes held by the compiled arrays, tables and chunks (not the rare-case dicts)."""
        cdef int64_t total = self.node_cap * (3 * 8 + 1) + self.kcap * 4 + self.ext_bytes
        cdef int e
        for e in range(MAX_ENGINES):
            total += self.etab[e].cap * 12
        return total


MAX_FLEET_ENGINES = MAX_ENGINES


cdef bint _peer_key(tuple peers, int e, uint64_t h, uint64_t *out) noexcept:
    """The key engine e's hash `h` has on another tier (the first of `peers` holding it)."""
    cdef FleetCore p
    cdef int64_t slot
    for p in peers:
        if p.etab[e].s != NULL:
            slot = ht_find(&p.etab[e], h)
            if slot >= 0:
                out[0] = p.node_key[p.etab[e].s[slot].val]
                return True
    return False


# -- matching across tiers -------------------------------------------------------------------------
cdef int32_t *_nodes_along(list cores, list keys, Py_ssize_t *reach, bint cut=True) except NULL:
    """Every core's node id of each key (-1: not indexed there), row c * n + i, up to the
    first key no core indexes when `cut` (`reach`: how many keys that is). Free with
    PyMem_Free."""
    cdef Py_ssize_t n = len(keys), nc = len(cores), i, c
    cdef int32_t *out = <int32_t *> PyMem_Malloc(max(n * nc, 1) * sizeof(int32_t))
    cdef FleetCore core
    cdef uint64_t k
    cdef bint any_
    if out == NULL:
        raise MemoryError()
    reach[0] = n
    for i in range(n):
        k = keys[i]
        any_ = False
        for c in range(nc):
            core = cores[c]
            out[c * n + i] = core.node_of(k)
            any_ = any_ or out[c * n + i] >= 0
        if cut and not any_:
            reach[0] = i
            break
    return out


cdef int _holders_of(FleetCore core, int32_t node, uint64_t *w) except -1:
    """w |= the engines holding `node` (page-wise)."""
    cdef uint64_t b
    cdef uint8_t *x
    cdef int j
    if node < 0:
        return 0
    b = core.node_bits[node]
    if core.node_page[node] != EXT:
        w[core.node_page[node]] |= b
        return 0
    x = ext_of(b)
    for j in range(x[0]):
        w[x[2 + j]] |= ext_bits(x)[j]
    return 0


def match_tiers(list cores, list keys, among=None, weights=None) -> dict:
    """llm-d's LongestPrefixScorer over tiers: {engine: [blocks per core]} for every engine of
    `among` (a bit mask; None: all) holding the chain's first block in some core: its longest
    run of the chain from block 0 held in any core, each block counted for the first core (in
    the order given, best weight first) holding it; with `weights` (one per core), {engine:
    the sum of its blocks' weights} instead. The cores are one fleet's tiers (the same engine
    ids). O(engines holding block 0 x run x cores)."""
    cdef Py_ssize_t n = len(keys), nc = len(cores), reach, i, c
    cdef FleetCore first, core
    cdef uint64_t w[PAGES]
    cdef uint64_t act[PAGES]
    cdef uint64_t m
    cdef int q, e
    cdef int64_t cnt[16]
    cdef double wt[16]
    cdef double score
    cdef uint64_t *nb[16]
    cdef uint8_t *npg[16]
    cdef bytes raw
    cdef dict out = {}
    if n == 0 or nc == 0:
        return out
    if nc > 16:
        raise ValueError("at most 16 cores")
    if weights is not None:
        if len(weights) != nc:
            raise ValueError("one weight per core")
        for c in range(nc):
            wt[c] = weights[c]
    first = cores[0]
    cdef int32_t *nodes = _nodes_along(cores, keys, &reach)
    try:
        if reach == 0:
            return out
        memset(w, 0, sizeof(w))
        for c in range(nc):
            core = cores[c]
            nb[c], npg[c] = core.node_bits, core.node_page
            _holders_of(core, nodes[c * n], w)
        if among is None:
            memcpy(act, first.act_w, sizeof(act))
        else:
            raw = (among & ALL_ENGINES).to_bytes(PAGES * 8, "little")
            memcpy(act, <const char *>raw, sizeof(act))
        for q in range(PAGES):
            m = w[q] & act[q] & first.act_w[q]
            while m:
                e = (q << 6) + __builtin_ctzll(m)
                m &= m - 1
                memset(cnt, 0, sizeof(cnt))
                for i in range(reach):
                    for c in range(nc):
                        if nodes[c * n + i] >= 0 and holds_at(nb[c], npg[c], nodes[c * n + i], e):
                            cnt[c] += 1
                            break
                    else:
                        break
                if weights is None:
                    out[e] = [cnt[c] for c in range(nc)]
                else:
                    score = 0.0
                    for c in range(nc):
                        score += cnt[c] * wt[c]
                    out[e] = score
        return out
    finally:
        PyMem_Free(nodes)


def continue_runs(FleetCore core, list keys, dict starts) -> dict:
    """Dynamo's lower-tier walk over one tier: {engine: blocks} each engine of `starts`
    ({engine: position}) holds in `core` from its position on, consecutively; an engine not in
    `starts` that holds the chain's first block here starts at 0 (Dynamo's root workers).
    Engines of `starts` with no block here score 0."""
    cdef Py_ssize_t n = len(keys), reach, i
    cdef uint64_t w[PAGES]
    cdef uint64_t m
    cdef int q, e
    cdef dict out = {}
    cdef int32_t *nodes = _nodes_along([core], keys, &reach, False)
    try:
        pos = dict(starts)
        if reach and nodes[0] >= 0:
            memset(w, 0, sizeof(w))
            _holders_of(core, nodes[0], w)
            for q in range(PAGES):
                m = w[q] & core.act_w[q]
                while m:
                    e = (q << 6) + __builtin_ctzll(m)
                    m &= m - 1
                    if e not in pos:
                        pos[e] = 0
        for e_obj, p in pos.items():
            e = e_obj
            i = p
            if 0 <= e < MAX_ENGINES and core._active(e):
                while 0 <= i < reach and nodes[i] >= 0 and core.holds(nodes[i], e):
                    i += 1
            out[e_obj] = max(i - p, 0)
        return out
    finally:
        PyMem_Free(nodes)


def snapshot_buffers(sizes, int headroom=8):
    """Zeroed (so paged in) arrays for a snapshot of `sizes` (`FleetCore.snapshot_sizes()`),
    with 1/`headroom` more room to grow (0: none)."""
    nodes, slots, xpages = sizes
    cap = max(nodes + (nodes // headroom if headroom else 0), 1)
    xcap = max(xpages + (xpages // headroom if headroom else 0), 1)
    return (np.zeros(cap, dtype=np.uint64), np.zeros(cap, dtype=np.uint64),
            np.zeros(cap, dtype=np.uint64), np.zeros(cap, dtype=np.uint8),
            np.full(slots, -1, dtype=np.int32), 0,
            np.zeros(xcap, dtype=np.uint8), np.zeros(xcap, dtype=np.uint64))


def snapshot_fits(snap, sizes) -> bool:
    """Whether the arrays of `snap` take a snapshot of `sizes`."""
    nodes, slots, xpages = sizes
    return (snap is not None and snap[0].shape[0] >= nodes and snap[4].shape[0] == slots
            and snap[6].shape[0] >= xpages)


# -- the block map: roots, colour groups and cycles, over a snapshot -----------------------------
class Layout(tuple):
    """`layout_of`'s answer. Per live node, in node-id order (as `FleetCore.nodes()`): `keys`,
    `roots` (the first block of its chain along indexed parents), `groups` (the key of its
    colour group's top block; 0: the shared trunk) and `sets` (a 64-bit hash of the set of
    engines holding it: equal sets, equal hashes). Its engines, ascending: `engines[holders[j]:
    holders[j + 1]]`; engine e's nodes, ascending: `positions[by_engine[e]:by_engine[e + 1]]`.
    `cycle_blocks[e]`: blocks in parent-hash cycles that engine e holds; `cycles`: how many
    cycles; `max_group`: the bound on a group's blocks."""

    __slots__ = ()

    def __new__(cls, *values):
        return tuple.__new__(cls, values)

    keys = property(lambda self: self[0])
    roots = property(lambda self: self[1])
    groups = property(lambda self: self[2])
    sets = property(lambda self: self[3])
    holders = property(lambda self: self[4])
    engines = property(lambda self: self[5])
    by_engine = property(lambda self: self[6])
    positions = property(lambda self: self[7])
    cycle_blocks = property(lambda self: self[8])
    cycles = property(lambda self: self[9])
    max_group = property(lambda self: self[10])

    def engines_of(self, int j) -> list:
        """The engines holding the `j`-th live node, ascending."""
        return self[5][self[4][j]:self[4][j + 1]].tolist()


cdef inline int32_t snap_node_of(const uint64_t[::1] keys, const int32_t[::1] slots,
                                 uint64_t kmask, uint64_t k) noexcept nogil:
    cdef uint64_t i = mix64(k) & kmask
    cdef int32_t v
    while True:
        v = slots[i]
        if v < 0:
            return -1
        if keys[v] == k:
            return v
        i = (i + 1) & kmask


def layout_of(snap, int divisor=GROUP_DIVISOR, int min_group=MIN_GROUP):
    """Roots, colour groups, engines and parent-hash cycles of a `FleetCore.snapshot()`, as a
    `Layout`. Runs without the GIL and is O(nodes + holdings) whatever the parents say: every
    walk up marks the nodes it meets, so it ends at a node already placed, at a root, or at a
    node met again on this walk. That is a cycle: the last block met (whose parent is that node)
    is cut to a root, so each cycle is found and counted once.

    Groups: a block's group is the topmost block above it (itself included) whose subtree holds
    at most `max(live blocks // divisor, min_group)` blocks; blocks above every such subtree (a
    trunk all requests share, such as one common first block) are the shared group, 0."""
    keys_a, parents_a, bits_a, pages_a, slots_a, n_obj, xpages_a, xbits_a = snap
    if divisor <= 0 or min_group <= 0:
        raise ValueError("divisor and min_group must be positive")
    cdef int64_t n = n_obj, i, k, q, sp, live = 0, j = 0, held = 0, o, h
    cdef const uint64_t[::1] keys = keys_a
    cdef const uint64_t[::1] parents = parents_a
    cdef const uint64_t[::1] bits = bits_a
    cdef const uint8_t[::1] pages = pages_a
    cdef const int32_t[::1] slots = slots_a
    cdef const uint8_t[::1] xpages = xpages_a
    cdef const uint64_t[::1] xbits = xbits_a
    cdef uint64_t kmask = <uint64_t>(slots_a.shape[0] - 1), m, sh
    cap = max(n, 1)
    pidx_a = np.empty(cap, dtype=np.int32)
    depth_a = np.empty(cap, dtype=np.int32)
    mark_a = np.empty(cap, dtype=np.int32)
    stack_a = np.empty(cap + 1, dtype=np.int32)
    size_a = np.empty(cap, dtype=np.int32)
    incyc_a = np.zeros(cap, dtype=np.uint8)
    cyc_a = np.zeros(MAX_ENGINES, dtype=np.int64)
    by_a = np.zeros(MAX_ENGINES + 1, dtype=np.int64)
    out_keys = np.empty(cap, dtype=np.uint64)
    out_roots = np.empty(cap, dtype=np.uint64)
    out_groups = np.empty(cap, dtype=np.uint64)
    out_sets = np.empty(cap, dtype=np.uint64)
    out_hold = np.empty(cap + 1, dtype=np.int64)
    cdef int32_t[::1] pidx = pidx_a, depth = depth_a, mark = mark_a, stack = stack_a
    cdef int32_t[::1] size = size_a
    cdef uint8_t[::1] incyc = incyc_a
    cdef int64_t[::1] cyc = cyc_a, by = by_a, hold = out_hold
    cdef uint64_t[::1] ok = out_keys, orr = out_roots, og = out_groups, osets = out_sets
    # after the walks, mark holds the depth order and stack the counting sort's counts
    cdef int32_t[::1] order = mark, cnt = stack
    cdef int32_t x, p, base, maxd = -1
    cdef int64_t cycles = 0, bound
    cdef int e, c, t, pg
    with nogil:
        for i in range(n):
            pidx[i] = -1
            depth[i] = -1
            mark[i] = -1
            if bits[i] != 0:
                live += 1
                if parents[i] != 0:
                    pidx[i] = snap_node_of(keys, slots, kmask, parents[i])
                # holdings: engine e's count into by[e + 1]
                if pages[i] != EXT:
                    c, o = 1, -1
                else:
                    c, o = <int>(bits[i] & 0xff), <int64_t>(bits[i] >> 8)
                for t in range(c):
                    if o < 0:
                        pg, m = pages[i], bits[i]
                    else:
                        pg, m = xpages[o + t], xbits[o + t]
                    held += popcount(m)
                    while m:
                        by[(pg << 6) + __builtin_ctzll(m) + 1] += 1
                        m &= m - 1
        bound = live // divisor
        if bound < min_group:
            bound = min_group
        # depths: walk up to a placed node, a root, or a node met again on this walk (a cycle)
        for i in range(n):
            if bits[i] == 0 or depth[i] >= 0:
                continue
            sp = 0
            x = <int32_t>i
            while True:
                if depth[x] >= 0:
                    base = depth[x]
                    break
                if mark[x] == i:
                    k = sp - 1
                    while stack[k] != x:
                        k -= 1
                    for q in range(k, sp):
                        incyc[stack[q]] = 1
                    cycles += 1
                    pidx[stack[sp - 1]] = -1
                    base = -1
                    break
                mark[x] = <int32_t>i
                stack[sp] = x
                sp += 1
                p = pidx[x]
                if p < 0:
                    base = -1
                    break
                x = p
            for k in range(sp - 1, -1, -1):
                base += 1
                depth[stack[k]] = base
            if base > maxd:
                maxd = base
        # live nodes by depth (a counting sort), then subtree sizes from the deepest up
        for k in range(maxd + 2):
            cnt[k] = 0
        for i in range(n):
            if bits[i] != 0:
                cnt[depth[i] + 1] += 1
        for k in range(1, maxd + 2):
            cnt[k] += cnt[k - 1]
        for i in range(n):
            if bits[i] != 0:
                order[cnt[depth[i]]] = <int32_t>i
                cnt[depth[i]] += 1
                size[i] = 1
        for k in range(live - 1, -1, -1):
            x = order[k]
            if pidx[x] >= 0:
                size[pidx[x]] += size[x]
        # top down: each node's root (into depth) and group (into size; -1: shared)
        for k in range(live):
            x = order[k]
            p = pidx[x]
            if p < 0:
                depth[x] = x
                size[x] = x if size[x] <= bound else -1
            else:
                depth[x] = depth[p]
                size[x] = size[p] if size[p] >= 0 else (x if size[x] <= bound else -1)
        for e in range(MAX_ENGINES):
            by[e + 1] += by[e]
    eng_a = np.empty(max(held, 1), dtype=np.int16)
    pos_a = np.empty(max(held, 1), dtype=np.int32)
    cur_a = by_a[:MAX_ENGINES].copy()
    cdef int16_t[::1] eng = eng_a
    cdef int32_t[::1] pos = pos_a
    cdef int64_t[::1] cur = cur_a
    h = 0
    with nogil:
        for i in range(n):
            if bits[i] == 0:
                continue
            ok[j] = keys[i]
            orr[j] = keys[depth[i]]
            og[j] = keys[size[i]] if size[i] >= 0 else 0
            hold[j] = h
            sh = 0
            if pages[i] != EXT:
                c, o = 1, -1
            else:
                c, o = <int>(bits[i] & 0xff), <int64_t>(bits[i] >> 8)
            for t in range(c):
                if o < 0:
                    pg, m = pages[i], bits[i]
                else:
                    pg, m = xpages[o + t], xbits[o + t]
                while m:
                    e = (pg << 6) + __builtin_ctzll(m)
                    m &= m - 1
                    eng[h] = <int16_t>e
                    h += 1
                    pos[cur[e]] = <int32_t>j
                    cur[e] += 1
                    sh += mix64(<uint64_t>e ^ SET_SALT)
                    if incyc[i]:
                        cyc[e] += 1
            osets[j] = sh
            j += 1
        hold[j] = h
    return Layout(out_keys[:j], out_roots[:j], out_groups[:j], out_sets[:j], out_hold[:j + 1],
                  eng_a[:h], by_a, pos_a[:h], cyc_a, cycles, bound)


cdef int _cmp_i64(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0], y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef int64_t _write_list(const int64_t* v, int64_t k, char* out) noexcept nogil:
    """`v[:k]` (each >= 0) as a JSON list into `out`; returns the bytes written."""
    cdef int64_t w = 0, i, x, d
    cdef char digits[24]
    out[w] = b'['
    w += 1
    for i in range(k):
        if i:
            out[w] = b','
            w += 1
        x = v[i]
        d = 0
        while True:
            digits[d] = <char>(48 + x % 10)
            d += 1
            x //= 10
            if x == 0:
                break
        while d:
            d -= 1
            out[w] = digits[d]
            w += 1
    out[w] = b']'
    return w + 1


def engine_color_lists(colors_a, positions_a, by_engine_a, eids, int64_t limit):
    """The block map's lists (kvevents/block_map.py), written without the GIL: per engine id of
    `eids`, (the blocks it holds, the colours of its first `limit` blocks by colour, ascending,
    as a JSON list in bytes): engine e's colours are `colors[positions[by_engine[e]:
    by_engine[e + 1]]]` (each >= 0), as a `Layout` gives them."""
    cdef const int64_t[::1] colors = colors_a
    cdef const int32_t[::1] pos = positions_a
    cdef const int64_t[::1] by = by_engine_a
    cdef int64_t a, b, n, k, i, w, most = 0
    cdef int e
    if limit < 0:
        raise ValueError("limit must be >= 0")
    ids = [int(x) for x in eids]
    for e in ids:
        if not 0 <= e < by.shape[0] - 1:
            raise ValueError(f"engine id {e} is outside the layout")
        most = max(most, by[e + 1] - by[e])
    cdef int64_t* tmp = <int64_t*>PyMem_Malloc(max(most, 1) * sizeof(int64_t))
    cdef char* buf = <char*>PyMem_Malloc(max(min(most, limit), 1) * 21 + 2)
    if tmp == NULL or buf == NULL:
        PyMem_Free(tmp)
        PyMem_Free(buf)
        raise MemoryError()
    out = []
    try:
        for e in ids:
            a, b = by[e], by[e + 1]
            n = b - a
            k = min(n, limit)
            with nogil:
                for i in range(n):
                    tmp[i] = colors[pos[a + i]]
                qsort(tmp, <size_t>n, sizeof(int64_t), _cmp_i64)
                w = _write_list(tmp, k, buf)
            out.append((n, PyBytes_FromStringAndSize(buf, w)))
    finally:
        PyMem_Free(tmp)
        PyMem_Free(buf)
    return out
