# cython: language_level=3
"""Compiled primitives of kvscope's allocator core, for other Cython modules to `cimport`.

    from allocator._core cimport Stack, stack_push, stack_pop, DList, dlist_push_back, ...

Every structure here is a C struct over int32 arrays that its owning extension type allocates
once (numpy arrays, so tracemalloc counts them and Python code can inspect them); nothing is
ever resized and no element is a Python object. The inline functions do no bounds or
membership checks: the caller keeps the invariants written beside each one, and `check()`
methods (Python level) verify them off the hot path.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

cdef enum:
    NIL = -1        # end of a list, empty stack, no block
    DETACHED = -2   # prev/next of an element that is in no DList


# -- fixed-capacity stack of int32 ids ------------------------------------------------------
ctypedef struct Stack:
    int32_t *items       # items[0:top] are held, items[top-1] is popped next
    Py_ssize_t top
    Py_ssize_t capacity  # fixed at creation; push on a full stack is refused, never grows


cdef inline bint stack_push(Stack *s, int32_t x) noexcept nogil:
    """Push `x`; False (and nothing changes) when the stack is full."""
    if s.top >= s.capacity:
        return False
    s.items[s.top] = x
    s.top += 1
    return True


cdef inline int32_t stack_pop(Stack *s) noexcept nogil:
    """Pop the top id, or NIL when empty."""
    if s.top == 0:
        return NIL
    s.top -= 1
    return s.items[s.top]


# -- intrusive doubly-linked list over int32 prev/next arrays --------------------------------
ctypedef struct DList:
    int32_t *prev        # prev[i]/next[i]: neighbours of element i, NIL at the ends,
    int32_t *next        # DETACHED for both when i is in no list
    int32_t head         # first element (popped by dlist_pop_front) or NIL
    int32_t tail         # last element or NIL
    Py_ssize_t size


cdef inline bint dlist_contains(const DList *l, int32_t i) noexcept nogil:
    return l.next[i] != DETACHED


cdef inline void dlist_push_back(DList *l, int32_t i) noexcept nogil:
    """Append element i, which must be DETACHED (in no list)."""
    l.prev[i] = l.tail
    l.next[i] = NIL
    if l.tail == NIL:
        l.head = i
    else:
        l.next[l.tail] = i
    l.tail = i
    l.size += 1


cdef inline void dlist_push_front(DList *l, int32_t i) noexcept nogil:
    """Prepend element i, which must be DETACHED."""
    l.next[i] = l.head
    l.prev[i] = NIL
    if l.head == NIL:
        l.tail = i
    else:
        l.prev[l.head] = i
    l.head = i
    l.size += 1


cdef inline void dlist_remove(DList *l, int32_t i) noexcept nogil:
    """Unlink element i (O(1), from anywhere in the list); i must be in this list."""
    cdef int32_t p = l.prev[i], n = l.next[i]
    if p == NIL:
        l.head = n
    else:
        l.next[p] = n
    if n == NIL:
        l.tail = p
    else:
        l.prev[n] = p
    l.prev[i] = DETACHED
    l.next[i] = DETACHED
    l.size -= 1


cdef inline int32_t dlist_pop_front(DList *l) noexcept nogil:
    """Unlink and return the head, or NIL when empty."""
    cdef int32_t i = l.head
    if i != NIL:
        dlist_remove(l, i)
    return i


cdef inline void dlist_move_to_back(DList *l, int32_t i) noexcept nogil:
    """Make element i (in this list) the tail: an LRU touch."""
    if l.tail != i:
        dlist_remove(l, i)
        dlist_push_back(l, i)


# -- the eviction policies' algorithms (the cache's policies and PrefixCore's BlockOrder) ------
# Over arrays their users own (the cache's policies grow theirs); S3-FIFO's ghost is the one
# Python object they touch.
include "_eviction.pxi"


# -- reference counts ------------------------------------------------------------------------
cdef inline int32_t ref_incr(int32_t *refs, int32_t i) noexcept nogil:
    refs[i] += 1
    return refs[i]


cdef inline int32_t ref_decr(int32_t *refs, int32_t i) noexcept nogil:
    """Decrement and return the new count; the caller never decrements a zero count."""
    refs[i] -= 1
    return refs[i]


# -- owning extension types ------------------------------------------------------------------
cdef class FreeStack:
    cdef Stack s
    cdef readonly object items   # numpy int32 array of `capacity` (items[:len] held)


cdef class LinkedList:
    cdef DList l
    cdef inline void _need(self, Py_ssize_t i, bint member) except *
    cdef readonly object prev    # numpy int32 arrays of `capacity`
    cdef readonly object next


cdef class RefCounts:
    cdef int32_t *refs
    cdef readonly object counts  # numpy int32 array, one per block


cdef class EventRing:
    cdef readonly Py_ssize_t capacity
    cdef readonly int64_t last_seq
    cdef Py_ssize_t count          # events held: seqs last_seq-count+1 .. last_seq
    cdef double *ts
    cdef uint8_t *kind             # code into `_names`, plus FLAG_OBJ / FLAG_KEY (see _events.pxi)
    cdef int64_t *vals             # NVALS per slot, for the numeric kinds
    cdef int64_t *boff             # first position of the event's block ids in the id ring, or -1
    cdef int32_t *bn               # number of block ids (0: none recorded)
    cdef int32_t *bring            # ring of block ids, `bcap` long
    cdef readonly Py_ssize_t bcap
    cdef readonly int64_t bpos     # block ids written so far (next write at bpos % bcap)
    cdef uint8_t *aux              # per slot: a numeric event's state code (allocate)
    cdef public object sink        # the pool's History: drains the ring before it drops events
    cdef public int64_t spill_at   # call sink.spill() once last_seq reaches this ...
    cdef public int64_t spill_bpos # ... or bpos reaches this (the id ring would wrap)
    cdef list _objs
    cdef list _layouts
    cdef list _strings
    cdef dict _string_ids
    cdef list _names
    cdef dict _codes
    cdef list _fields
    cdef object _arrays
    cdef int32_t *record_num(self, uint8_t code, int64_t a, int64_t b, int64_t c, int64_t d,
                             Py_ssize_t n, double now) noexcept
    cdef int64_t record_values(self, uint8_t code, tuple values, double now) except -1
    cdef int64_t *record_keyed(self, uint8_t code, object first, double now) except NULL
    cdef int64_t intern(self, str text) except -1
    cdef int32_t *_reserve_blocks(self, Py_ssize_t slot, Py_ssize_t n) noexcept
    cdef inline Py_ssize_t _slot(self, int64_t seq) noexcept
    cdef inline void _open_slot(self, Py_ssize_t slot) noexcept
    cdef int maybe_spill(self) except -1
    cdef tuple _decoded(self, Py_ssize_t slot, uint8_t k)
    cdef inline void set_aux(self, uint8_t x) noexcept
    cdef inline int64_t _first_held(self, int64_t after) noexcept
    cdef str _string(self, int64_t i)
    cdef inline int _need_sane(self, Py_ssize_t slot, int64_t seq) except -1
    cdef inline bint _layout_missing(self, Py_ssize_t slot) noexcept
    cdef object _event_problem(self, Py_ssize_t slot)


cdef double wall_time() noexcept nogil
cdef double mono_time() noexcept nogil


cdef class BlockMap:
    cdef readonly Py_ssize_t num_blocks
    cdef readonly object owner           # array('i'): allocation id per block, -1 when free
    cdef readonly object state           # bytearray: FREE / USED / CACHED / PINNED per block
    cdef readonly object chunk_version   # array('I'): map version when the chunk last changed
    cdef public uint32_t version
    cdef int32_t *own
    cdef uint8_t *st
    cdef uint32_t *cv
    cdef object _views


cdef class PagedCore:
    cdef readonly Py_ssize_t num_blocks
    cdef readonly int64_t block_bytes
    cdef BlockMap bm
    cdef EventRing ev
    cdef uint8_t code_alloc, code_free
    cdef int32_t *own
    cdef uint8_t *st
    cdef uint32_t *cv
    cdef readonly object next_arr        # numpy int32 per block: the chain links
    cdef int32_t *nxt
    cdef readonly int32_t free_head      # freed blocks, chained (NIL: none)
    cdef readonly int32_t fresh          # blocks fresh .. num_blocks-1 were never handed out
    cdef readonly Py_ssize_t free_count
    cdef readonly Py_ssize_t live        # live allocations
    cdef Py_ssize_t rcap
    cdef int32_t slot_free               # chain of unused record slots through r_tail
    cdef object _rec                     # the record arrays (numpy), replaced when they grow
    cdef int64_t *r_aid
    cdef int64_t *r_req
    cdef int32_t *r_head
    cdef int32_t *r_tail
    cdef int32_t *r_n
    cdef object _htab
    cdef int32_t *htab
    cdef int64_t hmask
    cdef int hshift
    cdef public int64_t last_id
    cdef public int64_t frees
    cdef public int64_t requested_total
    cdef object _oom, _bad_size, _not_found
    cdef list tags                       # one object per record slot (a cache's keys), or None
    cdef Py_ssize_t last_slot            # record slot of the newest allocation
    cdef int set_tag(self, int64_t aid, object tag) except -1
    cdef inline Py_ssize_t home(self, int64_t aid) noexcept
    cdef Py_ssize_t find(self, int64_t aid) noexcept
    cdef Py_ssize_t slot_of(self, object aid) except -1
    cdef Py_ssize_t new_record(self, int64_t aid) except -1
    cdef void drop_record(self, Py_ssize_t slot) noexcept
    cdef int grow_records(self) except -1
    cdef int rehash(self, Py_ssize_t cap) except -1
    cdef int32_t take(self, Py_ssize_t n, int64_t aid, uint8_t state, int32_t *ids,
                      int32_t *last) noexcept
    cdef void give_back(self, int32_t head, int32_t tail, Py_ssize_t n, int32_t *ids) noexcept
    cdef Py_ssize_t find_safe(self, int64_t aid) noexcept
    cdef object chain_problem(self, Py_ssize_t s, list out)
    cdef object free_chain_problem(self, int32_t[::1] out)
    cdef int64_t alloc_one(self, int64_t nbytes, Py_ssize_t n, uint8_t state, double now) except -1
    cdef int free_slot(self, Py_ssize_t slot, double now) except -1
