# Included by _core.pyx: the cache's per-operation path (put, victim choice, eviction).

cimport cython
from cpython.dict cimport PyDict_Next
import heapq

from .vocab import EVICTION_REASONS as _REASONS
import time as _time


@cython.no_gc
@cython.freelist(64)
cdef class Entry:
    """One cached key: the pool allocation `id` holding `nbytes` requested bytes.

    NOTE: compiled and outside the cyclic GC (its fields are strings and numbers, which can
    form no cycle), so thousands of live entries add nothing to full collections.
    """

    cdef public str key
    cdef public int64_t id
    cdef public int64_t nbytes
    cdef public int64_t allocated_bytes
    cdef public object priority
    cdef public bint pinned
    cdef public object ttl_s
    cdef public object expires_at
    cdef public double created_at
    cdef public double last_access
    cdef public int64_t hits
    cdef public int64_t data_bytes  # length of the payload last written; reads return exactly that
    cdef readonly int32_t pslot     # slot in its priority's policy structure (-1: not filed);
                                    # read-only to Python: the compiled policy trusts it
    cdef int64_t iseq               # insertion number in the cache's key index (its order)

    def __init__(self, str key, int64_t id, int64_t nbytes, int64_t allocated_bytes,
                 priority=0, bint pinned=False, ttl_s=None, expires_at=None,
                 double created_at=0.0, double last_access=0.0, int64_t hits=0,
                 int64_t data_bytes=0):
        self.key, self.id, self.nbytes, self.allocated_bytes = key, id, nbytes, allocated_bytes
        self.priority, self.pinned, self.ttl_s, self.expires_at = priority, pinned, ttl_s, expires_at
        self.created_at, self.last_access, self.hits, self.data_bytes = created_at, last_access, hits, data_bytes
        self.pslot = -1

    def _poke(self, str field, int32_t value) -> int:
        """Overwrite `pslot` and return what it held (corruption tests only: check() must
        then name the damage)."""
        if field != "pslot":
            raise KeyError(field)
        old, self.pslot = self.pslot, value
        return old

    def __repr__(self) -> str:
        return (f"Entry(key={self.key!r}, id={self.id}, nbytes={self.nbytes}, "
                f"allocated_bytes={self.allocated_bytes}, priority={self.priority!r}, "
                f"pinned={self.pinned}, ttl_s={self.ttl_s!r}, hits={self.hits})")

    def to_dict(self, double now, pool=None) -> dict:
        out = {
            "key": self.key,
            "id": self.id,
            "bytes": self.nbytes,
            "allocated_bytes": self.allocated_bytes,
            "priority": self.priority,
            "pinned": self.pinned,
            "ttl_s": self.ttl_s,
            "expires_in_s": None if self.expires_at is None else max(0.0, self.expires_at - now),
            "age_s": now - self.created_at,
            "idle_s": now - self.last_access,
            "hits": self.hits,
            "data_bytes": self.data_bytes,
        }
        if pool is not None:
            from .pools.pool import runs_of
            out["blocks"] = runs_of(pool.block_ids(self.id))
        return out


@cython.no_gc
@cython.freelist(16)
cdef class PutResult:
    """The entry a put left, whether it was created, and the keys evicted to make room.

    NOTE: outside the cyclic GC like Entry: it holds an Entry and a list of key strings, which
    cannot lead back to it.
    """

    cdef public Entry entry
    cdef public bint created
    cdef public list evicted

    def __init__(self, Entry entry, bint created, list evicted=None):
        self.entry, self.created = entry, created
        self.evicted = [] if evicted is None else evicted

    def __repr__(self) -> str:
        return f"PutResult(entry={self.entry!r}, created={self.created}, evicted={self.evicted!r})"


include "_keyindex.pxi"


