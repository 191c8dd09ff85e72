# Included by _core.pxd (after DList), so cimported from allocator._core like the primitives
# it builds on.
#
# The eviction policies' algorithms, written once for both compiled users:
#
# - the keyed cache's policies (`allocator/_policies.pxi`, in allocator._core): LRU, FIFO, LFU,
#   S3-FIFO over per-key slots;
# - the prefix pool's evictable (idle, hashed) blocks (`PrefixCore` in allocator/_prefix.pyx):
#   LRU, FIFO, LFU, S3-FIFO and Bélády over block ids, in one `BlockOrder`.
#
#     from allocator._core cimport BlockOrder, order_insert, order_remove, order_victim, ...
#
# Everything is a C struct over arrays its owner allocates, and inline functions (no Python object
# on any path but the S3-FIFO ghost's keys, in a `Ghost`). The two users differ in what an
# element's life looks like, not in the algorithms: a cache key stays in its policy from put to eviction and
# is touched on a hit, while a prefix block leaves the evictable order on a hit (a sequence holds
# it) and comes back when it is idle again, keyed by its history (store tick, hits, next use). So:
#
# - a list order (`list_*`): LRU and FIFO of the cache (touch: to the back / nothing), LRU of the
#   prefix pool (a block goes to the back each time it becomes idle);
# - an indexed binary heap by (key1, key2) (`heap_*`): the prefix pool's FIFO (store tick), LFU
#   (hits, idle tick) and Bélády (-next use, idle tick), whose blocks come back at a position of
#   their own; the cache's LFU keeps one list per frequency instead (O(1), in _policies.pxi);
# - S3-FIFO (`s3_*`): a small and a main list over the same links, saturating hit counts, the
#   victim loop (promotion from small, second chance in main) and the bounded ghost.
#
# The functions do no bounds or membership checks: the caller keeps the invariants written beside
# each one, and its `check()` verifies them off the hot path.


from cpython.dict cimport PyDict_GetItem, PyDict_SetDefault
from cpython.object cimport PyObject

cdef enum:
    # the prefix pool's policy codes (PrefixCore.policy; POLICY_CODES in _prefix.pyx)
    P_LRU = 0
    P_FIFO = 1
    P_LFU = 2
    P_S3FIFO = 3
    P_BELADY = 4
    S3_MAX_HITS = 3   # an S3-FIFO hit count saturates here


# -- one list, oldest first: LRU, FIFO ---------------------------------------------------------
cdef inline void list_insert(DList *l, int32_t i) noexcept nogil:
    """Element i (DETACHED) enters as the newest."""
    dlist_push_back(l, i)


cdef inline void list_touch(DList *l, int32_t i) noexcept nogil:
    """An LRU hit on element i (in the list): it becomes the newest. FIFO does nothing on a hit."""
    dlist_move_to_back(l, i)


cdef inline int32_t list_victim(const DList *l) noexcept nogil:
    """The next to evict: the oldest (NIL when empty)."""
    return l.head


# -- an indexed binary min-heap by (key1, key2) -----------------------------------------------
ctypedef struct KeyHeap:
    int32_t *items    # items[0:size]: a binary min-heap of elements by (key1, key2)
    int32_t *pos      # pos[i]: where element i sits in items (NIL when not in the heap)
    double *key1      # the elements' keys, set by the caller before heap_push
    int64_t *key2
    int size


cdef inline bint heap_less(const KeyHeap *h, int32_t a, int32_t b) noexcept nogil:
    if h.key1[a] != h.key1[b]:
        return h.key1[a] < h.key1[b]
    return h.key2[a] < h.key2[b]


cdef inline void heap_sift_up(KeyHeap *h, int i) noexcept nogil:
    cdef int32_t b = h.items[i]
    cdef int p
    while i > 0:
        p = (i - 1) >> 1
        if not heap_less(h, b, h.items[p]):
            break
        h.items[i] = h.items[p]
        h.pos[h.items[i]] = i
        i = p
    h.items[i] = b
    h.pos[b] = i


cdef inline void heap_sift_down(KeyHeap *h, int i) noexcept nogil:
    cdef int32_t b = h.items[i]
    cdef int c, n = h.size
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and heap_less(h, h.items[c + 1], h.items[c]):
            c += 1
        if not heap_less(h, h.items[c], b):
            break
        h.items[i] = h.items[c]
        h.pos[h.items[i]] = i
        i = c
    h.items[i] = b
    h.pos[b] = i


cdef inline void heap_push(KeyHeap *h, int32_t b) noexcept nogil:
    """Element b (not in the heap; its keys set) enters: O(log n)."""
    cdef int i = h.size
    h.size += 1
    h.items[i] = b
    h.pos[b] = i
    heap_sift_up(h, i)


cdef inline void heap_remove(KeyHeap *h, int32_t b) noexcept nogil:
    """Element b (in the heap) leaves, from anywhere: O(log n)."""
    cdef int i = h.pos[b]
    cdef int32_t last
    h.size -= 1
    last = h.items[h.size]
    h.pos[b] = NIL
    if i != h.size:
        h.items[i] = last
        h.pos[last] = i
        heap_sift_down(h, i)
        heap_sift_up(h, h.pos[last])


