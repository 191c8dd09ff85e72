# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""kvscope's compiled core: the primitives of `_core.pxd` with Python-facing owners (FreeStack,
LinkedList, RefCounts) here, then, included below, the event ring (`_events.pxi`), the block map
(`_blockmap.pxi`), the paged pool's per-operation state (`_paged.pxi`), the eviction policies
(`_policies.pxi`, over the algorithms `_core.pxd` includes from `_eviction.pxi`, which PrefixCore
uses too) and the keyed cache's core (`_cache.pxi`).

Debugging: build with `KVSCOPE_CYTHON_DEBUG=1` (setup.py turns boundscheck/wraparound back on and
compiles with -O0 -g), or `cython -a allocator/_core.pyx` for the annotated HTML that shows every
line that still goes through the Python C API (yellow).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_GET_ITEM, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

import numpy as np
from .errors import CorruptState as _CorruptState
from .errors import block_state as _block_state
from array import array as _array
from cpython.array cimport clone as _clone_ints
from cpython.array cimport array as _carray

cdef _carray _EMPTY_INTS = _array("i")


cdef inline void list_put(list l, Py_ssize_t i, object v) noexcept:
    """`l[i] = v` for an index the caller knows is in range: no bounds check, no call."""
    cdef PyObject *old = PyList_GET_ITEM(l, i)
    Py_INCREF(v)
    PyList_SET_ITEM(l, i, v)
    Py_XDECREF(old)


cdef double wall_time() noexcept nogil:
    """time.time() without the Python call: the event timestamp."""
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <double>t.tv_sec + <double>t.tv_nsec * 1e-9


cdef double mono_time() noexcept nogil:
    """time.monotonic() without the Python call (the same clock: CLOCK_MONOTONIC)."""
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <double>t.tv_sec + <double>t.tv_nsec * 1e-9


cdef int32_t *i32_ptr(object arr):
    cdef int32_t[::1] mv = arr
    return &mv[0]


# -- FreeStack -------------------------------------------------------------------------------
cdef class FreeStack:
    """A fixed-capacity stack of int32 ids with a top index (never resized, no Python object per
    id). `items[:len]` are held; pop returns the last pushed.

    Invariant: 0 <= len <= capacity. Pushing onto a full stack raises OverflowError; popping an
    empty one raises IndexError (the C inline functions return False / NIL instead).
    """

    def __cinit__(self, Py_ssize_t capacity, *, bint full=False):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        # Full: ids capacity-1 .. 0 from the bottom, so pops hand out 0, 1, 2, ...
        self.items = (np.arange(capacity - 1, -1, -1, dtype=np.int32) if full
                      else np.empty(capacity, dtype=np.int32))
        self.s.items = i32_ptr(self.items)
        self.s.capacity = capacity
        self.s.top = capacity if full else 0

    @property
    def capacity(self) -> int:
        return self.s.capacity

    def __len__(self) -> int:
        return self.s.top

    def push(self, int32_t x) -> None:
        if not stack_push(&self.s, x):
            raise OverflowError(f"stack full at its capacity of {self.s.capacity}")

    def pop(self) -> int:
        if self.s.top == 0:
            raise IndexError("pop from an empty stack")
        return stack_pop(&self.s)

    def tolist(self) -> list:
        """Held ids, bottom first."""
        return self.items[:self.s.top].tolist()

    def held(self):
        """The held ids, bottom first, as a numpy view (valid until the next change)."""
        return self.items[:self.s.top]

    def pop_many(self, Py_ssize_t n):
        """Pop `n` ids: an array('i') in pop order (what n single pops return). IndexError
        (and nothing popped) when fewer than n are held."""
        if n < 0 or n > self.s.top:
            raise IndexError(f"pop {n} from a stack of {self.s.top}")
        out = _clone_ints(_EMPTY_INTS, n, False)
        cdef int32_t[::1] o = out
        cdef Py_ssize_t i
        for i in range(n):
            o[i] = self.s.items[self.s.top - 1 - i]
        self.s.top -= n
        return out

    def push_many(self, ids) -> None:
        """Push each id of `ids` (int32 buffer or iterable) in order. OverflowError (and
        nothing pushed) when they do not fit."""
        cdef int32_t[::1] v = ids if isinstance(ids, _array) and ids.typecode == "i" else _array("i", ids)
        cdef Py_ssize_t i, n = v.shape[0]
        if self.s.top + n > self.s.capacity:
            raise OverflowError(f"pushing {n} onto a stack of {self.s.top} exceeds its capacity of {self.s.capacity}")
        for i in range(n):
            self.s.items[self.s.top + i] = v[i]
        self.s.top += n

    def refill(self, Py_ssize_t lo) -> None:
        """Hold exactly the ids capacity-1 .. lo, bottom to top, so pops hand out lo, lo+1, ...
        (a fresh full stack is refill(0))."""
        if lo < 0 or lo > self.s.capacity:
            raise ValueError(f"refill from {lo}: outside 0..{self.s.capacity}")
        cdef Py_ssize_t i, n = self.s.capacity - lo
        for i in range(n):
            self.s.items[i] = <int32_t>(self.s.capacity - 1 - i)
        self.s.top = n


