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

# export()'s columns, in order (allocator/history/columns.py EventColumns names them the same).
COLUMN_FIELDS = ("format", "first", "last", "ts", "kind", "aux", "num", "nb", "ne", "ids", "wide",
                 "keys", "objs", "names", "strings", "block_bytes")

cdef enum:  # positions in export()'s columns (COLUMN_FIELDS)
    C_FORMAT = 0
    C_FIRST = 1
    C_LAST = 2
    C_TS = 3
    C_KIND = 4
    C_AUX = 5
    C_NUM = 6
    C_NB = 7
    C_NE = 8
    C_IDS = 9
    C_WIDE = 10
    C_KEYS = 11
    C_OBJS = 12
    C_NAMES = 13
    C_STRINGS = 14
    C_BLOCK_BYTES = 15
    C_COUNT = 16


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
            # the history's fields (allocator/history/replay.py) follow the compiled ones:
            # block ids from the id ring, the state code (aux), the free's requested bytes (v[2])
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
        cdef int64_t s = self._first_held(seq)
        cdef Py_ssize_t slot, n, pos
        cdef uint8_t k
        cdef int64_t *v
        cdef object ids
        while s <= self.last_seq:
            slot = self._slot(s)
            self._need_sane(slot, s)
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
                vals.append(self._string(v[pos]))
            pos += 1
        return tuple(vals)

    cdef inline int64_t _first_held(self, int64_t after) noexcept:
        """The oldest held seq past `after` (never below 1, whatever the counters say)."""
        if after >= self.last_seq:  # (also keeps after + 1 from overflowing)
            return self.last_seq + 1
        return max(after + 1, self.last_seq - self.count + 1, 1)

    cdef str _string(self, int64_t i):
        if i < 0 or i >= len(self._strings):
            raise _CorruptState(f"an event names string {i}; the table holds {len(self._strings)}")
        return self._strings[i]

    cdef inline int _need_sane(self, Py_ssize_t slot, int64_t seq) except -1:
        """CorruptState unless the event in `slot` can be read without a bad index: its kind
        code names a kind and its block ids lie inside the id ring (check() says more)."""
        cdef int32_t n = self.bn[slot]
        cdef int64_t pos
        if (self.kind[slot] & CODE_MASK) >= len(self._names) or self._layout_missing(slot):
            raise _CorruptState(f"event {seq}: kind code {self.kind[slot]} (check() names it)")
        if n > 0:
            pos = self.boff[slot] % self.bcap
            if n > self.bcap or pos < 0 or pos + n > self.bcap:
                raise _CorruptState(f"event {seq}: {n} block ids at {self.boff[slot]} (check() names it)")
        return 0

    cdef inline bint _layout_missing(self, Py_ssize_t slot) noexcept:
        """A compiled event (numeric or keyed) of a kind without a compiled layout."""
        return not (self.kind[slot] & FLAG_OBJ) and self._layouts[self.kind[slot] & CODE_MASK] is None

    def check(self) -> list:
        """Problems with the ring (empty = ok). Every index is checked before it is used: the
        count and sequence numbers, each held event's kind code and values, where its block
        ids lie in the id ring (written and not yet overwritten) and a keyed event's strings."""
        cdef int64_t seq
        cdef Py_ssize_t slot
        if not 0 <= self.count <= self.capacity:
            return [f"the ring claims {self.count} events, its capacity is {self.capacity}"]
        if self.last_seq < self.count:
            return [f"the newest event is {self.last_seq} but the ring claims {self.count} events"]
        if self.bpos < 0:
            return [f"the id ring's write position is {self.bpos}"]
        for seq in range(self.last_seq - self.count + 1, self.last_seq + 1):
            slot = self._slot(seq)
            problem = self._event_problem(slot)
            if problem is not None:
                return [f"event {seq}: {problem}"]
        return []

    cdef object _event_problem(self, Py_ssize_t slot):
        cdef uint8_t k = self.kind[slot]
        cdef int32_t n = self.bn[slot]
        cdef int64_t start = self.boff[slot]
        cdef int64_t *v = &self.vals[slot * NVALS]
        cdef Py_ssize_t j, pos = 0
        if (k & CODE_MASK) >= len(self._names):
            return f"kind code {k & CODE_MASK} names no kind (there are {len(self._names)})"
        if (k & FLAG_OBJ) and (k & FLAG_KEY):
            return "marked both a value tuple and a keyed event"
        if k & FLAG_OBJ and type(self._objs[slot]) is not tuple:
            return f"a {self._names[k & CODE_MASK]} recorded from Python holds no value tuple"
        if self._layout_missing(slot):
            return f"a compiled {self._names[k & CODE_MASK]} event, a kind without a compiled layout"
        if k & FLAG_KEY:
            layout = self._layouts[k & CODE_MASK]
            for j in range(1, len(layout)):
                if layout[j] == "s" and not 0 <= v[pos] < len(self._strings):
                    return f"names string {v[pos]}; the table holds {len(self._strings)}"
                pos += 1
        if n < -1 or n > self.bcap:
            return f"claims {n} block ids (the id ring holds {self.bcap})"
        if n > 0:
            if start < 0 or start > self.bpos - n:
                return f"its {n} block ids at {start} lie past the {self.bpos} written"
            if start < self.bpos - self.bcap:
                return f"its {n} block ids at {start} were overwritten (written up to {self.bpos})"
            if start % self.bcap + n > self.bcap:
                return f"its {n} block ids at {start} wrap around the id ring"
        return None

    def _raw(self) -> dict:
        """The ring's arrays as writable numpy views (ts, kind, vals, boff, bn, bring, aux),
        for corruption tests and debugging: a write bypasses every invariant, and check()
        must then name the damage."""
        return dict(zip(("ts", "kind", "vals", "boff", "bn", "bring", "aux"), self._arrays))

    def _poke(self, str field, int64_t value) -> int:
        """Overwrite `count`, `last_seq` or `bpos` and return what it held (corruption tests
        only, like `_raw`)."""
        cdef int64_t old
        if field == "count":
            old, self.count = self.count, value
        elif field == "last_seq":
            old, self.last_seq = self.last_seq, value
        elif field == "bpos":
            old, self.bpos = self.bpos, value
        else:
            raise KeyError(field)
        return old

    def export(self, int64_t seq, int64_t block_bytes=1):
        """Events with seq > `seq` in compact columns, for the history to keep without a Python
        object per event (None when there is nothing after `seq`):

        ("cols2", first, last, ts, kind, aux, num, nb, ne, ids, wide, keys, objs, names, strings,
         block_bytes)  (COLUMN_FIELDS)

        - ts float64, kind uint8 (code | FLAG_OBJ / FLAG_KEY), aux uint8: one per event (bytes);
        - numeric events (allocate, free): `num` int64 (id, requested bytes), `nb` int32 block
          count, `ne` int32 entries in `ids` (-1: the ids were not kept), all bytes; an
          allocate's allocated bytes are its blocks times `block_bytes` (the pool's, which the
          caller passes: the compiled pool records nothing else);
        - `ids` int32 bytes, each event's block ids in order, runs of 3+ ascending ids written
          as (-length, first): a fresh pool's 16-block allocation costs 8 bytes, not 64;
        - keyed events (put, evict): the key in `keys`, the NVALS values in `wide` (int64 bytes),
          read per the kind's COMPILED_LAYOUTS (strings index `strings`);
        - Python-recorded events: their value tuple in `objs`.
        `names` are the kind names by code."""
        cdef int64_t first = self._first_held(seq)
        cdef Py_ssize_t n = <Py_ssize_t>(self.last_seq - first + 1), i, j, slot, m, b, e
        cdef Py_ssize_t nnum = 0, nkey = 0, total = 0, pos, run
        cdef uint8_t k
        cdef int32_t *src
        cdef int alloc_code = self._codes.get("allocate", -1)
        if n <= 0:
            return None
        # The columns are written straight into fresh bytes objects (no array, no copy).
        ts = PyBytes_FromStringAndSize(NULL, n * sizeof(double))
        kd = PyBytes_FromStringAndSize(NULL, n)
        ax = PyBytes_FromStringAndSize(NULL, n)
        cdef double *ts_v = <double *>PyBytes_AS_STRING(ts)
        cdef uint8_t *kd_v = <uint8_t *>PyBytes_AS_STRING(kd)
        cdef uint8_t *ax_v = <uint8_t *>PyBytes_AS_STRING(ax)
        cdef list objs = [], keys = []
        cdef Py_ssize_t slot0 = self._slot(first)
        cdef object held = self._objs
        cdef uint8_t sane[256]  # per kind byte: _need_sane's kind checks, done once per export
        cdef Py_ssize_t nnames = len(self._names)
        cdef int32_t bn
        for i in range(256):
            sane[i] = (i & CODE_MASK) < nnames and (
                (i & FLAG_OBJ) or self._layouts[i & CODE_MASK] is not None)
        slot = slot0
        for i in range(n):
            k = self.kind[slot]
            bn = self.bn[slot]
            if not sane[k] or (bn > 0 and (bn > self.bcap or self.boff[slot] < 0
                                           or self.boff[slot] % self.bcap + bn > self.bcap)):
                self._need_sane(slot, first + i)  # raises CorruptState, naming the damage
            ts_v[i] = self.ts[slot]
            kd_v[i] = k
            ax_v[i] = self.aux[slot]
            if k & FLAG_OBJ:
                objs.append((<list>held)[slot])
            elif k & FLAG_KEY:
                keys.append((<list>held)[slot])
                nkey += 1
            else:
                nnum += 1
                if self.bn[slot] > 0:
                    total += self.bn[slot]
            slot += 1
            if slot == self.capacity:
                slot = 0
        num = PyBytes_FromStringAndSize(NULL, 2 * nnum * sizeof(int64_t))
        nb = PyBytes_FromStringAndSize(NULL, nnum * sizeof(int32_t))
        ne = PyBytes_FromStringAndSize(NULL, nnum * sizeof(int32_t))
        wide = PyBytes_FromStringAndSize(NULL, NVALS * nkey * sizeof(int64_t))
        ids = np.empty(total, dtype=np.int32)  # the encoding is never longer than the ids
        cdef int64_t *num_v = <int64_t *>PyBytes_AS_STRING(num)
        cdef int32_t *nb_v = <int32_t *>PyBytes_AS_STRING(nb)
        cdef int32_t *ne_v = <int32_t *>PyBytes_AS_STRING(ne)
        cdef int64_t *wide_v = <int64_t *>PyBytes_AS_STRING(wide)
        cdef int32_t *out = i32_ptr(ids) if total else NULL
        cdef int64_t *v
        pos = 0
        j = 0
        m = 0
        slot = slot0 - 1
        for i in range(n):
            slot += 1
            if slot == self.capacity:
                slot = 0
            k = self.kind[slot]
            if k & FLAG_OBJ:
                continue
            v = &self.vals[slot * NVALS]
            if k & FLAG_KEY:
                _memcpy(&wide_v[m * NVALS], v, NVALS * sizeof(int64_t))
                m += 1
                continue
            num_v[2 * j] = v[0]  # the id, then the requested bytes (allocate's 2nd, free's 3rd)
            num_v[2 * j + 1] = v[1] if k == alloc_code else v[2]
            # blocks: allocate's 4th value, free's 2nd
            nb_v[j] = <int32_t>(v[3] if k == alloc_code else v[1])
            if self.bn[slot] < 0:
                ne_v[j] = -1
            else:
                src = &self.bring[<Py_ssize_t>(self.boff[slot] % self.bcap)]
                e = pos
                b = 0
                while b < self.bn[slot]:
                    run = 1
                    while b + run < self.bn[slot] and src[b + run] == src[b] + run:
                        run += 1
                    if run >= 3:
                        out[pos] = <int32_t>(-run)
                        out[pos + 1] = src[b]
                        pos += 2
                        b += run
                    else:
                        out[pos] = src[b]
                        pos += 1
                        b += 1
                ne_v[j] = <int32_t>(pos - e)
            j += 1
        return ("cols2", first, self.last_seq, ts, kd, ax, num, nb, ne, ids[:pos].tobytes(), wide,
                keys, objs, list(self._names), list(self._strings), block_bytes)

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
        list_put(self._objs, slot, first)
        self.bn[slot] = 0
        return &self.vals[slot * NVALS]

    cdef inline void _open_slot(self, Py_ssize_t slot) noexcept:
        """Make room for the next event: free what the slot held."""
        if self.kind[slot] & HELD:
            list_put(self._objs, slot, None)
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
        cdef int64_t s = self._first_held(seq)
        cdef Py_ssize_t slot, j, n, pos
        cdef uint8_t k
        cdef str ch
        cdef dict event
        cdef tuple names
        cdef int64_t *v
        while s <= self.last_seq and len(out) < limit:
            slot = self._slot(s)
            self._need_sane(slot, s)
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
                        event[names[j]] = self._string(v[pos])
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