# -- S3-FIFO (Yang et al., SOSP 2023) ------------------------------------------------------------
cdef inline void s3_hit(uint8_t *hits, int32_t i) noexcept nogil:
    """A hit on element i: its count goes up, saturating at S3_MAX_HITS."""
    if hits[i] < S3_MAX_HITS:
        hits[i] += 1


cdef inline bint s3_small_turn(Py_ssize_t small, Py_ssize_t main, Py_ssize_t total,
                               bint float_share) noexcept nogil:
    """Whether eviction takes from `small` (of `total` = small + main elements): while it holds
    at least a tenth of them, or main is empty. `float_share`: the tenth as the keyed cache (and
    its Python model) computes it, small >= 0.1 * total, where 0.1 * 30 rounds up to
    3.0000000000000004; otherwise exactly, small * 10 >= total (the prefix pool)."""
    if small == 0:
        return False
    if main == 0:
        return True
    if float_share:
        return small >= 0.1 * total
    return small * 10 >= total


cdef inline int32_t s3_victim(DList *small, DList *main, uint8_t *hits, uint8_t *queue,
                              uint8_t main_code, Py_ssize_t total, bint float_share) noexcept nogil:
    """The next element to evict (of `total` = small + main > 0), not removed: an element of `small`
    hit since it entered is promoted to the back of `main` (hits reset, queue[i] = main_code);
    one of `main` with hits left goes to its back with one hit fewer (a second chance); the
    first of neither kind is the victim. The promotions are kept, so the answer is what the
    next eviction takes."""
    cdef int32_t b
    while True:
        if s3_small_turn(small.size, main.size, total, float_share):
            b = small.head
            if hits[b] > 0:  # re-accessed while on probation: promote
                dlist_remove(small, b)
                hits[b] = 0
                queue[b] = main_code
                dlist_push_back(main, b)
                continue
            return b
        b = main.head
        if hits[b] > 0:  # second chance
            hits[b] -= 1
            dlist_move_to_back(main, b)
            continue
        return b


cdef inline Py_ssize_t s3_drain(DList *small, DList *main, uint8_t *hits, uint8_t *queue,
                                uint8_t main_code, bint float_share, int32_t *out,
                                Py_ssize_t n) noexcept nogil:
    """Evict up to n elements into out[0:n] in order (the eviction order): run on copies of a
    policy's lists, links, hit counts and queue codes, never on the live ones. Returns how many."""
    cdef Py_ssize_t k = 0
    cdef int32_t b
    while k < n and small.size + main.size > 0:
        b = s3_victim(small, main, hits, queue, main_code, small.size + main.size, float_share)
        if queue[b] == main_code:
            dlist_remove(main, b)
        else:
            dlist_remove(small, b)
        out[k] = b
        k += 1
    return k


# S3-FIFO's ghost: the keys evicted from small, oldest forgotten first, O(1) each way. A dict
# alone finds its oldest key by scanning past every key deleted before it (O(deleted)); an
# OrderedDict costs a method call a put. Here `pos` holds the keys (what recall looks up) and
# `order` the order they came in: pos[key] is the key's index in `order`, and a key is forgotten
# by deleting it from `pos` only, so an entry of `order` that `pos` does not point back to is
# stale and skipped. The list is rebuilt from the live keys once it is mostly forgotten or stale
# entries (indices stay small: no int object is made for a ghost of a few keys). Implemented
# (Python-facing part) in _policies.pxi; the cache's S3FIFO and PrefixCore each keep one.
cdef class Ghost:
    cdef dict pos           # key -> its index in `order`
    cdef list order         # keys as remembered; order[:head] already forgotten
    cdef Py_ssize_t head


cdef inline bint s3_recall(Ghost ghost, object key) except -1:
    """Whether the ghost remembers `key`, then forgotten there: a key coming back enters main."""
    if key in ghost.pos:
        del ghost.pos[key]
        return True
    return False


cdef inline bint ghost_live(Ghost g, Py_ssize_t i) except -1:
    """Whether order[i] is a key the ghost remembers (pos points back to i)."""
    cdef PyObject *v = PyDict_GetItem(g.pos, g.order[i])
    return v != NULL and <Py_ssize_t><object>v == i


cdef inline int ghost_compact(Ghost g) except -1:
    """Rebuild `order` from the keys still remembered, oldest first, and renumber them. O(list),
    done once the list is at least half forgotten or stale: O(1) a key."""
    cdef list live = []
    cdef Py_ssize_t i
    for i in range(g.head, len(g.order)):
        if ghost_live(g, i):
            live.append(g.order[i])
    for i in range(len(live)):
        g.pos[live[i]] = i
    g.order = live
    g.head = 0
    return 0


