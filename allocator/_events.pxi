# Included by _core.pyx: the event ring.

from libc.string cimport memcpy as _memcpy

cdef enum:
    NVALS = 6            # int64 values per compiled event
    FLAG_OBJ = 0x80      # kind byte: values are a Python tuple in _objs[slot]
    FLAG_KEY = 0x40      # kind byte: _objs[slot] holds the first field (a key), vals the rest
    HELD = 0xc0          # either: the slot holds a Python object to release
    CODE_MASK = 0x3f

# How the compiled kinds lay their fields out (one letter per field, in EVENT_FIELDS order):
# i = an int64 value, f = a double stored in a value, s = an index into the ring's string
# table, o = the object in _objs[slot] (first field only). Kinds not named here are recorded
# from Python as a tuple of values.
COMPILED_LAYOUTS = {"allocate": "iiii", "free": "ii", "put": "oiii", "evict": "oiissff"}


cdef inline int64_t f2i(double x) noexcept:
    cdef int64_t out
    _memcpy(&out, &x, sizeof(double))
    return out


cdef inline double i2f(int64_t x) noexcept:
    cdef double out
    _memcpy(&out, &x, sizeof(double))
    return out


cdef class EventRing:
    """Bounded ring of typed events with a monotonically increasing `seq`, in flat C arrays.

    Each slot holds a timestamp, a kind code and either up to NVALS int64 values (the numeric
    kinds the compiled pool records: no Python object at all) or a flat tuple of values (events
    recorded from Python, e.g. with string keys). Block ids that an event changed go into a
    separate int32 id ring (each event's ids contiguous there) and are read back with `after(..., block_ids=True)`.

    Invariants: the events held are exactly seqs last_seq-count+1 .. last_seq, slot (seq-1) %
    capacity; an event is dropped (oldest first) when the ring is full or when its block ids
    are about to be overwritten in the id ring, so every event still held has all its ids;
    readers see a gap in seq, never a reordering.
    """

    def __cinit__(self, Py_ssize_t capacity=10_000, fields=None, *args, **kw):
        if capacity <= 0:
            raise ValueError(f"event capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.last_seq = 0
        self.count = 0
        self.bcap = max(16 * capacity, 1 << 16)
        self.bpos = 0
        ts = np.zeros(capacity, dtype=np.float64)
        kind = np.zeros(capacity, dtype=np.uint8)
        vals = np.zeros(capacity * NVALS, dtype=np.int64)
        boff = np.zeros(capacity, dtype=np.int64)
        bn = np.zeros(capacity, dtype=np.int32)
        bring = np.zeros(self.bcap, dtype=np.int32)
        aux = np.zeros(capacity, dtype=np.uint8)
        self._arrays = (ts, kind, vals, boff, bn, bring, aux)
        cdef uint8_t[::1] aux_mv = aux
        self.aux = &aux_mv[0]
        self.sink = None
        self.spill_at = 1 << 62
        self.spill_bpos = 1 << 62
        cdef double[::1] ts_mv = ts
        cdef uint8_t[::1] kind_mv = kind
        cdef int64_t[::1] vals_mv = vals
        cdef int64_t[::1] boff_mv = boff
        self.ts, self.kind, self.vals, self.boff = &ts_mv[0], &kind_mv[0], &vals_mv[0], &boff_mv[0]
        self.bn, self.bring = i32_ptr(bn), i32_ptr(bring)
        self._objs = [None] * capacity
        self._names = []
        self._codes = {}
        self._fields = []
        self._layouts = []
        self._strings = []
        self._string_ids = {}
        for name, names in (fields or {}).items():
            self._codes[name] = len(self._names)
            self._names.append(name)
            self._fields.append(tuple(names))
            layout = COMPILED_LAYOUTS.get(name)
            # the history's fields (allocator/history.py) follow the compiled ones: block ids
            # from the id ring, the state code (aux), the free's requested bytes (v[2])
            if layout is not None and len(layout) > len(names):
                raise ValueError(f"event kind {name!r} has fields {names}; its compiled layout "
                                 f"{layout!r} in allocator/_events.pxi must name each of them")
            self._layouts.append(layout)
        if len(self._names) > CODE_MASK:
            raise ValueError("too many event kinds")

    cdef int maybe_spill(self) except -1:
        """Hand the ring to the history when it is about to drop events it has not consumed.
        Called where the pool is consistent: after an event and everything it changed."""
        if (self.last_seq >= self.spill_at or self.bpos >= self.spill_bpos) and self.sink is not None:
            self.sink.spill()
        return 0

    cdef inline void set_aux(self, uint8_t x) noexcept:
        """The newest event's extra code (a numeric allocate's state)."""
        self.aux[self._slot(self.last_seq)] = x

    def raw_after(self, int64_t seq) -> list:
        """Events with seq > `seq` as flat tuples (seq, ts, type, *fields) in the layout of
        allocator/vocab.py EVENT_KINDS, block ids as an int (one) or native int32 bytes; the
        history packs these. Numeric events: allocate (id, requested, allocated, blocks,
        block_ids, state), free (id, blocks, block_ids, requested_bytes)."""
        cdef list out = []
        cdef int64_t s = max(seq + 1, self.last_seq - self.count + 1)
        cdef Py_ssize_t slot, n, pos
        cdef uint8_t k
        cdef int64_t *v
        cdef object ids
        while s <= self.last_seq:
            slot = self._slot(s)
            k = self.kind[slot]
            name = self._names[k & CODE_MASK]
            if k & FLAG_OBJ:
                out.append((s, self.ts[slot], name) + self._objs[slot])
            else:
                v = &self.vals[slot * NVALS]
                n = self.bn[slot]
                if n == 1:
                    ids = self.bring[<Py_ssize_t>(self.boff[slot] % self.bcap)]
                elif n > 1:
                    pos = <Py_ssize_t>(self.boff[slot] % self.bcap)
                    ids = (<char *>&self.bring[pos])[:n * sizeof(int32_t)]
                else:
                    ids = None
                if name == "free":
                    out.append((s, self.ts[slot], name, v[0], v[1], ids, v[2]))
                elif name == "allocate":
                    out.append((s, self.ts[slot], name, v[0], v[1], v[2], v[3], ids, self.aux[slot]))
                else:
                    out.append((s, self.ts[slot], name) + self._decoded(slot, k))
            s += 1
        return out

    cdef tuple _decoded(self, Py_ssize_t slot, uint8_t k):
        """A compiled event's values per its layout (as `after()` reads them)."""
        cdef int64_t *v = &self.vals[slot * NVALS]
        cdef str layout = self._layouts[k & CODE_MASK]
        cdef list vals = []
        cdef Py_ssize_t j, pos = 0
        for j in range(len(layout)):
            ch = layout[j]
            if ch == "o":
                vals.append(self._objs[slot])
                continue
            if ch == "i":
                vals.append(v[pos])
            elif ch == "f":
                vals.append(i2f(v[pos]))
            else:
                vals.append(self._strings[v[pos]])
            pos += 1
        return tuple(vals)

    def export(self, int64_t seq):
        """Events with seq > `seq` in columns, for the history to pack without a Python object
        per event: (first_seq, last_seq, ts, kind, vals, aux, nids, ids) as bytes of float64,
        uint8 (code | FLAG_OBJ), int64 (NVALS per event), uint8, int32 (-1: ids not kept) and
        int32 (every numeric event's ids, in order), then the value tuples of the Python-recorded
        events in order, and the kind names by code. None when there is nothing after `seq`."""
        cdef int64_t first = max(seq + 1, self.last_seq - self.count + 1)
        cdef Py_ssize_t n = <Py_ssize_t>(self.last_seq - first + 1), i, j, slot, m, total = 0, pos
        if n <= 0:
            return None
        ts = np.empty(n, dtype=np.float64)
        kd = np.empty(n, dtype=np.uint8)
        vs = np.empty(n * NVALS, dtype=np.int64)
        ax = np.empty(n, dtype=np.uint8)
        nb = np.empty(n, dtype=np.int32)
        cdef double[::1] ts_v = ts
        cdef uint8_t[::1] kd_v = kd
        cdef int64_t[::1] vs_v = vs
        cdef uint8_t[::1] ax_v = ax
        cdef int32_t[::1] nb_v = nb
        cdef list objs = []
        for i in range(n):
            slot = self._slot(first + i)
            ts_v[i] = self.ts[slot]
            kd_v[i] = self.kind[slot]
            ax_v[i] = self.aux[slot]
            for j in range(NVALS):
                vs_v[i * NVALS + j] = self.vals[slot * NVALS + j]
            if self.kind[slot] & FLAG_OBJ:
                objs.append(self._objs[slot])
                nb_v[i] = 0
            elif self._names[self.kind[slot] & CODE_MASK] not in ("allocate", "free"):
                objs.append(self._decoded(slot, self.kind[slot]))  # put / evict: as values
                kd_v[i] = self.kind[slot] | FLAG_OBJ
                nb_v[i] = 0
            else:
                nb_v[i] = self.bn[slot]
                if self.bn[slot] > 0:
                    total += self.bn[slot]
        ids = np.empty(total, dtype=np.int32)
        cdef int32_t[::1] ids_v = ids
        pos = 0
        for i in range(n):
            m = nb_v[i]
            if m > 0:
                slot = self._slot(first + i)
                memcpy(&ids_v[pos], &self.bring[<Py_ssize_t>(self.boff[slot] % self.bcap)], m * sizeof(int32_t))
                pos += m
        return (first, self.last_seq, ts.tobytes(), kd.tobytes(), vs.tobytes(), ax.tobytes(),
                nb.tobytes(), ids.tobytes(), objs, list(self._names))

    def code(self, str kind) -> int:
        """The numeric code of `kind` (KeyError for an unknown kind)."""
        return self._codes[kind]

    cdef inline Py_ssize_t _slot(self, int64_t seq) noexcept:
        return <Py_ssize_t>((seq - 1) % self.capacity)

    cdef int64_t intern(self, str text) except -1:
        """The string table index of `text` (reasons, policy names: a handful of values)."""
        i = self._string_ids.get(text)
        if i is None:
            i = self._string_ids[text] = len(self._strings)
            self._strings.append(text)
        return i

    cdef int64_t *record_keyed(self, uint8_t code, object first, double now) except NULL:
        """Append an event of a compiled kind whose first field is an object (a key); returns
        its NVALS values for the caller to fill per the kind's layout."""
        cdef int64_t seq = self.last_seq + 1
        cdef Py_ssize_t slot = self._slot(seq)
        self._open_slot(slot)
        self.last_seq = seq
        self.ts[slot] = now
        self.kind[slot] = code | FLAG_KEY
        self._objs[slot] = first
        self.bn[slot] = 0
        return &self.vals[slot * NVALS]

    cdef inline void _open_slot(self, Py_ssize_t slot) noexcept:
        """Make room for the next event: free what the slot held."""
        if self.kind[slot] & HELD:
            self._objs[slot] = None
        if self.count < self.capacity:
            self.count += 1

    cdef int32_t *_reserve_blocks(self, Py_ssize_t slot, Py_ssize_t n) noexcept:
        """Room for the `n` block ids of the event in `slot`, contiguous in the id ring (a write
        that would wrap starts over at 0), or NULL when n is 0 or more than the ring holds."""
        cdef Py_ssize_t pos, k
        cdef int64_t start
        if n <= 0 or n > self.bcap:
            self.bn[slot] = 0 if n <= 0 else -1
            return NULL
        pos = <Py_ssize_t>(self.bpos % self.bcap)
        start = self.bpos if pos + n <= self.bcap else self.bpos + (self.bcap - pos)
        # Drop the oldest events whose ids this write overwrites (never the new one).
        while self.count > 1:
            k = self._slot(self.last_seq - self.count + 1)
            if self.bn[k] > 0 and self.boff[k] + self.bcap < start + n:
                if self.kind[k] & HELD:
                    self._objs[k] = None
                    self.kind[k] = 0
                self.count -= 1
            else:
                break
        self.boff[slot] = start
        self.bn[slot] = <int32_t>n
        self.bpos = start + n
        return &self.bring[start % self.bcap]

    cdef int32_t *record_num(self, uint8_t code, int64_t a, int64_t b, int64_t c, int64_t d,
                             Py_ssize_t n, double now) noexcept:
        """Append a numeric event (values a..d: the kind's fields in order); returns where its
        `n` block ids go (the caller writes them; NULL: do not)."""
        cdef int64_t seq = self.last_seq + 1
        cdef Py_ssize_t slot = self._slot(seq)
        self._open_slot(slot)
        self.last_seq = seq
        self.ts[slot] = now
        self.kind[slot] = code
        cdef int64_t *v = &self.vals[slot * NVALS]
        v[0] = a
        v[1] = b
        v[2] = c
        v[3] = d
        return self._reserve_blocks(slot, n)

    cdef int64_t record_values(self, uint8_t code, tuple values, double now) except -1:
        """Append an event of kind `code` whose values (a flat tuple) follow its fields."""
        cdef int64_t seq = self.last_seq + 1
        cdef Py_ssize_t slot = self._slot(seq)
        self._open_slot(slot)
        self.last_seq = seq
        self.ts[slot] = now
        self.kind[slot] = code | FLAG_OBJ
        self._objs[slot] = values
        self.bn[slot] = 0
        self.maybe_spill()
        return seq

    def record(self, str kind, *values, block_ids=None) -> int:
        """Append one event; `values` follow the kind's fields, `block_ids` (optional) are the
        blocks it changed. Returns its seq. KeyError for an unknown kind."""
        cdef uint8_t code = self._codes[kind]
        cdef int64_t seq = self.last_seq + 1
        cdef Py_ssize_t slot = self._slot(seq)
        cdef int32_t[::1] ids
        cdef int32_t *dst
        self._open_slot(slot)
        self.last_seq = seq
        self.ts[slot] = wall_time()
        self.kind[slot] = code | FLAG_OBJ
        self._objs[slot] = values
        if block_ids is None or len(block_ids) == 0:
            self.bn[slot] = 0
        else:
            ids = np.ascontiguousarray(block_ids, dtype=np.int32)
            dst = self._reserve_blocks(slot, ids.shape[0])
            if dst != NULL:
                memcpy(dst, &ids[0], ids.shape[0] * sizeof(int32_t))
        self.maybe_spill()
        return seq

    def truncate(self, int64_t seq) -> None:
        """Forget events after `seq` (a rolled-back batch that no reader has seen yet)."""
        cdef Py_ssize_t slot
        while self.count and self.last_seq > seq:
            slot = self._slot(self.last_seq)
            if self.kind[slot] & HELD:
                self._objs[slot] = None
                self.kind[slot] = 0
            if self.bn[slot] > 0:
                self.bpos = self.boff[slot]  # the newest ids are the ones written last
            self.count -= 1
            self.last_seq -= 1
        self.last_seq = seq
        if self.sink is not None:
            self.sink.rollback(seq)

    def after(self, int64_t seq=0, Py_ssize_t limit=1000, kinds=None, bint block_ids=False) -> list:
        """Events with seq > `seq`, oldest first, at most `limit`, as dicts
        {"seq", "ts", "type", *fields}. With `block_ids`, each also has "block_ids": the blocks
        it changed, in the order it changed them ([] when none were recorded, None when there
        were more than the id ring holds)."""
        cdef list out = []
        cdef int64_t s = max(seq + 1, self.last_seq - self.count + 1)
        cdef Py_ssize_t slot, j, n, pos
        cdef uint8_t k
        cdef str ch
        cdef dict event
        cdef tuple names
        cdef int64_t *v
        while s <= self.last_seq and len(out) < limit:
            slot = self._slot(s)
            k = self.kind[slot]
            name = self._names[k & CODE_MASK]
            s += 1
            if kinds is not None and name not in kinds:
                continue
            event = {"seq": s - 1, "ts": self.ts[slot], "type": name}
            names = self._fields[k & CODE_MASK]
            if k & FLAG_OBJ:
                event.update(zip(names, self._objs[slot]))
            else:
                v = &self.vals[slot * NVALS]
                layout = self._layouts[k & CODE_MASK]
                pos = 0
                for j in range(len(names)):
                    ch = layout[j] if layout is not None else "i"
                    if ch == "o":
                        event[names[j]] = self._objs[slot]
                        continue
                    if ch == "i":
                        event[names[j]] = v[pos]
                    elif ch == "f":
                        event[names[j]] = i2f(v[pos])
                    else:
                        event[names[j]] = self._strings[v[pos]]
                    pos += 1
            if block_ids:
                n = self.bn[slot]
                if n < 0:
                    event["block_ids"] = None
                else:
                    pos = <Py_ssize_t>(self.boff[slot] % self.bcap)
                    event["block_ids"] = [self.bring[pos + j] for j in range(n)]
            out.append(event)
        return out

    def __len__(self) -> int:
        return self.count