# -- reading exported columns (allocator/history/segments.py keeps them as its segments) ----
cdef inline tuple _columns(object cols):
    """Exported columns as a tuple: export()'s own, or a tuple subclass naming them
    (allocator/history/columns.py EventColumns). Raises TypeError."""
    if not isinstance(cols, tuple):
        raise TypeError(f"event columns are {type(cols).__name__}, not a tuple")
    return <tuple>cols


cdef inline Py_ssize_t _decode_ids(const int32_t *enc, Py_ssize_t ne, int32_t *out) noexcept:
    """Expand `ne` encoded entries (see EventRing.export) into `out`; returns the id count."""
    cdef Py_ssize_t i = 0, n = 0, r
    while i < ne:
        if enc[i] < 0:
            for r in range(-enc[i]):
                out[n + r] = enc[i + 1] + <int32_t>r
            n += -enc[i]
            i += 2
        else:
            out[n] = enc[i]
            n += 1
            i += 1
    return n


def replay_columns(columns, int32_t[::1] owner, uint8_t[::1] state, int64_t after, int64_t upto,
                   int64_t[::1] acc, int64_t[::1] pos, const uint8_t[::1] python_kinds):
    """Apply the numeric events of an exported segment ("cols2") with after < seq <= upto to the
    map (owner/state) and to acc = [requested, allocations, last_id, frees], in order.

    Resumable: pos = [event, numeric, ids, keyed, obj] positions (zeros at the start). Returns the
    index of the next Python-recorded event in range whose kind code is flagged in
    `python_kinds` (pos is then past it: the caller applies objs[pos[4] - 1] and calls again),
    or -1 when the range (or the segment) is done. Keyed events change no block: skipped."""
    cdef tuple cols = _columns(columns)
    cdef int64_t first = cols[C_FIRST], last = cols[C_LAST], seq
    cdef const uint8_t[::1] kind = cols[C_KIND]
    cdef const uint8_t[::1] aux = cols[C_AUX]
    cdef const int64_t[::1] num = np.frombuffer(cols[C_NUM], dtype=np.int64)
    cdef const int32_t[::1] nb = np.frombuffer(cols[C_NB], dtype=np.int32)
    cdef const int32_t[::1] ne = np.frombuffer(cols[C_NE], dtype=np.int32)
    cdef const int32_t[::1] ids = np.frombuffer(cols[C_IDS], dtype=np.int32)
    cdef Py_ssize_t n = <Py_ssize_t>(last - first + 1), i = pos[0], j = pos[1], p = pos[2]
    cdef Py_ssize_t m = pos[3], o = pos[4], q, c, nblocks = min(owner.shape[0], state.shape[0])
    cdef list names = cols[C_NAMES]
    cdef int alloc_code = names.index("allocate") if "allocate" in names else -1
    cdef uint8_t k
    cdef int32_t aid, b
    cdef int32_t[::1] scratch
    cdef int32_t *buf = NULL
    cdef Py_ssize_t bufcap = 0
    if upto < first + i:
        return -1
    scratch_arr = _scratch(cols[C_NB])
    scratch = scratch_arr
    buf = &scratch[0]
    bufcap = scratch.shape[0]
    try:
        while i < n:
            seq = first + i
            if seq > upto:
                return -1
            k = kind[i]
            if k & FLAG_OBJ:
                o += 1
                i += 1
                if seq > after and python_kinds[k & CODE_MASK]:
                    return i - 1
                continue
            if k & FLAG_KEY:
                m += 1
                i += 1
                continue
            if seq > after and ne[j] > 0:
                c = _decode_ids(&ids[p], ne[j], buf)
                if k == alloc_code:
                    aid = <int32_t>num[2 * j]
                    for q in range(c):
                        b = buf[q]
                        if 0 <= b < nblocks:
                            owner[b] = aid
                            state[b] = aux[i]
                else:
                    for q in range(c):
                        b = buf[q]
                        if 0 <= b < nblocks:
                            owner[b] = -1
                            state[b] = 0
            if seq > after:
                if k == alloc_code:
                    acc[0] += num[2 * j + 1]
                    acc[1] += 1
                    if num[2 * j] > acc[2]:
                        acc[2] = num[2 * j]
                else:
                    acc[0] -= num[2 * j + 1]
                    acc[1] -= 1
                    acc[3] += 1
            if ne[j] > 0:
                p += ne[j]
            j += 1
            i += 1
        return -1
    finally:
        pos[0], pos[1], pos[2], pos[3], pos[4] = i, j, p, m, o