cdef inline int ghost_forget_oldest(Ghost g) except -1:
    """Forget the oldest key remembered (the ghost holds at least one)."""
    while not ghost_live(g, g.head):
        g.head += 1
    del g.pos[g.order[g.head]]
    g.head += 1
    if g.head >= 32 and 2 * g.head >= len(g.order):
        ghost_compact(g)
    return 0


cdef inline int s3_remember(Ghost ghost, object key, Py_ssize_t main_size) except -1:
    """`key` was evicted from small: the ghost remembers it (a key it holds keeps its place),
    then forgets its oldest keys until it holds at most max(main_size, 1). A remember that leaves
    more than 2 * keys + 32 list entries past `head` compacts the list, so it stays within about
    twice the most keys the ghost held since, whatever is recalled."""
    cdef object n = len(ghost.order)
    if PyDict_SetDefault(ghost.pos, key, n) is <PyObject *>n:
        ghost.order.append(key)
        if len(ghost.order) - ghost.head > 2 * len(ghost.pos) + 32:
            ghost_compact(ghost)
    while len(ghost.pos) > max(main_size, 1):
        ghost_forget_oldest(ghost)
    return 0


# -- the prefix pool's evictable blocks, in one of the five policies' orders -------------------
cdef enum:
    Q_SMALL = 0       # BlockOrder.queue codes (s3fifo)
    Q_MAIN = 1


# The idle cached blocks of a prefix pool in eviction order. A block enters when it becomes idle
# (order_insert) and leaves on a hit or its eviction (order_remove); the heap policies' keys come
# from the pool's per-block arrays below, read when the block enters.
ctypedef struct BlockOrder:
    int policy            # P_LRU .. P_BELADY
    DList lst[2]          # lru: lst[0]; s3fifo: lst[Q_SMALL], lst[Q_MAIN] (the pool's links)
    KeyHeap heap          # fifo: (store tick, 0); lfu: (hits, idle tick); belady: (-next use, idle tick)
    uint8_t *s3hits       # s3fifo: hit counts, saturating at S3_MAX_HITS
    uint8_t *queue        # s3fifo: Q_SMALL / Q_MAIN, set when the block is stored (order_stored)
    int64_t *stored_tick  # fifo's key
    int32_t *hits         # lfu's key: hits since the block was taken
    double *next_use      # belady's key


cdef inline bint order_is_list(const BlockOrder *o) noexcept nogil:
    """Whether the policy orders blocks in lst (lru, s3fifo) rather than in the heap."""
    return o.policy == P_LRU or o.policy == P_S3FIFO


cdef inline void order_insert(BlockOrder *o, int32_t b, int64_t tick) noexcept nogil:
    """Block b (in no order) became idle at `tick` (a counter that only grows)."""
    cdef int p = o.policy
    if p == P_LRU:
        list_insert(&o.lst[0], b)
    elif p == P_S3FIFO:
        dlist_push_back(&o.lst[o.queue[b]], b)
    else:
        if p == P_FIFO:
            o.heap.key1[b] = o.stored_tick[b]
            o.heap.key2[b] = 0
        elif p == P_LFU:
            o.heap.key1[b] = o.hits[b]
            o.heap.key2[b] = tick
        else:
            o.heap.key1[b] = -o.next_use[b]
            o.heap.key2[b] = tick
        heap_push(&o.heap, b)


cdef inline void order_remove(BlockOrder *o, int32_t b) noexcept nogil:
    """Block b (in the order) leaves it: a hit, or its eviction."""
    cdef int p = o.policy
    if p == P_LRU:
        dlist_remove(&o.lst[0], b)
    elif p == P_S3FIFO:
        dlist_remove(&o.lst[o.queue[b]], b)
    else:
        heap_remove(&o.heap, b)


cdef inline int32_t order_victim(BlockOrder *o, Py_ssize_t total) noexcept nogil:
    """The next block to evict of the `total` (> 0) in the order, not removed (s3fifo keeps the
    promotions it makes on the way)."""
    cdef int p = o.policy
    if p == P_LRU:
        return list_victim(&o.lst[0])
    if p == P_S3FIFO:
        return s3_victim(&o.lst[Q_SMALL], &o.lst[Q_MAIN], o.s3hits, o.queue, Q_MAIN, total, False)
    return o.heap.items[0]


cdef inline int order_stored(BlockOrder *o, Ghost ghost, int32_t b, object key) except -1:
    """Block b was just indexed under hash `key`: s3fifo files it for main if the ghost
    remembers the hash, else for small (it enters that queue whenever it is idle)."""
    if o.policy == P_S3FIFO:
        o.queue[b] = Q_MAIN if s3_recall(ghost, key) else Q_SMALL
    return 0


cdef inline int order_evicted(BlockOrder *o, Ghost ghost, int32_t b, object key) except -1:
    """Block b, hashed `key`, was just evicted (order_remove'd): s3fifo's ghost remembers the
    hash of a block evicted from small."""
    if o.policy == P_S3FIFO and o.queue[b] == Q_SMALL:
        s3_remember(ghost, key, o.lst[Q_MAIN].size)
    return 0
