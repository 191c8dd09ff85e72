# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""FleetCore: one prefix index over the cached blocks of many engines (at most 64).

Engines name the same tokens with different block hashes (vLLM seeds its root hash per process,
SGLang hashes its own way), so a block is keyed here by its content: `key = H(parent key, lora,
the block's token ids)`, chained from the root (key 0). Each engine keeps a table from its own
hashes to these keys (the two-key design of llm-d's kvblock index), through which its removes
and the parents of its stores are resolved. A store that carries no token ids falls back to a
key made from the engine's own hash (`H(FALLBACK, hash)`): engines that hash alike still share
those, engines that do not, never do.

Per indexed block (a "node", in flat arrays grown by doubling; no Python object per block):
`node_key` (u64), `node_parent` (the parent's key, 0 for a root), `node_mask` (u64: bit e set
while engine e holds the block). Keys map to nodes through an open-addressing table of int32
node ids (linear probing, backward-shift deletion, load <= 3/4) that compares `node_key[id]`;
each engine's table maps its hashes to node ids the same way with the hash in the slot.

A node lives while some engine holds it. Engine e holds node n while one of its hashes maps to
n; a second hash of e mapping to the same node (rare: the same tokens under different extra
keys) is counted in `multi[(n, e)]`, and a hash stored again while held (vLLM does not
de-duplicate) in `extra[(e, hash)]`, so every remove drops exactly one copy.

Invariants (checked by `FleetIndex.check`): the key table holds exactly the live nodes; a live
node's mask is non-zero and has bit e iff engine e's table maps some hash to it; `unique`,
`duplicated` and `holdings` equal the counts over the masks.
"""

cimport cython
from cpython.list cimport PyList_GET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memset

import numpy as np

cdef uint64_t FALLBACK = 0x6b7673636f706531ULL
cdef uint64_t ORPHAN = 0x6f727068616e6564ULL
cdef uint64_t K1 = 0x9e3779b97f4a7c15ULL
cdef uint64_t K2 = 0xff51afd7ed558ccdULL

COUNTERS = ("batches", "stored_events", "removed_events", "cleared_events", "stored_blocks",
            "removed_blocks", "duplicate_stores", "unknown_removes", "orphan_stores",
            "fallback_blocks", "other_medium", "malformed_events", "cross_engine_recomputes",
            "recompute_tokens", "over_capacity_blocks", "block_size_changes")
cdef enum:
    MAX_ENGINES = 64
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


cdef inline uint64_t mix64(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL
    return z ^ (z >> 31)


cdef inline uint64_t nonzero(uint64_t k) noexcept nogil:
    return k if k != 0 else 1  # 0 is the root's key


cdef inline void set_for_engines(dict out, uint64_t engines, Py_ssize_t blocks):
    """out[e] = blocks for every engine e in the mask `engines` (a match's answer)."""
    cdef int e
    for e in range(MAX_ENGINES):
        if engines >> e & 1:
            out[e] = blocks


cdef inline int popcount(uint64_t m) noexcept nogil:
    return __builtin_popcountll(m)


cdef extern from *:
    int __builtin_popcountll(unsigned long long) nogil


# -- engine tables: hash -> node id, open addressing ---------------------------------------------
cdef struct HTable:
    uint64_t *keys
    int32_t *vals   # -1: empty
    int64_t cap     # a power of two
    int64_t n


cdef int ht_init(HTable *t, int64_t cap) except -1:
    t.keys = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
    t.vals = <int32_t *> PyMem_Malloc(cap * sizeof(int32_t))
    if t.keys == NULL or t.vals == NULL:
        raise MemoryError()
    memset(t.vals, 0xff, cap * sizeof(int32_t))
    t.cap = cap
    t.n = 0
    return 0


cdef void ht_free(HTable *t) noexcept:
    PyMem_Free(t.keys)
    PyMem_Free(t.vals)
    t.keys = NULL
    t.vals = NULL
    t.cap = 0
    t.n = 0


cdef inline int64_t ht_find(HTable *t, uint64_t k) noexcept nogil:
    cdef int64_t mask = t.cap - 1
    cdef int64_t i = <int64_t>(mix64(k) & <uint64_t>mask)
    while t.vals[i] >= 0:
        if t.keys[i] == k:
            return i
        i = (i + 1) & mask
    return -1


cdef int ht_grow(HTable *t) except -1:
    cdef HTable old = t[0]
    cdef int64_t i
    ht_init(t, old.cap * 2)
    for i in range(old.cap):
        if old.vals[i] >= 0:
            ht_put_new(t, old.keys[i], old.vals[i])
    ht_free(&old)
    return 0


cdef inline void ht_put_new(HTable *t, uint64_t k, int32_t v) noexcept nogil:
    """Insert a key known to be absent (the caller keeps the load under 3/4)."""
    cdef int64_t mask = t.cap - 1
    cdef int64_t i = <int64_t>(mix64(k) & <uint64_t>mask)
    while t.vals[i] >= 0:
        i = (i + 1) & mask
    t.keys[i] = k
    t.vals[i] = v
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
        if t.vals[j] < 0:
            break
        home = <int64_t>(mix64(t.keys[j]) & <uint64_t>mask)
        # move j back into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (home <= i or home > j)) or (j < i and (home <= i and home > j)):
            t.keys[i] = t.keys[j]
            t.vals[i] = t.vals[j]
            i = j
    t.vals[i] = -1
    t.n -= 1


cdef class FleetCore:
    """The compiled index; `kvevents.index.FleetIndex` adds names and the checks."""

    cdef uint64_t *node_key
    cdef uint64_t *node_parent
    cdef uint64_t *node_mask
    cdef int64_t free_head     # first free node id (-1: none); a free node's parent is the next
    cdef int64_t node_cap
    cdef int64_t node_top      # nodes ever handed out from the bump pointer
    # key -> node id: slots hold node ids only (-1 empty); the key is node_key[id]
    cdef int32_t *kslots
    cdef int64_t kcap
    cdef int64_t kn
    cdef HTable etab[MAX_ENGINES]
    cdef public uint64_t active      # bit e: engine e exists
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

    def __cinit__(self, int64_t capacity=1024, *args, **kwargs):
        self._alloc(capacity)
        memset(self.counters, 0, sizeof(self.counters))
        memset(self.held, 0, sizeof(self.held))
        memset(self.bsize, 0, sizeof(self.bsize))
        memset(self.bs_other, 0, sizeof(self.bs_other))
        memset(self.etab, 0, sizeof(self.etab))
        self.extra = {}
        self.multi = {}

    cdef int _alloc(self, int64_t capacity) except -1:
        cdef int64_t cap = 16
        while cap < capacity:
            cap *= 2
        self.node_cap = cap
        self.node_top = 0
        self.node_key = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.node_parent = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.node_mask = <uint64_t *> PyMem_Malloc(cap * sizeof(uint64_t))
        self.free_head = -1
        self.kcap = cap * 2
        self.kn = 0
        self.kslots = <int32_t *> PyMem_Malloc(self.kcap * sizeof(int32_t))
        if (self.node_key == NULL or self.node_parent == NULL or self.node_mask == NULL
                or self.kslots == NULL):
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
        for e in range(MAX_ENGINES):
            if self.etab[e].keys != NULL:
                ht_free(&self.etab[e])
        PyMem_Free(self.node_key)
        PyMem_Free(self.node_parent)
        PyMem_Free(self.node_mask)
        PyMem_Free(self.kslots)
        PyMem_Free(self.scratch_h)
        PyMem_Free(self.scratch_k)
        self.node_key = self.node_parent = self.node_mask = NULL
        self.kslots = NULL
        self.scratch_h = self.scratch_k = NULL

    def release(self) -> None:
        """Free every array now (a deleted fleet's memory goes back at once, whoever still
        holds the object) and start over empty, with no engines."""
        self._free()
        self.active = 0
        self.unique = self.duplicated = self.holdings = 0
        memset(self.held, 0, sizeof(self.held))
        self.extra = {}
        self.multi = {}
        self._alloc(16)
        self.epoch += 1

    # -- engines ------------------------------------------------------------------------------
    def add_engine(self, int e) -> None:
        if not 0 <= e < MAX_ENGINES:
            raise ValueError(f"engine id {e} outside 0..{MAX_ENGINES - 1}")
        if self.active >> e & 1:
            raise ValueError(f"engine id {e} is taken")
        ht_init(&self.etab[e], 64)
        self.epoch += self._changes_of(e) + 1  # its counters restart at 0: the version must not
        memset(self.counters[e], 0, sizeof(self.counters[e]))
        self.held[e] = 0
        self.bsize[e] = 0
        self.bs_other[e] = 0
        self.cap[e] = DEFAULT_ENGINE_BLOCKS
        self.active |= (<uint64_t>1) << e

    def drop_engine(self, int e) -> None:
        """Forget engine e and everything it held."""
        self._check_engine(e)
        self.clear(e)
        self.epoch += 1
        ht_free(&self.etab[e])
        self.active &= ~((<uint64_t>1) << e)

    cdef int _check_engine(self, int e) except -1:
        if not (0 <= e < MAX_ENGINES and self.active >> e & 1):
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
        p = PyMem_Realloc(self.node_mask, cap * sizeof(uint64_t))
        if p == NULL:
            raise MemoryError()
        self.node_mask = <uint64_t *> p
        self.node_cap = cap
        PyMem_Free(self.kslots)
        self.kcap = cap * 2
        self.kslots = <int32_t *> PyMem_Malloc(self.kcap * sizeof(int32_t))
        if self.kslots == NULL:
            raise MemoryError()
        memset(self.kslots, 0xff, self.kcap * sizeof(int32_t))
        self.kn = 0
        # re-insert the live nodes (mask != 0); free-listed ones are not in the table
        for i in range(self.node_top):
            if self.node_mask[i] != 0:
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
        self.node_mask[node] = 0
        self.kput_new(node)
        return node

    cdef inline void release_bit(self, int32_t node, uint64_t bit) noexcept:
        cdef uint64_t m = self.node_mask[node]
        cdef int c = popcount(m)
        m &= ~bit
        self.node_mask[node] = m
        self.holdings -= 1
        if c == 2:
            self.duplicated -= 1
        elif c == 1:
            self.unique -= 1
            self.kdel_at(self.kfind(self.node_key[node]))
            self.node_parent[node] = <uint64_t>(self.free_head + 1)
            self.free_head = node

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
        'cleared', as kvevents.codec makes) of engine e. Events of another medium (a CPU offload
        tier) are counted and skipped; an event that cannot be read (token ids that are not ints,
        hashes outside 64 bits) is counted in `malformed_events` and changes nothing. Returns the
        number of malformed events. `new_batch=False`: these events continue the last batch
        (a batch applied in parts), not counted as another."""
        self._check_engine(e)
        cdef int64_t *c = self.counters[e]
        cdef int bad = 0
        if new_batch:
            c[C_BATCHES] += 1
        for ev in events:
            kind = ev.kind
            if kind == "cleared":
                c[C_CLEARED_EV] += 1
                self.clear(e)
                continue
            medium = ev.medium
            cont = getattr(ev, "cont", False)  # a later part of an event applied in parts
            if medium is not None and medium != "GPU":
                if not cont:
                    c[C_OTHER_MEDIUM] += 1
                continue
            try:
                if kind == "stored":
                    self._store(e, ev.block_hashes, ev.parent, ev.token_ids, ev.block_size,
                                ev.lora_id, not cont)
                elif kind == "removed":
                    self.remove(e, ev.block_hashes, not cont)
            except (TypeError, ValueError, OverflowError):
                c[C_MALFORMED] += 1
                bad += 1
        return bad

    cpdef list store(self, int e, list hashes, parent, tokens=None, block_size=None,
                     lora_id=None):
        """Engine e cached `hashes`, a chain under its block `parent` (None: a root), holding
        `tokens` (all the blocks' token ids, or None). Returns the keys. Raises ValueError /
        TypeError / OverflowError on unreadable input, before changing anything."""
        self._check_engine(e)
        self._store(e, hashes, parent, tokens, block_size, lora_id, True)
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
                    bint new_event) except -1:
        cdef Py_ssize_t n = len(hashes), i
        cdef int64_t *c = self.counters[e]
        cdef HTable *t = &self.etab[e]
        cdef uint64_t bit = (<uint64_t>1) << e, pk, pk0, k, h, m, lora
        cdef int64_t slot
        cdef int32_t node, bs = 0
        cdef bint by_tokens, orphan = False
        if n > self.scratch_cap:
            self._grow_scratch(n)
        cdef uint64_t *hs = self.scratch_h
        cdef uint64_t *ks = self.scratch_k
        lora = 0 if lora_id is None else <uint64_t><int64_t>lora_id
        if block_size is not None:
            bs = block_size
            if bs <= 0:
                raise ValueError(f"block_size {bs}")
        by_tokens = tokens is not None and len(tokens) > 0
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
                pk = self.node_key[t.vals[slot]]
            else:  # parent unknown here: a chain detached from the root, never matched from it
                pk = nonzero(mix64(ORPHAN ^ mix64(h + <uint64_t>e)))
                orphan = True
        pk0 = pk
        for i in range(n):
            if by_tokens:
                pk = self.block_key(pk, lora, tokens, i * bs, bs)
            else:
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
            m = self.node_mask[node]
            if m & bit:
                mk = (node, e)
                self.multi[mk] = self.multi.get(mk, 0) + 1
            else:
                if m:
                    c[C_RECOMPUTE] += 1
                    c[C_RECOMPUTE_TOK] += bs
                    if popcount(m) == 1:
                        self.duplicated += 1
                else:
                    self.unique += 1
                self.node_mask[node] = m | bit
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
        cdef uint64_t bit = (<uint64_t>1) << e, h
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
            node = t.vals[slot]
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
            self.release_bit(node, bit)
            gone += 1
        return gone

    cpdef int clear(self, int e) except -1:
        """Engine e dropped everything (AllBlocksCleared, or a restart). Returns blocks dropped."""
        self._check_engine(e)
        cdef HTable *t = &self.etab[e]
        cdef uint64_t bit = (<uint64_t>1) << e
        cdef int64_t i
        cdef int32_t node
        cdef int gone = 0
        self.epoch += 1
        for i in range(t.cap):
            node = t.vals[i]
            if node >= 0 and self.node_mask[node] & bit:
                self.release_bit(node, bit)
                gone += 1
        memset(t.vals, 0xff, t.cap * sizeof(int32_t))
        t.n = 0
        self.held[e] = 0
        if self.extra:
            self.extra = {k: v for k, v in self.extra.items() if k[0] != e}
        if self.multi:
            self.multi = {k: v for k, v in self.multi.items() if k[1] != e}
        return gone

    # -- matching ---------------------------------------------------------------------------------
    cdef dict walk(self, list nodes, uint64_t among):
        """Dynamo's find_matches over a chain of node ids (-1: not indexed): each engine of
        `among` scores the number of leading blocks it holds, engines with 0 left out."""
        cdef uint64_t act = among, m, dropped
        cdef Py_ssize_t i, n = len(nodes)
        cdef int32_t node
        cdef dict out = {}
        for i in range(n):
            node = nodes[i]
            m = self.node_mask[node] if node >= 0 else 0
            dropped = act & ~m
            if dropped:
                if i:
                    set_for_engines(out, dropped, i)
                act &= m
                if not act:
                    return out
        set_for_engines(out, act, n)
        return out

    def match_keys(self, list keys, uint64_t among=0xffffffffffffffffULL) -> dict:
        """{engine: leading blocks held} for a chain of keys (engines holding none left out)."""
        cdef list nodes = [self.node_of(<uint64_t>k) for k in keys]
        return self.walk(nodes, among & self.active) if keys else {}

    def match_tokens(self, list tokens, int block_size, lora_id=None,
                     uint64_t among=0xffffffffffffffffULL) -> dict:
        """{engine: leading blocks held} for a prompt's token ids, in blocks of `block_size`
        (hashing and walking in one pass; stops where the last engine drops out)."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        cdef Py_ssize_t nb = len(tokens) // block_size, i
        cdef uint64_t k = 0, m, dropped, act = among & self.active
        cdef uint64_t lora = 0 if lora_id is None else <uint64_t><int64_t>lora_id
        cdef int32_t node
        cdef dict out = {}
        if nb == 0:
            return out
        for i in range(nb):
            k = self.block_key(k, lora, tokens, i * block_size, block_size)
            node = self.node_of(k)
            m = self.node_mask[node] if node >= 0 else 0
            dropped = act & ~m
            if dropped:
                if i:
                    set_for_engines(out, dropped, i)
                act &= m
                if not act:
                    return out
        set_for_engines(out, act, nb)
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
            nodes.append(t.vals[slot])
        return self.walk(nodes, self.active) if nodes else {}

    # -- reading ----------------------------------------------------------------------------------
    def counters_of(self, int e) -> dict:
        self._check_engine(e)
        return {name: self.counters[e][i] for i, name in enumerate(COUNTERS)}

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
        return {t.keys[i]: self.node_key[t.vals[i]] for i in range(t.cap) if t.vals[i] >= 0}

    def nodes(self):
        """(keys, parents, masks) of the live nodes, as numpy uint64 arrays (O(nodes))."""
        cdef int64_t i, j = 0
        keys = np.empty(self.unique, dtype=np.uint64)
        parents = np.empty(self.unique, dtype=np.uint64)
        masks = np.empty(self.unique, dtype=np.uint64)
        cdef uint64_t[:] kv = keys, pv = parents, mv = masks
        for i in range(self.node_top):
            if self.node_mask[i] != 0 and j < self.unique:
                kv[j] = self.node_key[i]
                pv[j] = self.node_parent[i]
                mv[j] = self.node_mask[i]
                j += 1
        return keys, parents, masks

    def key_of(self, int e, uint64_t h):
        """The key engine e's hash `h` maps to, or None."""
        self._check_engine(e)
        cdef int64_t slot = ht_find(&self.etab[e], h)
        return self.node_key[self.etab[e].vals[slot]] if slot >= 0 else None

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
        """Copies of what a layout reads: node keys, parents and masks (node ids 0..top) and the
        key table, at memcpy speed, for `layout_of` to work on without the index (off the lock,
        in another thread). `out`, an earlier snapshot, has its arrays reused when they fit."""
        cdef int64_t n = self.node_top, kc = self.kcap
        if out is not None and out[0].shape[0] >= n and out[3].shape[0] == kc:
            keys, parents, masks, slots = out[0], out[1], out[2], out[3]
        else:
            cap = max(n, 1)
            keys = np.empty(cap, dtype=np.uint64)
            parents = np.empty(cap, dtype=np.uint64)
            masks = np.empty(cap, dtype=np.uint64)
            slots = np.empty(kc, dtype=np.int32)
        cdef uint64_t[::1] kv = keys, pv = parents, mv = masks
        cdef int32_t[::1] sv = slots
        if n:
            memcpy(&kv[0], self.node_key, n * sizeof(uint64_t))
            memcpy(&pv[0], self.node_parent, n * sizeof(uint64_t))
            memcpy(&mv[0], self.node_mask, n * sizeof(uint64_t))
        memcpy(&sv[0], self.kslots, kc * sizeof(int32_t))
        return (keys, parents, masks, slots, n)

    def snapshot_sizes(self) -> tuple:
        """(nodes, key table slots) a snapshot copies now: to reserve its buffers beforehand."""
        return self.node_top, self.kcap

    def layout(self, int divisor=GROUP_DIVISOR, int min_group=MIN_GROUP):
        """`layout_of(self.snapshot())`: every live node's root and colour group, and the
        parent-hash cycles. O(nodes)."""
        return layout_of(self.snapshot(), divisor, min_group)

    def parent_of(self, uint64_t key):
        """The parent key of an indexed block (0: a root), or None when `key` is not indexed."""
        cdef int32_t node = self.node_of(key)
        return self.node_parent[node] if node >= 0 else None

    def mask_of(self, uint64_t key) -> int:
        """The engines holding `key`, as a bit mask (0: not indexed)."""
        cdef int32_t node = self.node_of(key)
        return self.node_mask[node] if node >= 0 else 0

    def table_size(self) -> int:
        """Keys in the key table (equals `unique` while the index is consistent)."""
        return self.kn

    def memory_bytes(self) -> int:
        """Bytes held by the compiled arrays and tables (not the rare-case dicts)."""
        cdef int64_t total = self.node_cap * 3 * 8 + self.kcap * 4
        cdef int e
        for e in range(MAX_ENGINES):
            total += self.etab[e].cap * 12
        return total


MAX_FLEET_ENGINES = MAX_ENGINES


# -- the block map: roots, colour groups and cycles, over a snapshot -----------------------------
class Layout(tuple):
    """`layout_of`'s answer. Per live node, in node-id order (as `FleetCore.nodes()`): `keys`,
    `roots` (the first block of its chain along indexed parents), `groups` (the key of its
    colour group's top block; 0: the shared trunk) and `masks`. `cycle_blocks[e]`: blocks in
    parent-hash cycles that engine e holds; `cycles`: how many cycles; `max_group`: the bound
    on a group's blocks."""

    __slots__ = ()

    def __new__(cls, *values):
        return tuple.__new__(cls, values)

    keys = property(lambda self: self[0])
    roots = property(lambda self: self[1])
    groups = property(lambda self: self[2])
    masks = property(lambda self: self[3])
    cycle_blocks = property(lambda self: self[4])
    cycles = property(lambda self: self[5])
    max_group = property(lambda self: self[6])


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
    """Roots, colour groups and parent-hash cycles of a `FleetCore.snapshot()`, as a `Layout`.
    Runs without the GIL and is O(nodes) whatever the parents say: every walk up marks the
    nodes it meets, so it ends at a node already placed, at a root, or at a node met again on
    this walk. That is a cycle: the last block met (whose parent is that node) is cut to a root,
    so each cycle is found and counted once.

    Groups: a block's group is the topmost block above it (itself included) whose subtree holds
    at most `max(live blocks // divisor, min_group)` blocks; blocks above every such subtree (a
    trunk all requests share, such as one common first block) are the shared group, 0."""
    keys_a, parents_a, masks_a, slots_a, n_obj = snap
    if divisor <= 0 or min_group <= 0:
        raise ValueError("divisor and min_group must be positive")
    cdef int64_t n = n_obj, i, k, q, sp, live = 0, j = 0
    cdef const uint64_t[::1] keys = keys_a
    cdef const uint64_t[::1] parents = parents_a
    cdef const uint64_t[::1] masks = masks_a
    cdef const int32_t[::1] slots = slots_a
    cdef uint64_t kmask = <uint64_t>(slots_a.shape[0] - 1), m
    cap = max(n, 1)
    pidx_a = np.empty(cap, dtype=np.int32)
    depth_a = np.empty(cap, dtype=np.int32)
    mark_a = np.empty(cap, dtype=np.int32)
    stack_a = np.empty(cap + 1, dtype=np.int32)
    size_a = np.empty(cap, dtype=np.int32)
    incyc_a = np.zeros(cap, dtype=np.uint8)
    cyc_a = np.zeros(MAX_ENGINES, dtype=np.int64)
    out_keys = np.empty(cap, dtype=np.uint64)
    out_roots = np.empty(cap, dtype=np.uint64)
    out_groups = np.empty(cap, dtype=np.uint64)
    out_masks = np.empty(cap, dtype=np.uint64)
    cdef int32_t[::1] pidx = pidx_a, depth = depth_a, mark = mark_a, stack = stack_a
    cdef int32_t[::1] size = size_a
    cdef uint8_t[::1] incyc = incyc_a
    cdef int64_t[::1] cyc = cyc_a
    cdef uint64_t[::1] ok = out_keys, orr = out_roots, og = out_groups, om = out_masks
    # after the walks, mark holds the depth order and stack the counting sort's counts
    cdef int32_t[::1] order = mark, cnt = stack
    cdef int32_t x, p, base, maxd = -1
    cdef int64_t cycles = 0, bound
    cdef int e
    with nogil:
        for i in range(n):
            pidx[i] = -1
            depth[i] = -1
            mark[i] = -1
            if masks[i] != 0:
                live += 1
                if parents[i] != 0:
                    pidx[i] = snap_node_of(keys, slots, kmask, parents[i])
        bound = live // divisor
        if bound < min_group:
            bound = min_group
        # depths: walk up to a placed node, a root, or a node met again on this walk (a cycle)
        for i in range(n):
            if masks[i] == 0 or depth[i] >= 0:
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
            if masks[i] != 0:
                cnt[depth[i] + 1] += 1
        for k in range(1, maxd + 2):
            cnt[k] += cnt[k - 1]
        for i in range(n):
            if masks[i] != 0:
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
        for i in range(n):
            m = masks[i]
            if m == 0:
                continue
            ok[j] = keys[i]
            orr[j] = keys[depth[i]]
            og[j] = keys[size[i]] if size[i] >= 0 else 0
            om[j] = m
            j += 1
            if incyc[i]:
                for e in range(MAX_ENGINES):
                    if m >> e & 1:
                        cyc[e] += 1
    return Layout(out_keys[:j], out_roots[:j], out_groups[:j], out_masks[:j], cyc_a, cycles,
                  bound)
