"""The event ring's compact export ("cols2"): what the history keeps and replays in C.

Round trip: the columns decode to exactly the rows the ring itself gives (`raw_after`) for every
kind (numeric allocate/free with run-encoded ids, keyed put/evict, Python-recorded ones); the
compiled replay agrees with the row-by-row Replayer; and columns read back from a file are
checked before the C code walks them (a crafted segment is refused, never read out of bounds).
"""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from allocator._core import COLUMN_FIELDS, replay_columns, rows_of_columns2, validate_columns
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import KVCache, create_pool
from allocator.history.columns import EventColumns
from allocator.history.keyframes import Keyframe
from allocator.history.pickles import safe_loads
from allocator.history.replay import HANDLERS, NO_EFFECT_KINDS, UNREPLAYED_KINDS, Replayer
from allocator.history.segments import Segment
from allocator.vocab import EVENT_FIELDS

BLOCK = 16


def busy_pool(seed: int, blocks: int = 256):
    """A paged pool with a cache on part of it, driven at random: every event kind the
    compiled pool records, plus Python-recorded ones (hit, miss, state, policy)."""
    pool = create_pool("paged", num_blocks=blocks, block_bytes=BLOCK, device="cpu", history_bytes=0,
                       event_capacity=4096)
    cache = KVCache(pool, BLOCK * blocks // 2, "lru")
    rng = random.Random(seed)
    ids, keys = [], []
    for _ in range(300):
        r = rng.random()
        if r < 0.3 and len(ids) < 20:
            try:
                ids.append(pool.allocate(BLOCK * rng.choice([1, 2, 5, 16, 40])))
            except Exception:
                pass
        elif r < 0.45 and ids:
            pool.free(ids.pop(rng.randrange(len(ids))))
        elif r < 0.8:
            key = f"k{rng.randrange(60)}"
            try:
                cache.put(key, BLOCK * rng.randint(1, 9))
                keys.append(key)
            except Exception:
                pass
        elif r < 0.9:
            cache.get(f"k{rng.randrange(60)}")
        elif keys:
            key = rng.choice(keys)
            if key in cache:
                cache.pin(key, not cache.peek(key).pinned)
    return pool


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_columns_decode_to_the_rings_own_rows(seed) -> None:
    pool = busy_pool(seed)
    for after in (0, 17, pool.events.last_seq - 5):
        cols = pool.events.export(after, BLOCK)
        assert validate_columns(cols) is None
        assert rows_of_columns2(cols) == pool.events.raw_after(after)
    kinds = {r[2] for r in pool.events.raw_after(0)}
    assert {"allocate", "free", "put", "evict", "hit", "state"} <= kinds


def test_runs_of_ids_are_stored_short() -> None:
    pool = create_pool("paged", num_blocks=1024, block_bytes=BLOCK, device="cpu", history_bytes=0)
    for _ in range(10):
        pool.free(pool.allocate(BLOCK * 16))
    cols = EventColumns._make(pool.events.export(0, BLOCK))
    assert len(cols.ids) == 20 * 2 * 4  # each event's 16 ids as one (-16, first) pair
    assert rows_of_columns2(cols) == pool.events.raw_after(0)


def test_the_columns_are_named_as_the_core_lays_them_out() -> None:
    assert EventColumns._fields == COLUMN_FIELDS
    cols = EventColumns._make(busy_pool(9).events.export(0, BLOCK))
    assert cols.format == "cols2" and cols.count == len(cols.ts) // 8 == len(cols.kind)
    assert validate_columns(cols) is None  # the compiled readers take the named tuple as it is
    assert rows_of_columns2(cols) == rows_of_columns2(tuple(cols))
    # A segment stores them as a plain tuple: the file names no class, and reads back the same.
    seg = Segment.of_columns(cols)
    stored = safe_loads(seg.blob, bounded=True, refs=False)
    assert stored.__class__ is tuple and len(stored) == len(COLUMN_FIELDS)
    assert Segment(seg.first, seg.last, seg.blob, untrusted=True).rows() == seg.rows()


@pytest.mark.parametrize("seed", [4, 5])
def test_compiled_replay_matches_row_by_row(seed) -> None:
    pool = busy_pool(seed)
    n = pool.num_blocks
    empty = Keyframe(0, (zlib.compress(np.full(n, -1, np.int32).tobytes()),),
                     (zlib.compress(bytes(n)),), 0, 0, 0, 0, (0,) * 7)
    cols = Segment.of_columns(pool.events.export(0, BLOCK)).columns()
    rows = pool.events.raw_after(0)
    for upto in (5, len(rows) // 2, len(rows)):
        a, b = Replayer(empty), Replayer(empty)
        a.apply_columns(cols, 0, upto)
        for r in rows[:upto]:
            b.apply(r)
        assert np.array_equal(a.owner, b.owner) and np.array_equal(a.state, b.state)
        assert (a.requested, a.allocations, a.last_id, a.frees) == (b.requested, b.allocations, b.last_id, b.frees)
        assert a.counters == b.counters
    # Starting mid-segment (a keyframe inside it) skips what came before.
    a = Replayer(empty)
    a.apply_columns(cols, 0, 40)
    c = Replayer(empty)
    for r in rows[:40]:
        c.apply(r)
    c.apply_columns(cols, 40, len(rows))
    a.apply_columns(cols, 40, len(rows))
    assert np.array_equal(a.owner, c.owner) and a.requested == c.requested


def test_every_kind_has_a_handler_or_is_named_as_changing_nothing() -> None:
    """A new kind of event must say what it does to a replay (or that it does nothing)."""
    assert set(HANDLERS) | NO_EFFECT_KINDS == set(EVENT_FIELDS)
    assert not set(HANDLERS) & NO_EFFECT_KINDS
    assert NO_EFFECT_KINDS <= UNREPLAYED_KINDS


def test_unreplayed_kinds_really_change_nothing() -> None:
    """The compiled replay skips these kinds: Replayer.apply must agree that they are no-ops."""
    pool = busy_pool(6)
    rep = Replayer(Keyframe(0, (zlib.compress(np.full(pool.num_blocks, -1, np.int32).tobytes()),),
                            (zlib.compress(bytes(pool.num_blocks)),), 0, 0, 0, 0, (0,) * 7))
    for r in pool.events.raw_after(0):
        if r[2] in UNREPLAYED_KINDS:
            before = (rep.owner.copy(), rep.state.copy(), rep.requested, rep.allocations, dict(rep.counters))
            rep.apply(r)
            assert np.array_equal(before[0], rep.owner) and np.array_equal(before[1], rep.state)
            assert before[2:] == (rep.requested, rep.allocations, rep.counters)
        else:
            rep.apply(r)


def _mutations(cols: EventColumns):
    """Structural damage a crafted file could carry, one at a time."""
    yield tuple(cols)[:-1]
    yield cols._replace(last=cols.last + 5)
    yield cols._replace(kind=cols.kind[:-1])
    yield cols._replace(nb=cols.nb[:-4])
    ne = np.frombuffer(cols.ne, np.int32).copy()
    ne[0] += 3
    yield cols._replace(ne=ne.tobytes())
    ids = np.frombuffer(cols.ids, np.int32).copy()
    ids[0] = -(1 << 30)
    yield cols._replace(ids=ids.tobytes())
    yield cols._replace(ids=cols.ids + b"\0\0\0\0")
    wide = np.frombuffer(cols.wide, np.int64).copy()
    wide[2::6] = 99  # evict's reason: a string index outside the table
    yield cols._replace(wide=wide.tobytes())
    yield cols._replace(keys=cols.keys[:-1])
    kind = bytearray(cols.kind)
    kind[0] = 0x3F
    yield cols._replace(kind=bytes(kind))
    yield cols._replace(block_bytes=0)


def test_crafted_columns_are_refused() -> None:
    cols = EventColumns._make(busy_pool(7).events.export(0, BLOCK))
    assert validate_columns(cols) is None
    for bad in _mutations(cols):
        assert isinstance(validate_columns(bad), str)
        assert isinstance(validate_columns(tuple(bad)), str)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_damage_is_refused_or_replays_in_bounds(data) -> None:
    cols = EventColumns._make(busy_pool(8, blocks=64).events.export(0, BLOCK))
    col = data.draw(st.sampled_from(["kind", "num", "nb", "ne", "ids"]))
    raw = bytearray(getattr(cols, col))
    if raw:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    cols = cols._replace(**{col: bytes(raw)})
    if validate_columns(cols) is None:  # consistent after all: the replay stays in the arrays
        owner = np.full(64, -1, np.int32)
        state = np.zeros(64, np.uint8)
        acc = np.zeros(4, np.int64)
        pos = np.zeros(5, np.int64)
        mask = np.zeros(64, np.uint8)
        while replay_columns(cols, owner, state, 0, cols.last, acc, pos, mask) >= 0:
            pass
        rows_of_columns2(cols)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(-40, 4096 + 40), length=st.integers(0, 70), packed=st.booleans())
def test_a_range_of_ids_gathers_as_the_ids_themselves(start: int, length: int, packed: bool) -> None:
    """Ranges (a contiguous pool's block ids) are cut from a shared int32 sequence, not built:
    the same bytes as building them, also at the edges (negative, past the shared sequence,
    here cut short to 4,096 ids)."""
    from allocator.history import replay

    value = (start, start + length) if packed else range(start, start + length)
    cap, replay.IOTA_MAX = replay.IOTA_MAX, 4096
    try:
        got = replay._ids_bytes(value)
    finally:
        replay.IOTA_MAX = cap
    assert got == np.arange(start, start + length, dtype=np.int32).tobytes()
