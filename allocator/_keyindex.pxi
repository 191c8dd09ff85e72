# Included by _cache.pxi (after Entry): the cache's key index.

from cpython.object cimport PyObject_Hash
from libc.stdlib cimport calloc, free, qsort

cdef extern from *:
    void __builtin_prefetch(const void *addr) noexcept nogil


cdef struct KCell:
    Py_hash_t h      # hash of the entry's key
    PyObject *e      # an owned reference to the Entry; NULL marks an empty cell


cdef struct KOrder:
    int64_t seq
    PyObject *e


cdef int _by_seq(const void *a, const void *b) noexcept nogil:
    cdef int64_t x = (<KOrder *>a).seq, y = (<KOrder *>b).seq
    return (x > y) - (x < y)


cdef inline object exact_key(object key):
    """`key` as an exact str (a str subclass becomes its plain text), or None if not a str."""
    if type(key) is str:
        return key
    if isinstance(key, str):
        return str.__str__(key)
    return None


@cython.final
cdef class KeyIndex:
    """The cache's key -> Entry map: open addressing with linear probing and backward-shift
    deletion over 16-byte cells (the key's hash, the entry), four to a cache line, at most half
    full. Each entry is filed under its own `key`; its insertion number (`Entry.iseq`) gives
    the iteration order.

    NOTE: why not a dict. CPython keeps no hashes in a dict whose keys are all str, so each
    probe that meets another key reads that key's string, and the probe sequence jumps across
    the table: with tens of thousands of entries out of the CPU caches, a put (a missing key
    looked up and inserted, a victim looked up and deleted) paid several cache misses per
    lookup. Here a probe compares stored hashes, almost always within one cache line, and reads
    an entry only when its hash matches.

    The Python side sees a read-mostly mapping: len, in, [], get, keys/values/items (lists, in
    insertion order, as a dict iterates), iteration over a snapshot of the keys, `del`, and
    `add(entry)`. Keys are exact str (a str subclass is looked up by its text).
    """

    cdef KCell *cells
    cdef Py_ssize_t mask
    cdef Py_ssize_t used
    cdef int64_t next_seq

    def __cinit__(self):
        self.cells = <KCell *>calloc(8, sizeof(KCell))
        if self.cells == NULL:
            raise MemoryError()
        self.mask = 7
        self.used = 0
        self.next_seq = 0

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        cdef Py_ssize_t i
        cdef KCell *cells = self.cells
        if cells == NULL:
            return
        self.cells = NULL
        for i in range(self.mask + 1):
            Py_XDECREF(cells[i].e)
        free(cells)

    # -- the compiled path ---------------------------------------------------------------
    cdef inline Py_ssize_t c_find(self, str key, Py_hash_t h) except -2:
        """The cell holding exact-str `key` (hash `h`), or -1."""
        cdef Py_ssize_t i = <Py_ssize_t>(<size_t>h & <size_t>self.mask)
        cdef KCell *c
        cdef str k
        while True:
            c = &self.cells[i]
            if c.e == NULL:
                return -1
            if c.h == h:
                k = (<Entry>c.e).key
                if k is key or k == key:
                    return i
            i = (i + 1) & self.mask

    cdef inline Entry c_get(self, str key, Py_hash_t h):
        """The entry of exact-str `key` (hash `h`), or None."""
        cdef Py_ssize_t i = self.c_find(key, h)
        return None if i < 0 else <Entry>self.cells[i].e

    cdef inline void c_prefetch_cell(self, Py_hash_t h) noexcept:
        __builtin_prefetch(&self.cells[<size_t>h & <size_t>self.mask])

    cdef inline void c_prefetch_entry(self, Py_hash_t h) noexcept:
        """Prefetch the entry of the first cell holding hash `h` (the cell should be cached)."""
        cdef Py_ssize_t i = <Py_ssize_t>(<size_t>h & <size_t>self.mask)
        while self.cells[i].e != NULL:
            if self.cells[i].h == h:
                __builtin_prefetch(self.cells[i].e)
                __builtin_prefetch((<char *>self.cells[i].e) + 64)
                return
            i = (i + 1) & self.mask

    cdef int c_insert(self, Entry e, Py_hash_t h) except -1:
        """File `e` under its key, whose hash is `h`; the caller knows the key is absent."""
        if 2 * (self.used + 1) > self.mask + 1:
            self._resize(2 * (self.mask + 1))
        cdef Py_ssize_t i = <Py_ssize_t>(<size_t>h & <size_t>self.mask)
        while self.cells[i].e != NULL:
            i = (i + 1) & self.mask
        Py_INCREF(e)
        self.cells[i].e = <PyObject *>e
        self.cells[i].h = h
        e.iseq = self.next_seq
        self.next_seq += 1
        self.used += 1
        return 0

    cdef int c_remove(self, Entry e) except -1:
        """Take entry `e` (this very object) out; KeyError when it is not filed."""
        cdef Py_hash_t h = PyObject_Hash(e.key)
        cdef Py_ssize_t i = <Py_ssize_t>(<size_t>h & <size_t>self.mask)
        cdef PyObject *want = <PyObject *>e
        while self.cells[i].e != want:
            if self.cells[i].e == NULL:
                raise KeyError(e.key)
            i = (i + 1) & self.mask
        self.c_clear(i)
        return 0

    cdef void c_clear(self, Py_ssize_t i) noexcept:
        """Empty cell `i`, moving back the cells after it that probed past it."""
        cdef PyObject *old = self.cells[i].e
        cdef Py_ssize_t j = i, k, m = self.mask
        while True:
            j = (j + 1) & m
            if self.cells[j].e == NULL:
                break
            k = <Py_ssize_t>(<size_t>self.cells[j].h & <size_t>m)
            # Cell j stays unless its home lies cyclically outside (i, j].
            if (i < j and i < k <= j) or (i > j and (k > i or k <= j)):
                continue
            self.cells[i] = self.cells[j]
            i = j
        self.cells[i].e = NULL
        self.used -= 1
        Py_XDECREF(old)

    cdef int _resize(self, Py_ssize_t cap) except -1:
        cdef KCell *old = self.cells
        cdef Py_ssize_t n = self.mask + 1, i, j
        cdef KCell *cells = <KCell *>calloc(cap, sizeof(KCell))
        if cells == NULL:
            raise MemoryError()
        for i in range(n):
            if old[i].e != NULL:
                j = <Py_ssize_t>(<size_t>old[i].h & <size_t>(cap - 1))
                while cells[j].e != NULL:
                    j = (j + 1) & (cap - 1)
                cells[j] = old[i]
        self.cells = cells
        self.mask = cap - 1
        free(old)
        return 0

    cdef Py_ssize_t c_lookup(self, object key) except -2:
        """The cell of any key object, or -1 (a non-str key is never filed)."""
        key = exact_key(key)
        if key is None:
            return -1
        return self.c_find(<str>key, PyObject_Hash(key))

    # -- the mapping -----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.used

    def __contains__(self, key) -> bool:
        return self.c_lookup(key) >= 0

    def __getitem__(self, key):
        cdef Py_ssize_t i = self.c_lookup(key)
        if i < 0:
            raise KeyError(key)
        return <Entry>self.cells[i].e

    def get(self, key, default=None):
        cdef Py_ssize_t i = self.c_lookup(key)
        return default if i < 0 else <Entry>self.cells[i].e

    def __delitem__(self, key) -> None:
        cdef Py_ssize_t i = self.c_lookup(key)
        if i < 0:
            raise KeyError(key)
        self.c_clear(i)

    def add(self, Entry entry) -> None:
        """File `entry` under its key. ValueError when the key is already filed."""
        key = exact_key(entry.key)
        if key is None:
            raise TypeError(f"an entry's key must be a str, not {type(entry.key).__name__}")
        cdef Py_hash_t h = PyObject_Hash(key)
        if self.c_find(<str>key, h) >= 0:
            raise ValueError(f"key {key!r} is already filed")
        self.c_insert(entry, h)

    cdef list ordered(self):
        """The entries in insertion order."""
        cdef Py_ssize_t i, n = 0
        cdef KOrder *order = <KOrder *>calloc(self.used + 1, sizeof(KOrder))
        if order == NULL:
            raise MemoryError()
        for i in range(self.mask + 1):
            if self.cells[i].e != NULL and n < self.used:
                order[n].seq = (<Entry>self.cells[i].e).iseq
                order[n].e = self.cells[i].e
                n += 1
        qsort(order, n, sizeof(KOrder), _by_seq)
        cdef list out = [None] * n
        for i in range(n):
            list_put(out, i, <object>order[i].e)
        free(order)
        return out

    def values(self) -> list:
        return self.ordered()

    def keys(self) -> list:
        return [(<Entry>e).key for e in self.ordered()]

    def items(self) -> list:
        return [((<Entry>e).key, e) for e in self.ordered()]

    def __iter__(self):
        return iter(self.keys())

    def clear(self) -> None:
        self._release()
        self.cells = <KCell *>calloc(8, sizeof(KCell))
        if self.cells == NULL:
            raise MemoryError()
        self.mask = 7
        self.used = 0

    def check(self) -> list:
        """The index's invariants: each filed entry is reachable from its key's home cell
        without crossing an empty cell, under the hash of its own key, once; the count."""
        cdef list problems = []
        cdef Py_ssize_t i, j, n = 0
        cdef Entry e
        for i in range(self.mask + 1):
            if self.cells[i].e == NULL:
                continue
            n += 1
            e = <Entry>self.cells[i].e
            if type(e.key) is not str or PyObject_Hash(e.key) != self.cells[i].h:
                problems.append(f"key index cell {i} holds entry {e.key!r} under another key's hash")
                continue
            j = <Py_ssize_t>(<size_t>self.cells[i].h & <size_t>self.mask)
            while j != i and self.cells[j].e != NULL:
                j = (j + 1) & self.mask
            if j != i:
                problems.append(f"key index: entry {e.key!r} is unreachable from its home cell")
            elif self.c_find(e.key, self.cells[i].h) != i:
                problems.append(f"key index: key {e.key!r} is filed twice")
        if n != self.used:
            problems.append(f"key index counts {self.used} entries, its cells hold {n}")
        return problems

    def __repr__(self) -> str:
        return f"KeyIndex({len(self)} entries)"