def _scratch(bytes nb):
    """Room for the largest event's block ids (nb: the segment's int32 block counts)."""
    counts = np.frombuffer(nb, dtype=np.int32)
    return np.empty(max(1, int(counts.max()) if counts.size else 1), dtype=np.int32)


def rows_of_columns2(columns) -> list:
    """An exported segment ("cols2") as the flat tuples EventRing.raw_after() makes."""
    cdef tuple cols = _columns(columns)
    cdef int64_t first = cols[C_FIRST], last = cols[C_LAST]
    cdef Py_ssize_t n = <Py_ssize_t>(last - first + 1), i, j = 0, p = 0, m = 0, o = 0, c, x, pos
    ts = np.frombuffer(cols[C_TS], dtype=np.float64).tolist()
    cdef const uint8_t[::1] kind = cols[C_KIND]
    cdef const uint8_t[::1] aux = cols[C_AUX]
    cdef const int64_t[::1] num = np.frombuffer(cols[C_NUM], dtype=np.int64)
    cdef const int32_t[::1] nb = np.frombuffer(cols[C_NB], dtype=np.int32)
    cdef const int32_t[::1] ne = np.frombuffer(cols[C_NE], dtype=np.int32)
    cdef const int32_t[::1] ids = np.frombuffer(cols[C_IDS], dtype=np.int32)
    cdef const int64_t[::1] wide = np.frombuffer(cols[C_WIDE], dtype=np.int64)
    cdef list keys = cols[C_KEYS], objs = cols[C_OBJS], names = cols[C_NAMES]
    cdef list strings = cols[C_STRINGS], out = []
    cdef int64_t block_bytes = cols[C_BLOCK_BYTES]
    cdef uint8_t k
    cdef str name, layout
    scratch_arr = _scratch(cols[C_NB])
    cdef int32_t[::1] scratch = scratch_arr
    for i in range(n):
        k = kind[i]
        name = names[k & CODE_MASK]
        if k & FLAG_OBJ:
            out.append((first + i, ts[i], name) + tuple(objs[o]))
            o += 1
            continue
        if k & FLAG_KEY:
            layout = COMPILED_LAYOUTS[name]
            vals = [keys[m]]
            pos = 0
            for x in range(1, len(layout)):
                ch = layout[x]
                if ch == "i":
                    vals.append(wide[m * NVALS + pos])
                elif ch == "f":
                    vals.append(i2f(wide[m * NVALS + pos]))
                else:
                    vals.append(strings[wide[m * NVALS + pos]])
                pos += 1
            out.append((first + i, ts[i], name) + tuple(vals))
            m += 1
            continue
        if ne[j] > 0:
            c = _decode_ids(&ids[p], ne[j], &scratch[0])
            bid = scratch[0] if c == 1 else scratch_arr[:c].tobytes()
            p += ne[j]
        else:
            bid = None
        if name == "free":
            out.append((first + i, ts[i], name, num[2 * j], nb[j], bid, num[2 * j + 1]))
        else:
            out.append((first + i, ts[i], name, num[2 * j], num[2 * j + 1], nb[j] * block_bytes, nb[j],
                        bid, aux[i]))
        j += 1
    return out


