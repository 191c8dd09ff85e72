# Included by _core.pyx: the cache's eviction policies over intrusive int32 lists. Their
# algorithms (list order, S3-FIFO's victim loop and ghost) are allocator/_eviction.pxi's, shared
# with the prefix pool's PrefixCore; here they are given slots, keys and the cache's API.


cdef class Ghost:
    """S3-FIFO's ghost (declared, with what s3_remember / s3_recall do to it, in _eviction.pxi):
    the keys evicted from small, oldest first. Python sees a read-only container of keys."""

    def __cinit__(self):
        self.pos = {}
        self.order = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.pos)

    def __contains__(self, key) -> bool:
        return key in self.pos

    def _entries(self) -> int:
        """How many list entries the ghost holds past the forgotten ones, stale included (for
        the tests that hold it to its bound: about twice the most keys it held lately + 32)."""
        return len(self.order) - self.head

    def __iter__(self):
        """The keys remembered, oldest first."""
        cdef Py_ssize_t i
        return iter([self.order[i] for i in range(self.head, len(self.order)) if ghost_live(self, i)])


cdef class _Bucket:
    """One list of a policy (LFU frequency bucket, S3-FIFO queue) over the policy's arrays."""
    cdef DList l


cdef class KeyedPolicy:
    """Base of the compiled eviction policies: keys get a slot (dict key -> slot, the only
    Python-level structure), and every order is an intrusive DList over the slots' int32
    prev/next arrays, so insert / touch / remove / victim are O(1) C list operations.

    Every policy answers `insert(key)`, `touch(key)` (a hit), `remove(key, evicted)`,
    `victim()` (the next key to evict, without removing it), `order(limit)` (keys in eviction
    order, next victim first), `keys()` and `len()`. Invariant: the keys held are those
    inserted and not yet removed, each in exactly one of the policy's lists; `check()` says
    which list is broken.

    NOTE: the arrays double when full (a copy, then every list is re-pointed): policies hold
    cache entries, whose number is not known up front, unlike a pool's blocks.

    Slotted mode (`slotted=True`, what the KV cache uses): the caller keeps each key's slot
    (`Entry.pslot`) and calls the `c_*_slot` methods, so no key -> slot dict is kept or probed
    (a 65,536-entry dict out of the CPU caches costs a put ~200 ns); the key API (insert,
    touch, remove by key) is refused there, while keys(), len(), order(), victim() and
    check() work in both modes.
    """

    name = "base"

    cdef dict _slot
    cdef list _keys
    cdef object _prev_arr, _next_arr
    cdef int32_t *prev
    cdef int32_t *next
    cdef Py_ssize_t cap
    cdef int32_t unused         # unused slots, chained through `next`
    cdef list _lists             # every _Bucket, re-pointed when the arrays grow
    cdef readonly bint slotted   # the caller keeps the slots: no key -> slot dict
    cdef Py_ssize_t count        # keys held

    def __cinit__(self, *args, slotted=False, **kw):
        self.slotted = slotted
        self.count = 0
        self._slot = {}
        self._keys = []
        self._lists = []
        self.cap = 0
        self.unused = NIL
        self._grow()

    cdef _Bucket new_list(self):
        cdef _Bucket b = _Bucket()
        b.l.prev, b.l.next = self.prev, self.next
        b.l.head = b.l.tail = NIL
        b.l.size = 0
        self._lists.append(b)
        return b

    cdef int _grow(self) except -1:
        cdef Py_ssize_t old = self.cap, cap = max(16, 2 * old), i
        cdef _Bucket b
        prev = np.full(cap, DETACHED, dtype=np.int32)
        nxt = np.full(cap, DETACHED, dtype=np.int32)
        if old:
            prev[:old] = self._prev_arr
            nxt[:old] = self._next_arr
        self._prev_arr, self._next_arr = prev, nxt
        self.prev, self.next = i32_ptr(prev), i32_ptr(nxt)
        self._keys.extend([None] * (cap - old))
        for i in range(cap - 1, old - 1, -1):  # only called with no unused slot left
            self.next[i] = self.unused
            self.unused = <int32_t>i
        self.cap = cap
        for b in self._lists:
            b.l.prev, b.l.next = self.prev, self.next
        self._on_grow(old)
        return 0

    cdef int _on_grow(self, Py_ssize_t old) except -1:
        return 0

    cdef int32_t acquire(self, key) except -2:
        """A fresh, DETACHED slot for `key`; KeyError when the key is already held (one dict
        probe does both: setdefault). Slotted: no dict, the caller knows the key is new."""
        if self.unused == NIL:
            self._grow()
        cdef int32_t s = self.unused
        cdef object slot
        if not self.slotted:
            slot = s
            if PyDict_SetDefault(self._slot, key, slot) is not <PyObject *>slot:
                raise KeyError(f"{key!r} is already held")
        self.unused = self.next[s]
        self.prev[s] = self.next[s] = DETACHED
        list_put(self._keys, s, key)
        self.count += 1
        return s

    cdef void release(self, int32_t s):
        """Forget the (already unlinked) slot `s` and its key."""
        if not self.slotted:
            del self._slot[self._keys[s]]
        list_put(self._keys, s, None)
        self.next[s] = self.unused
        self.unused = s
        self.count -= 1

    cdef int32_t slot_of(self, key) except -2:
        """The slot of `key` (key API: refused in slotted mode). KeyError when not held."""
        if self.slotted:
            raise TypeError(f"a slotted {self.name} policy is driven by slot, not by key")
        return self._slot[key]

    cdef list walk_slots(self, _Bucket b):
        """The slots of list `b`, head first: at most its size, each checked before its link
        is followed (CorruptState at a bad one; check() names it)."""
        cdef list out = []
        cdef int32_t s = b.l.head
        while s != NIL:
            if s < 0 or s >= self.cap or len(out) >= b.l.size:
                raise _CorruptState(f"{self.name}: a list links to slot {s} (check() names it)")
            out.append(s)
            s = self.next[s]
        return out

    cdef list walk(self, _Bucket b, Py_ssize_t limit):
        cdef list out = []
        cdef int32_t s = b.l.head
        while s != NIL and (limit < 0 or len(out) < limit):
            if s < 0 or s >= self.cap or len(out) >= b.l.size:
                raise _CorruptState(f"{self.name}: a list links to slot {s} (check() names it)")
            out.append(self._keys[s])
            s = self.next[s]
        return out

    # C-level entry points. By slot (the cache, slotted): c_insert_slot returns the key's new
    # slot, the others take it. By key (the def methods wrap these): a dict probe each.
    cdef int32_t c_insert_slot(self, key) except -2:
        raise NotImplementedError

    cdef int c_remove_slot(self, int32_t s, bint evicted) except -1:
        raise NotImplementedError

    cdef int c_touch_slot(self, int32_t s) except -1:
        raise NotImplementedError

    cdef int32_t c_victim_slot(self) except -2:
        raise NotImplementedError

    cdef int32_t c_victim_after(self, int32_t s) noexcept:
        """The slot evicted after slot `s` if nothing changes, or NIL when unknown (a hint)."""
        return NIL

    cdef int c_insert(self, key) except -1:
        if not self.slotted and key in self._slot:
            raise KeyError(f"{key!r} is already held")
        self.c_insert_slot(key)
        return 0

    cdef int c_remove(self, key, bint evicted) except -1:
        return self.c_remove_slot(self.slot_of(key), evicted)

    cdef int c_touch(self, key) except -1:
        return self.c_touch_slot(self.slot_of(key))

    cdef object c_victim(self):
        """The next key to evict (not removed), or None when empty."""
        if self.count == 0:
            return None
        return self._keys[self.c_victim_slot()]

    # Slot API from Python (tests; the cache calls the c_* methods, with slots it keeps).
    def _insert_slot(self, key) -> int:
        return self.c_insert_slot(key)

    def _touch_slot(self, int32_t s) -> None:
        self._held_slot(s)
        self.c_touch_slot(s)

    def _remove_slot(self, int32_t s, bint evicted=False) -> None:
        self._held_slot(s)
        self.c_remove_slot(s, evicted)

    cdef int _held_slot(self, int32_t s) except -1:
        if not 0 <= s < self.cap or self._keys[s] is None:
            raise KeyError(f"slot {s} holds no key")
        return 0

    def insert(self, key) -> None:
        if self.slotted:
            raise TypeError(f"a slotted {self.name} policy is driven by slot, not by key")
        self.c_insert(key)

    def remove(self, key, evicted=False) -> None:
        self.c_remove(key, evicted)

    def victim(self):
        return self.c_victim()

    def touch(self, key) -> None:
        self.c_touch(key)

    cdef list check_list(self, _Bucket b, str what):
        """Problems with list `b`: walks at most its size (and never more than the slots),
        checking each slot before reading its links."""
        cdef int32_t s = b.l.head, p = NIL
        cdef Py_ssize_t n = 0
        while s != NIL:
            if s < 0 or s >= self.cap:
                return [f"{self.name} {what}: links to slot {s}, outside 0..{self.cap - 1}"]
            if self.prev[s] != p:
                return [f"{self.name} {what}: {self._keys[s]!r} has a broken back link"]
            if self._keys[s] is None:
                return [f"{self.name} {what}: holds an unused slot {s}"]
            p, s = s, self.next[s]
            n += 1
            if n > b.l.size or n > self.cap:
                return [f"{self.name} {what}: the list runs past its size of {b.l.size} (a cycle or a stray link)"]
        if p != b.l.tail or n != b.l.size:
            return [f"{self.name} {what}: tail or size disagrees with the links ({n} walked, size {b.l.size})"]
        return []

    cdef list check_slots(self):
        """Problems with the slots outside the lists: the unused ones form one chain (walked at
        most as far as there are unused slots), and `count` keys are held."""
        cdef int32_t s = self.unused
        cdef Py_ssize_t n = 0, free = self.cap - self.count
        if len(self._keys) != self.cap:
            return [f"{self.name}: {len(self._keys)} key slots for a capacity of {self.cap}"]
        held = self.cap - self._keys.count(None)
        if held != self.count:
            return [f"{self.name}: {held} slots hold keys, the count says {self.count}"]
        while s != NIL:
            if s < 0 or s >= self.cap:
                return [f"{self.name}: the unused-slot chain runs to slot {s}, outside 0..{self.cap - 1}"]
            if self._keys[s] is not None:
                return [f"{self.name}: the unused-slot chain runs into {self._keys[s]!r}'s slot {s}"]
            n += 1
            if n > free:
                return [f"{self.name}: the unused-slot chain runs past the {free} unused slots"]
            s = self.next[s]
        if n != free:
            return [f"{self.name}: the unused-slot chain holds {n} slots, {free} are unused"]
        return []

    def _raw(self) -> dict:
        """The slot arrays as writable numpy views (`prev`, `next`, and a policy's own), for
        corruption tests and debugging: a write bypasses every invariant, and check() must
        then name the damage."""
        return {"prev": self._prev_arr, "next": self._next_arr}

    def _poke(self, str field, int64_t value) -> int:
        """Overwrite one scalar field, `unused`, `count`, or `list<i>.head|tail|size` of the
        i-th list, and return what it held (corruption tests only, like `_raw`)."""
        cdef _Bucket b
        cdef int64_t old
        if field == "unused":
            old, self.unused = self.unused, <int32_t>value
        elif field == "count":
            old, self.count = self.count, value
        elif field.startswith("list") and "." in field:
            index, part = field[4:].split(".")
            b = self._lists[int(index)]
            if part == "head":
                old, b.l.head = b.l.head, <int32_t>value
            elif part == "tail":
                old, b.l.tail = b.l.tail, <int32_t>value
            elif part == "size":
                old, b.l.size = b.l.size, value
            else:
                raise KeyError(field)
        else:
            raise KeyError(field)
        return old

    def keys(self) -> set:
        if self.slotted:
            return {k for k in self._keys if k is not None}
        return set(self._slot)

    def key_at(self, Py_ssize_t s):
        """The key in slot `s` (None: unused or outside)."""
        return self._keys[s] if 0 <= s < self.cap else None

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key) -> bool:
        return key in (self.keys() if self.slotted else self._slot)