cdef class CacheCore:
    """The per-operation path of KVCache (its base class): put, victim choice, eviction and
    drop, compiled. KVCache (allocator/cache/cache.py) adds validation messages, refresh/resize,
    TTL sweeps, listing and check(); the state is shared through these attributes.

    Victim order: expired (TTL) entries first, then lowest priority first, then the policy
    within a priority. Pinned entries are never evicted and sit in no policy structure. On a
    paged pool, allocation and free go straight to its compiled core; with the default clock
    (time.monotonic) the time is read without a Python call. The `_name` def methods wrap the
    `c_name` C methods for the Python side.
    """

    cdef public object pool
    cdef public object clock
    cdef public int64_t capacity_bytes
    cdef public int64_t used_bytes
    cdef public int64_t pinned_bytes
    cdef public int64_t hits
    cdef public int64_t misses
    cdef public int64_t refusals
    cdef public str _policy
    cdef public KeyIndex _entries    # key -> Entry
    cdef public dict _key_of         # allocation id -> key (other pools; a paged pool tags its records)
    cdef public dict _by_priority    # priority -> policy structure (non-empty ones)
    cdef public list _ttl_heap       # (expires_at, key, id), stale records skipped lazily
    cdef PagedCore pcore
    cdef EventRing ev
    cdef int64_t bb
    cdef bint exact, filters, mono
    cdef uint8_t code_put, code_evict
    cdef object _policies, _oom_type
    cdef str _reason, _policy_named
    cdef int64_t _reason_sid, _policy_sid, _reason_idx
    cdef int64_t _evicted[8]         # per EVICTION_REASONS (the `evictions` property)

    @property
    def evictions(self) -> dict:
        """Evictions so far by reason (EVICTION_REASONS)."""
        return {r: self._evicted[i] for i, r in enumerate(_REASONS)}

    @evictions.setter
    def evictions(self, dict counts) -> None:
        for i, r in enumerate(_REASONS):
            self._evicted[i] = counts.get(r, 0)

    def _bind(self, policies, oom_type) -> None:
        """Cache what the hot path needs from the pool (KVCache.__init__ calls this)."""
        pool = self.pool
        core = getattr(pool, "_core", None)
        self.pcore = core if isinstance(core, PagedCore) else None
        self.ev = pool.events
        self.bb = pool.block_bytes
        self.exact = pool.exact_footprint
        self.filters = pool.filters_victims
        self.mono = self.clock is _time.monotonic
        self.code_put = self.ev.code("put")
        self.code_evict = self.ev.code("evict")
        self._policies, self._oom_type = policies, oom_type

    cdef inline double now(self) except? -1.0:
        return mono_time() if self.mono else self.clock()

    # -- policy structures ---------------------------------------------------------------
    cdef KeyedPolicy c_struct(self, priority):
        s = self._by_priority.get(priority)
        if s is None:  # slotted: the entries keep their slots, the policy keeps no key dict
            s = self._by_priority[priority] = self._policies[self._policy](slotted=True)
        return <KeyedPolicy>s

    cdef int c_file(self, Entry e, int64_t freq=0) except -1:
        cdef KeyedPolicy s = self.c_struct(e.priority)
        e.pslot = (<LFU>s).insert_freq_slot(e.key, freq) if freq > 0 and isinstance(s, LFU) \
            else s.c_insert_slot(e.key)
        return 0

    cdef int c_unfile(self, Entry e, bint evicted) except -1:
        cdef KeyedPolicy s = self._by_priority[e.priority]
        s.c_remove_slot(e.pslot, evicted)
        e.pslot = -1
        if s.count == 0:
            del self._by_priority[e.priority]
        return 0

    def _struct(self, priority):
        return self.c_struct(priority)

    def _file(self, Entry entry, int64_t freq=0) -> None:
        """File `entry` in its priority's policy structure (lfu: at frequency `freq` if > 0)."""
        self.c_file(entry, freq)

    def _unfile(self, Entry entry, bint evicted=False) -> None:
        """Take `entry` out of its priority's policy structure; an emptied structure goes too, so
        the priorities scanned for a victim are only those that hold entries."""
        self.c_unfile(entry, evicted)

    def _touch(self, Entry entry) -> None:
        """A hit on unpinned `entry`, for its policy."""
        (<KeyedPolicy>self._by_priority[entry.priority]).c_touch_slot(entry.pslot)

    # -- eviction ------------------------------------------------------------------------
    cdef object c_next_victim(self, exclude):
        cdef Entry e
        cdef KeyedPolicy s
        heap = self._ttl_heap
        victim = None
        if heap:
            now = self.now()
            skipped = []
            while heap and heap[0][0] <= now:
                expires_at, key, aid = heap[0]
                e = self._entries.get(key)
                valid = e is not None and e.id == aid and e.expires_at == expires_at
                if valid and key != exclude and not e.pinned:
                    victim = key
                    break
                item = heapq.heappop(heap)
                if valid:  # pinned or being resized: still expired, so keep its record
                    skipped.append(item)
            for item in skipped:
                heapq.heappush(heap, item)
            if victim is not None:
                return victim
        by_priority = self._by_priority
        cdef Py_ssize_t dpos = 0
        cdef PyObject *dkey
        cdef PyObject *dval
        if len(by_priority) == 1:  # one priority in use: its structure, without an iterator
            PyDict_Next(by_priority, &dpos, &dkey, &dval)
            s = <KeyedPolicy>dval
            if s.count:
                key = s.c_victim()
                if exclude is None or key != exclude:  # (str != None is a slow compare)
                    return key
        for prio in (by_priority if len(by_priority) == 1 else sorted(by_priority)):
            s = by_priority[prio]
            if not s.count:
                continue
            key = s.c_victim()
            if key == exclude:  # the entry being resized is never its own victim
                order = s.order(2)
                key = order[1] if len(order) > 1 else None
                if key is None:
                    continue
            return key
        return None

    def _next_victim(self, exclude, helps=None):
        """The next key to evict (never `exclude`, never pinned). With `helps`, a predicate on
        allocation ids, the first such key in eviction order whose memory `helps` accepts."""
        cdef Entry e
        if helps is not None:
            for e in (<object>self).entries():
                if not e.pinned and e.key != exclude and helps(e.id):
                    return e.key
            return None
        return self.c_next_victim(exclude)

    def _evictable_bytes(self, exclude) -> int:
        return self.c_evictable(exclude)

    cdef int64_t c_evictable(self, exclude) except? -1:
        cdef int64_t spare = self.used_bytes - self.pinned_bytes
        cdef Entry e
        if exclude is not None:
            e = self._entries.get(exclude)
            if e is not None and not e.pinned:
                spare -= e.allocated_bytes
        return spare

    cdef int c_make_room(self, int64_t need, exclude, list evicted, helps, double now=-1.0,
                         double wall=-1.0) except -1:
        """(`now` / `wall`: the caller's clock readings, so one put reads each clock once.)"""
        pool = self.pool
        cdef int64_t over = self.used_bytes + need - self.capacity_bytes
        cdef int64_t free_blocks = (self.pcore.free_count if self.pcore is not None
                                    else pool.num_blocks - pool.used_blocks)
        cdef int64_t short = need - free_blocks * self.bb
        cdef int64_t spare
        cdef Entry e
        if over <= 0 and short <= 0:
            return 0
        spare = self.c_evictable(exclude)
        if over > spare:
            raise (<object>self)._refuse_budget(need)
        if short > spare:
            raise (<object>self)._refuse_pool(need)
        cdef KeyIndex entries = self._entries
        while self.used_bytes + need > self.capacity_bytes:
            key = ((helps is not None and self._next_victim(exclude, helps))
                   or self.c_next_victim(exclude))
            e = entries.c_get(<str>key, PyObject_Hash(key))
            if now < 0:
                now, wall = self.now(), wall_time()
            expired = e.expires_at is not None and e.expires_at <= now
            self.c_evict_entry(e, "ttl" if expired else "capacity", now, wall)
            evicted.append(key)
        self.c_prefetch_victims()
        return 0

    cdef int c_prefetch_victims(self) except -1:
        """Start loading what the next evicting puts will read, while this one finishes: with
        one priority in use and no TTL, the next victims are the head of the policy's order, and
        each of the next three gets one step of its lookup asked for, one put ahead of need:
        the third's key string, the second's key-index cell (by the hash in its string, asked
        for one put ago), the first's entry (from its cell, asked for one put ago)."""
        cdef Py_ssize_t dpos = 0
        cdef PyObject *dkey
        cdef PyObject *dval
        cdef KeyedPolicy s
        cdef int32_t v1, v2, v3
        if self._ttl_heap or len(self._by_priority) != 1:
            return 0
        PyDict_Next(self._by_priority, &dpos, &dkey, &dval)
        s = <KeyedPolicy>dval
        if s.count < 3:
            return 0
        v1 = s.c_victim_slot()
        v2 = s.c_victim_after(v1)
        v3 = s.c_victim_after(v2)
        if not (0 <= v1 < s.cap and 0 <= v2 < s.cap and 0 <= v3 < s.cap):
            return 0  # a hint only: a policy without one, or a damaged list, gets no prefetch
        __builtin_prefetch(PyList_GET_ITEM(s._keys, v3))
        self._entries.c_prefetch_cell(PyObject_Hash(<object>PyList_GET_ITEM(s._keys, v2)))
        self._entries.c_prefetch_entry(PyObject_Hash(<object>PyList_GET_ITEM(s._keys, v1)))
        return 0

    def _make_room(self, int64_t need, exclude, list evicted, helps=None) -> None:
        """Evict (reason capacity, or ttl for expired entries) until `need` more bytes fit
        under the capacity; refuse up front when even evicting every candidate would not do.
        With `helps` (see `Pool.victim_filter`), victims whose memory the request can also use
        go first, so one eviction frees both budget and placement."""
        self.c_make_room(need, exclude, evicted, helps)

    cdef int c_evict(self, str key, str reason) except -1:
        return self.c_evict_entry(self._entries[key], reason, self.now(), wall_time())

    cdef int c_evict_entry(self, Entry entry, str reason, double now, double wall) except -1:
        cdef str key = entry.key
        self.c_drop(entry, True, wall)
        cdef int64_t *v = self.ev.record_keyed(self.code_evict, key, wall)
        v[0] = entry.nbytes
        v[1] = entry.allocated_bytes // self.bb
        if reason is not self._reason:  # the string table index of the last reason / policy
            self._reason_idx = _REASONS.index(reason)
            self._reason, self._reason_sid = reason, self.ev.intern(reason)
        self._evicted[self._reason_idx] += 1
        if self._policy is not self._policy_named:
            self._policy_named, self._policy_sid = self._policy, self.ev.intern(self._policy)
        v[2] = self._reason_sid
        v[3] = self._policy_sid
        v[4] = f2i(now - entry.created_at)
        v[5] = f2i(now - entry.last_access)
        return 0

    def _evict(self, str key, str reason) -> None:
        self.c_evict(key, reason)

    cdef int c_drop(self, Entry entry, bint evicted, double wall) except -1:
        self._entries.c_remove(entry)
        if self.pcore is None:
            del self._key_of[entry.id]
        if entry.pinned:
            self.pinned_bytes -= entry.allocated_bytes
        else:
            self.c_unfile(entry, evicted)
        self.used_bytes -= entry.allocated_bytes
        cdef Py_ssize_t pos
        if self.pcore is not None:
            pos = self.pcore.find(entry.id)
            if pos >= 0:
                self.pcore.free_slot(pos, wall)
                return 0
        self.pool.free(entry.id)
        return 0

    def _drop(self, Entry entry, bint evicted) -> None:
        self.c_drop(entry, evicted, wall_time())

    def key_of(self, aid):
        """The key of the entry held in allocation `aid`, or None."""
        if self.pcore is not None:
            return self.pcore.tag_of(aid)
        return self._key_of.get(aid)

    def entry_ids(self):
        """The allocation ids of every entry, as an int64 numpy array (no order)."""
        if self.pcore is not None:
            return self.pcore.tagged_ids()
        return np.fromiter(self._key_of, dtype=np.int64, count=len(self._key_of))

    def _keys_by_id(self) -> dict:
        """{allocation id: key} of every entry, as the id map holds it (for check())."""
        return self.pcore.tagged() if self.pcore is not None else dict(self._key_of)

    # -- put -----------------------------------------------------------------------------
    def put(self, key, nbytes, priority=None, ttl_s=None, pinned=None):
        """Insert or refresh `key` with `nbytes`; evict others until it fits.

        An existing key is touched and resized if `nbytes` differs; its priority, TTL and pin
        change only where given (None keeps them; a new entry gets priority 0, no TTL,
        unpinned). Raises InvalidRequest (bad key/size/ttl, or a size above the capacity) and
        OutOfMemory (nothing evictable is left); on either, existing entries are unchanged
        unless evictions were needed first (see the class NOTE).
        """
        cdef object me = self
        if not (type(key) is str and 0 < len(<str>key) <= 256 and type(nbytes) is int
                and nbytes > 0 and priority is None and ttl_s is None and pinned is None):
            me._validate(key, nbytes, priority, ttl_s, pinned)
            key = exact_key(key)
        cdef Py_hash_t h = PyObject_Hash(key)
        cdef int64_t nb = nbytes if nbytes <= self.capacity_bytes else self.capacity_bytes + 1
        cdef int64_t need = ((nb + self.bb - 1) // self.bb) * self.bb if self.exact else self.pool.footprint(nbytes)
        if need > self.capacity_bytes:
            raise me._too_large(nbytes, self.pool.footprint(nbytes))
        cdef double now = self.now()
        cdef double wall = wall_time()
        entry = self._entries.c_get(<str>key, h)
        if entry is not None:
            return me._refresh(entry, nbytes, priority, ttl_s, pinned, now)
        priority = priority or 0
        cdef bint pin = bool(pinned)
        cdef list evicted = []
        pool = self.pool
        helps = pool.victim_filter(nbytes) if self.filters else None
        self.c_make_room(need, None, evicted, helps, now, wall)
        cdef uint8_t state = 3 if pin else 2
        cdef int64_t aid  # a C integer: the compiled path never boxes the new id
        if self.pcore is not None and need <= self.pcore.free_count * self.bb:
            aid = self.pcore.alloc_one(nb, need // self.bb, state, wall)
        else:
            try:
                aid = pool.allocate(nbytes, state)
            except self._oom_type:
                aid = me._allocate(nbytes, state, None, evicted, helps)
        cdef int64_t held = need if self.exact else pool.held_bytes(aid)
        if held > need and self.used_bytes + held - self.c_evictable(None) > self.capacity_bytes:
            # A tiered pool fell back to a larger block than the budget can hold even after
            # evicting everything evictable: refuse rather than overrun the capacity.
            pool.free(aid)
            raise me._refuse_budget(held)
        cdef Entry e = Entry.__new__(Entry)  # fields set here: no argument parsing
        e.pslot = -1
        e.key, e.id, e.nbytes, e.allocated_bytes = key, aid, nb, held
        e.priority, e.pinned, e.ttl_s = priority, pin, ttl_s
        e.expires_at = None if ttl_s is None else now + ttl_s
        e.created_at = e.last_access = now
        self._entries.c_insert(e, h)
        if self.pcore is not None:
            self.pcore.set_tag(aid, key)
        else:
            self._key_of[aid] = key
        self.used_bytes += held
        if pin:
            self.pinned_bytes += held
        else:
            e.pslot = self.c_struct(priority).c_insert_slot(key)
        if ttl_s is not None:
            heapq.heappush(self._ttl_heap, (e.expires_at, key, aid))
        if held > need:  # a tiered pool fell back to a larger tier than estimated
            me._shed_excess(key, evicted)
        cdef int64_t *v = self.ev.record_keyed(self.code_put, key, wall)
        v[0] = e.id
        v[1] = e.nbytes
        v[2] = held // self.bb
        cdef PutResult out = PutResult.__new__(PutResult)
        out.entry, out.created, out.evicted = e, True, evicted
        return out