def validate_columns(columns) -> object:
    """None when an exported segment ("cols2", e.g. read back from a recording file) is
    consistent, so replay_columns / rows_of_columns2 stay inside its arrays; else what is wrong.
    Block ids themselves are range-checked by the replay."""
    if not isinstance(columns, tuple):
        return "not a cols2 segment"
    cdef tuple cols = <tuple>columns
    if len(cols) != C_COUNT or cols[C_FORMAT] != "cols2":
        return "not a cols2 segment"
    for col in (C_TS, C_KIND, C_AUX, C_NUM, C_NB, C_NE, C_IDS, C_WIDE):
        if type(cols[col]) is not bytes:
            return f"column {COLUMN_FIELDS[col]} is not bytes"
    for col in (C_KEYS, C_OBJS, C_NAMES, C_STRINGS):
        if type(cols[col]) is not list:
            return f"column {COLUMN_FIELDS[col]} is not a list"
    if type(cols[C_FIRST]) is not int or type(cols[C_LAST]) is not int:
        return "first/last are not ints"
    cdef int64_t first = cols[C_FIRST], last = cols[C_LAST]
    cdef Py_ssize_t n = <Py_ssize_t>(last - first + 1), i, nnum = 0, nkey = 0, nobj = 0, j, p = 0
    cdef Py_ssize_t q, c
    if n <= 0 or len(cols[C_TS]) != 8 * n or len(cols[C_KIND]) != n or len(cols[C_AUX]) != n:
        return "per-event columns do not hold last - first + 1 events"
    cdef const uint8_t[::1] kind = cols[C_KIND]
    cdef list names = cols[C_NAMES]
    for i in range(n):
        if (kind[i] & CODE_MASK) >= len(names) or type(names[kind[i] & CODE_MASK]) is not str:
            return f"event {first + i} has an unknown kind code"
        if kind[i] & FLAG_OBJ:
            nobj += 1
        elif kind[i] & FLAG_KEY:
            nkey += 1
            if names[kind[i] & CODE_MASK] not in COMPILED_LAYOUTS:
                return f"event {first + i}: keyed kind without a layout"
        else:
            nnum += 1
            if names[kind[i] & CODE_MASK] not in ("allocate", "free"):
                return f"event {first + i}: numeric kind {names[kind[i] & CODE_MASK]!r}"
    if nobj != len(cols[C_OBJS]) or nkey != len(cols[C_KEYS]):
        return "object or key counts do not match the kinds"
    if any(type(o) is not tuple for o in cols[C_OBJS]):
        return "an event's values are not a tuple"
    if type(cols[C_BLOCK_BYTES]) is not int or cols[C_BLOCK_BYTES] <= 0:
        return "block_bytes is not a positive int"
    if len(cols[C_NUM]) != 16 * nnum or len(cols[C_NB]) != 4 * nnum or len(cols[C_NE]) != 4 * nnum:
        return "numeric columns do not match the numeric events"
    if len(cols[C_WIDE]) != 8 * NVALS * nkey or len(cols[C_IDS]) % 4:
        return "keyed or id columns have the wrong size"
    for s in cols[C_STRINGS]:
        if type(s) is not str:
            return "the string table holds a non-string"
    cdef const int32_t[::1] nb = np.frombuffer(cols[C_NB], dtype=np.int32)
    cdef const int32_t[::1] ne = np.frombuffer(cols[C_NE], dtype=np.int32)
    cdef const int32_t[::1] ids = np.frombuffer(cols[C_IDS], dtype=np.int32)
    for j in range(nnum):
        if ne[j] < -1 or nb[j] < 0:
            return "negative counts"
        if ne[j] <= 0:
            continue
        if p + ne[j] > ids.shape[0]:
            return "the id column is shorter than its counts"
        c = 0
        q = p
        while q < p + ne[j]:
            if ids[q] < 0:
                if q + 1 >= p + ne[j] or ids[q + 1] < 0:
                    return "a run of ids is cut short"
                c += -<Py_ssize_t>ids[q]
                q += 2
            else:
                c += 1
                q += 1
        if c != nb[j]:
            return "an event's ids do not add up to its block count"
        p += ne[j]
    if p != ids.shape[0]:
        return "the id column is longer than its counts"
    return _check_wide(cols)


cdef object _check_wide(tuple cols):
    cdef const int64_t[::1] wide = np.frombuffer(cols[C_WIDE], dtype=np.int64)
    cdef const uint8_t[::1] kind = cols[C_KIND]
    cdef Py_ssize_t i, m = 0, pos, x
    cdef list names = cols[C_NAMES]
    cdef Py_ssize_t nstr = len(cols[C_STRINGS])
    for i in range(kind.shape[0]):
        if not (kind[i] & FLAG_KEY) or (kind[i] & FLAG_OBJ):
            continue
        layout = COMPILED_LAYOUTS[names[kind[i] & CODE_MASK]]
        pos = 0
        for x in range(1, len(layout)):
            if layout[x] == "s" and not 0 <= wide[m * NVALS + pos] < nstr:
                return "a string index points outside the table"
            pos += 1
        m += 1
    return None