cdef class LRU(KeyedPolicy):
    """Least recently used: one list in recency order, oldest first (O(1) touch and evict)."""

    name = "lru"
    cdef _Bucket order_

    def __cinit__(self, *args, **kw):
        self.order_ = self.new_list()

    cdef int32_t c_insert_slot(self, key) except -2:
        cdef int32_t s = self.acquire(key)
        list_insert(&self.order_.l, s)
        return s

    cdef int c_touch_slot(self, int32_t s) except -1:
        list_touch(&self.order_.l, s)
        return 0

    cdef int c_remove_slot(self, int32_t s, bint evicted) except -1:
        dlist_remove(&self.order_.l, s)
        self.release(s)
        return 0

    cdef int32_t c_victim_slot(self) except -2:
        return list_victim(&self.order_.l)

    cdef int32_t c_victim_after(self, int32_t s) noexcept:
        return self.next[s] if 0 <= s < self.cap else NIL

    def order(self, limit=None) -> list:
        return self.walk(self.order_, -1 if limit is None else limit)

    def check(self) -> list:
        problems = self.check_slots() + self.check_list(self.order_, "order")
        if self.order_.l.size != self.count:
            problems.append(f"{self.name}: {self.count} keys, {self.order_.l.size} in the order")
        return problems


cdef class FIFO(LRU):
    """First in, first out: insertion order; a hit changes nothing."""

    name = "fifo"

    cdef int c_touch_slot(self, int32_t s) except -1:
        return 0