# -- LinkedList ------------------------------------------------------------------------------
cdef class LinkedList:
    """An intrusive doubly-linked list of element ids 0..capacity-1 over two int32 arrays, as
    vLLM's FreeKVCacheBlockQueue but without a Python object per element: push at either end,
    pop the head and remove from the middle are O(1).

    Invariant: walking `next` from head visits `len` elements and ends at tail; prev mirrors
    next; an element not in the list has prev == next == DETACHED (-2). `check()` verifies it.
    """

    def __cinit__(self, Py_ssize_t capacity):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.prev = np.full(capacity, DETACHED, dtype=np.int32)
        self.next = np.full(capacity, DETACHED, dtype=np.int32)
        self.l.prev = i32_ptr(self.prev)
        self.l.next = i32_ptr(self.next)
        self.l.head = self.l.tail = NIL
        self.l.size = 0

    cdef inline void _need(self, Py_ssize_t i, bint member) except *:
        if i < 0 or i >= self.prev.shape[0]:
            raise IndexError(f"element {i} outside 0..{self.prev.shape[0] - 1}")
        if dlist_contains(&self.l, <int32_t>i) != member:
            raise ValueError(f"element {i} is {'not ' if member else 'already '}in the list")

    def __len__(self) -> int:
        return self.l.size

    def __contains__(self, Py_ssize_t i) -> bool:
        return 0 <= i < self.prev.shape[0] and dlist_contains(&self.l, <int32_t>i)

    @property
    def head(self):
        return None if self.l.head == NIL else self.l.head

    @property
    def tail(self):
        return None if self.l.tail == NIL else self.l.tail

    def push_back(self, Py_ssize_t i) -> None:
        self._need(i, False)
        dlist_push_back(&self.l, <int32_t>i)

    def push_front(self, Py_ssize_t i) -> None:
        self._need(i, False)
        dlist_push_front(&self.l, <int32_t>i)

    def remove(self, Py_ssize_t i) -> None:
        self._need(i, True)
        dlist_remove(&self.l, <int32_t>i)

    def move_to_back(self, Py_ssize_t i) -> None:
        self._need(i, True)
        dlist_move_to_back(&self.l, <int32_t>i)

    def pop_front(self):
        """The head, unlinked, or None when empty."""
        cdef int32_t i = dlist_pop_front(&self.l)
        return None if i == NIL else i

    def tolist(self, limit=None) -> list:
        cdef list out = []
        cdef int32_t i = self.l.head
        cdef Py_ssize_t cap = self.l.size if limit is None else min(<Py_ssize_t>limit, self.l.size)
        while i != NIL and len(out) < cap:
            out.append(i)
            i = self.l.next[i]
        return out

    def check(self) -> list:
        """Problems with the links (empty = ok); names the first element that breaks them."""
        problems = []
        cdef int32_t i = self.l.head, p = NIL
        cdef Py_ssize_t n = 0, cap = self.prev.shape[0]
        while i != NIL:
            if i < 0 or i >= cap:
                return problems + [f"link to {i} outside 0..{cap - 1} after element {p}"]
            if self.l.prev[i] != p:
                problems.append(f"element {i}: prev is {self.l.prev[i]}, expected {p}")
            p, i = i, self.l.next[i]
            n += 1
            if n > cap:
                return problems + ["the list has a cycle"]
        if p != self.l.tail:
            problems.append(f"tail is {self.l.tail}, walking from head ends at {p}")
        if n != self.l.size:
            problems.append(f"size is {self.l.size}, walking from head counts {n}")
        detached = int(np.count_nonzero(np.asarray(self.next) == DETACHED))
        if detached + n != cap:
            problems.append(f"{cap - n - detached} elements are linked but not reachable from head")
        return problems


# -- RefCounts -------------------------------------------------------------------------------
cdef class RefCounts:
    """One int32 reference count per block (a block shared by k sequences has count k).

    Invariant: every count >= 0; `decr` refuses to go below zero (ValueError) at the Python
    level; the inline `ref_decr` trusts its caller.
    """

    def __cinit__(self, Py_ssize_t capacity):
        self.counts = np.zeros(capacity, dtype=np.int32)
        self.refs = i32_ptr(self.counts)

    def __len__(self) -> int:
        return self.counts.shape[0]

    def __getitem__(self, Py_ssize_t i) -> int:
        if i < 0 or i >= self.counts.shape[0]:
            raise IndexError(i)
        return self.refs[i]

    def incr(self, Py_ssize_t i) -> int:
        if i < 0 or i >= self.counts.shape[0]:
            raise IndexError(i)
        return ref_incr(self.refs, <int32_t>i)

    def decr(self, Py_ssize_t i) -> int:
        if i < 0 or i >= self.counts.shape[0]:
            raise IndexError(i)
        if self.refs[i] == 0:
            raise ValueError(f"block {i} has no reference to drop")
        return ref_decr(self.refs, <int32_t>i)


include "_events.pxi"
include "_blockmap.pxi"
include "_paged.pxi"
include "_policies.pxi"
include "_cache.pxi"
