"""The article's picture, worked by hand: enough memory free in total, yet a request fails."""

from __future__ import annotations

import pytest
from support.kvtest_util import payload

from allocator import OutOfMemory, create_pool

KIB = 1024
# Six allocations fill a 16-unit arena: A[0,2) B[2,5) C[5,6) D[6,10) E[10,12) F[12,16).
SIZES = {"A": 2, "B": 3, "C": 1, "D": 4, "E": 2, "F": 4}


def fill(pool) -> dict[str, int]:
    ids = {name: pool.allocate(units * KIB) for name, units in SIZES.items()}
    for name, aid in ids.items():
        pool.write(aid, payload(SIZES[name] * KIB, ord(name)))
    return ids


def test_contiguous_fails_with_fragmentation_then_defragment_fixes_it() -> None:
    pool = create_pool("contiguous", num_blocks=16, block_bytes=KIB, device="cpu")
    ids = fill(pool)
    assert [pool.allocation(ids[n]).blocks for n in SIZES] == [
        [[0, 2]], [[2, 3]], [[5, 1]], [[6, 4]], [[10, 2]], [[12, 4]]]
    for name in ("D", "B", "F"):  # out of order
        pool.free(ids.pop(name))
    # Free runs: [2,5) = 3 units, [6,10) = 4, [12,16) = 4. Total 11, largest 4.
    s = pool.stats()
    assert s["free_blocks"] == 11
    assert s["largest_free_bytes"] == 4 * KIB
    assert s["external_fragmentation"] == pytest.approx(1 - 4 / 11)  # 7/11 = 0.636...
    assert s["external_fragmentation"] == 1 - (4 * KIB) / (11 * KIB)
    assert s["free_extents"] == {"2-3": 1, "4-7": 2}
    # 5000 bytes = 5 units: 11 units are free, but no run is longer than 4.
    with pytest.raises(OutOfMemory) as err:
        pool.allocate(5000)
    assert err.value.cause == "fragmentation"
    assert (err.value.requested, err.value.free, err.value.largest_free) == (5000, 11 * KIB, 4 * KIB)
    assert pool.stats()["ooms"] == {"capacity": 0, "fragmentation": 1}
    assert pool.check() == []

    report = pool.defragment()
    # C slides 5 -> 2 (1 unit), E slides 10 -> 3 (2 units); A stays.
    assert report.moved_blocks == 3
    assert report.moved_bytes == 3 * KIB
    assert report.before == {"external_fragmentation": 1 - 4 / 11, "largest_free_bytes": 4 * KIB,
                             "free_extent_count": 3}
    assert report.after == {"external_fragmentation": 0.0, "largest_free_bytes": 11 * KIB,
                            "free_extent_count": 1}
    assert [pool.allocation(ids[n]).blocks for n in ("A", "C", "E")] == [[[0, 2]], [[2, 1]], [[3, 2]]]
    for name, aid in ids.items():
        assert pool.read(aid) == payload(SIZES[name] * KIB, ord(name)), name
    big = pool.allocate(5000)
    assert pool.allocation(big).blocks == [[5, 5]]
    assert pool.check() == []
    events = pool.events.after(0, kinds={"oom", "defragment"})
    assert [e["type"] for e in events] == ["oom", "defragment"]
    assert events[0]["cause"] == "fragmentation"
    assert events[1]["moved_blocks"] == 3


def test_paged_pool_never_fails_on_the_same_sequence() -> None:
    pool = create_pool("paged", num_blocks=16, block_bytes=KIB, device="cpu")
    ids = fill(pool)
    for name in ("D", "B", "F"):
        pool.free(ids.pop(name))
    s = pool.stats()
    assert s["free_blocks"] == 11
    assert s["external_fragmentation"] > 0  # the scatter is reported...
    big = pool.allocate(5000)  # ...but never causes a failure
    assert len(pool.block_ids(big)) == 5
    assert pool.allocate(6 * KIB)
    assert pool.stats()["ooms"] == {"capacity": 0, "fragmentation": 0}
    for name, aid in ids.items():
        assert pool.read(aid) == payload(SIZES[name] * KIB, ord(name))
    assert pool.check() == []