cdef class LFU(KeyedPolicy):
    """Least frequently used, oldest first among equals: one list per frequency (O(1)).

    `freq[s]` is the key's hit count + 1; bucket f holds the keys of frequency f in the order
    they reached it; `min_freq` is the lowest non-empty frequency (recomputed on removal only
    when its bucket empties: a scan of the bucket dict, whose size is the number of distinct
    frequencies).
    """

    name = "lfu"
    cdef object _freq_arr
    cdef int64_t *freq
    cdef dict _buckets          # frequency -> _Bucket (non-empty ones only)
    cdef int64_t min_freq

    def __cinit__(self, *args, **kw):
        self._buckets = {}
        self.min_freq = 0
        self._on_grow(0)  # the base's __cinit__ grew the slots before this type's hook was set

    cdef int _on_grow(self, Py_ssize_t old) except -1:
        f = np.zeros(self.cap, dtype=np.int64)
        if old:
            f[:old] = self._freq_arr
        self._freq_arr = f
        cdef int64_t[::1] mv = f
        self.freq = &mv[0]
        return 0

    def _raw(self) -> dict:
        return {**KeyedPolicy._raw(self), "freq": self._freq_arr}

    cdef void _file(self, int32_t s, int64_t f):
        cdef _Bucket b = self._buckets.get(f)
        if b is None:
            b = self._buckets[f] = self.new_list()
        dlist_push_back(&b.l, s)
        self.freq[s] = f
        if self.min_freq == 0 or f < self.min_freq:
            self.min_freq = f

    cdef void _unfile(self, int32_t s):
        cdef int64_t f = self.freq[s]
        cdef _Bucket b = self._buckets[f]
        dlist_remove(&b.l, s)
        if b.l.size == 0:
            del self._buckets[f]
            self._lists.remove(b)
            if f == self.min_freq:
                self.min_freq = min(self._buckets) if self._buckets else 0

    def insert(self, key, int64_t freq=1) -> None:
        if self.slotted:
            raise TypeError("a slotted lfu policy is driven by slot, not by key")
        if key in self._slot:
            raise KeyError(f"{key!r} is already held")
        if freq < 1:
            raise ValueError(f"frequency must be >= 1, got {freq}")
        self._file(self.acquire(key), freq)

    cdef int32_t insert_freq_slot(self, key, int64_t freq) except -2:
        """Slotted insert with a starting frequency (a policy switch keeps hit counts)."""
        cdef int32_t s = self.acquire(key)
        self._file(s, max(freq, 1))
        return s

    cdef int32_t c_insert_slot(self, key) except -2:
        cdef int32_t s = self.acquire(key)
        self._file(s, 1)
        return s

    cdef int c_touch_slot(self, int32_t s) except -1:
        cdef int64_t f = self.freq[s]
        self._unfile(s)
        self._file(s, f + 1)
        return 0

    cdef int c_remove_slot(self, int32_t s, bint evicted) except -1:
        self._unfile(s)
        self.release(s)
        return 0

    cdef int32_t c_victim_slot(self) except -2:
        cdef _Bucket b = self._buckets[self.min_freq]
        return b.l.head

    def order(self, limit=None) -> list:
        cdef list out = []
        for f in sorted(self._buckets):
            out.extend(self.walk(self._buckets[f], -1))
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out

    def check(self) -> list:
        problems = self.check_slots()
        n = 0
        for f, b in self._buckets.items():
            broken = self.check_list(b, f"bucket {f}")
            problems += broken
            n += (<_Bucket>b).l.size
            for s in ([] if broken else self.walk_slots(b)):
                if self.freq[s] != f:
                    problems.append(f"lfu: {self._keys[s]!r} of frequency {self.freq[s]} is in bucket {f}")
        if n != self.count:
            problems.append(f"lfu: {self.count} keys, {n} in the buckets")
        if self._buckets and self.min_freq != min(self._buckets):
            problems.append(f"lfu: min frequency is {self.min_freq}, lowest bucket {min(self._buckets)}")
        return problems


cdef class S3FIFO(KeyedPolicy):
    """S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO, a main FIFO and a ghost list.

    New keys enter `small` (or `main` when the ghost remembers them). Eviction takes from `small`
    while it holds at least SMALL_SHARE of the keys: a key hit there since insertion is promoted
    to `main`, otherwise it is the victim (and remembered in `ghost`). From `main`, a key with
    hits left is reinserted with one hit fewer (a CLOCK-like second chance); otherwise it is the
    victim. Hit counts saturate at 3. `victim()` performs those promotions so that its answer is
    the key `remove(key, evicted=True)` will take next. The ghost keeps at most max(len(main),
    1) keys, oldest dropped first (a `Ghost`: keys only, no slot). The algorithm is
    allocator/_eviction.pxi's (s3_*), with the share of small computed as small >= 0.1 * total.
    """

    name = "s3fifo"
    SMALL_SHARE = 0.1
    MAX_FREQ = 3
    cdef _Bucket small, main
    cdef object _hits_arr
    cdef uint8_t *hits
    cdef uint8_t *in_small
    cdef object _small_arr
    cdef readonly Ghost _ghost  # (readonly: the tests read its bound)

    def __cinit__(self, *args, **kw):
        self.small = self.new_list()
        self.main = self.new_list()
        self._ghost = Ghost()
        self._on_grow(0)  # the base's __cinit__ grew the slots before this type's hook was set

    cdef int _on_grow(self, Py_ssize_t old) except -1:
        h = np.zeros(self.cap, dtype=np.uint8)
        m = np.zeros(self.cap, dtype=np.uint8)
        if old:
            h[:old] = self._hits_arr
            m[:old] = self._small_arr
        self._hits_arr, self._small_arr = h, m
        cdef uint8_t[::1] hv = h
        cdef uint8_t[::1] mv = m
        self.hits, self.in_small = &hv[0], &mv[0]
        return 0

    cdef int32_t c_insert_slot(self, key) except -2:
        cdef int32_t s = self.acquire(key)
        self.hits[s] = 0
        if s3_recall(self._ghost, key):
            self.in_small[s] = 0
            dlist_push_back(&self.main.l, s)
        else:
            self.in_small[s] = 1
            dlist_push_back(&self.small.l, s)
        return s

    cdef int c_touch_slot(self, int32_t s) except -1:
        s3_hit(self.hits, s)
        return 0

    cdef int c_remove_slot(self, int32_t s, bint evicted) except -1:
        if self.in_small[s]:
            dlist_remove(&self.small.l, s)
            if evicted:
                s3_remember(self._ghost, self._keys[s], self.main.l.size)
        else:
            dlist_remove(&self.main.l, s)
        self.release(s)
        return 0

    cdef int32_t c_victim_slot(self) except -2:
        return s3_victim(&self.small.l, &self.main.l, self.hits, self.in_small, 0,
                         self.small.l.size + self.main.l.size, True)

    def order(self, limit=None) -> list:
        """Eviction order, by running the policy on copies of the links, hit counts and queue
        flags (the live lists are walked, and so checked, first)."""
        self.walk_slots(self.small)
        self.walk_slots(self.main)
        cdef Py_ssize_t n = self.count if limit is None else min(limit, self.count)
        if n <= 0:
            return []
        prev, nxt = self._prev_arr.copy(), self._next_arr.copy()
        hits, flags = self._hits_arr.copy(), self._small_arr.copy()
        got = np.empty(n, dtype=np.int32)
        cdef int32_t[::1] pv = prev, nv = nxt, gv = got
        cdef uint8_t[::1] hv = hits, fv = flags
        cdef DList small = self.small.l, main = self.main.l
        small.prev = main.prev = &pv[0]
        small.next = main.next = &nv[0]
        cdef Py_ssize_t k = s3_drain(&small, &main, &hv[0], &fv[0], 0, True, &gv[0], n)
        return [self._keys[s] for s in got[:k].tolist()]

    def _raw(self) -> dict:
        return {**KeyedPolicy._raw(self), "hits": self._hits_arr, "in_small": self._small_arr}

    def ghost_keys(self) -> list:
        return list(self._ghost)

    def check(self) -> list:
        small = self.check_list(self.small, "small")
        main = self.check_list(self.main, "main")
        problems = self.check_slots() + small + main
        if self.small.l.size + self.main.l.size != self.count:
            problems.append(f"s3fifo: {self.count} keys, {self.small.l.size + self.main.l.size} queued")
        for s in ([] if small else self.walk_slots(self.small)):
            if not self.in_small[s]:
                problems.append(f"s3fifo: {self._keys[s]!r} is in small but marked main")
        for s in ([] if main else self.walk_slots(self.main)):
            if self.in_small[s]:
                problems.append(f"s3fifo: {self._keys[s]!r} is in main but marked small")
        if set(self._ghost) & self.keys():
            problems.append("s3fifo: a key is both held and remembered by the ghost")
        return problems
