"""Metrics on hand-built layouts, with every number written out."""

from __future__ import annotations

import pytest

from allocator import OutOfMemory, create_pool


def test_paged_metrics_on_a_hand_built_layout() -> None:
    pool = create_pool("paged", num_blocks=8, block_bytes=100, device="cpu")
    s = pool.stats()
    assert (s["utilization"], s["internal_fragmentation"], s["external_fragmentation"]) == (0, 0, 0)
    assert s["largest_free_bytes"] == 800 and s["free_extents"] == {"8-15": 1}
    a = pool.allocate(150)  # blocks 0-1
    b = pool.allocate(100)  # block 2
    c = pool.allocate(1)  # block 3
    assert [pool.block_ids(x) for x in (a, b, c)] == [[0, 1], [2], [3]]
    s = pool.stats()
    assert s["requested_bytes"] == 251
    assert s["allocated_bytes"] == 400
    assert s["internal_fragmentation"] == 1 - 251 / 400  # 0.3725
    assert s["utilization"] == 4 / 8
    assert s["used_blocks"] == 4 and s["free_blocks"] == 4
    assert s["largest_free_bytes"] == 400
    assert s["external_fragmentation"] == 0.0  # one free run [4, 8)
    assert s["free_extents"] == {"4-7": 1}
    pool.free(b)  # free runs: [2,3) and [4,8)
    s = pool.stats()
    assert s["free_extents"] == {"1": 1, "4-7": 1}
    assert s["external_fragmentation"] == 1 - 4 / 5  # 0.2
    assert s["largest_free_bytes"] == 400
    assert s["internal_fragmentation"] == 1 - 151 / 300
    assert s["blocks_by_state"] == {"free": 5, "used": 3, "cached": 0, "pinned": 0, "shared": 0}


def test_contiguous_histogram_and_largest_free() -> None:
    pool = create_pool("contiguous", num_blocks=32, block_bytes=8, device="cpu")
    ids = [pool.allocate(8 * n) for n in (1, 1, 2, 2, 3, 4, 8, 11)]  # units 0..31
    for i in (0, 2, 4, 6):  # free runs of 1, 2, 3 and 8 units
        pool.free(ids[i])
    s = pool.stats()
    assert s["free_extents"] == {"1": 1, "2-3": 2, "8-15": 1}
    assert s["largest_free_bytes"] == 64
    assert s["external_fragmentation"] == 1 - 8 / 14
    assert s["utilization"] == 18 / 32
    assert s["free_extent_count"] == 4


def test_oom_counters_by_cause() -> None:
    paged = create_pool("paged", num_blocks=4, block_bytes=16, device="cpu")
    paged.allocate(16)
    for _ in range(2):
        with pytest.raises(OutOfMemory) as err:
            paged.allocate(64)  # fits the pool, not its free blocks
        assert err.value.cause == "capacity"
    assert paged.stats()["ooms"] == {"capacity": 2, "fragmentation": 0}
    assert paged.stats()["counters"]["ooms_capacity"] == 2

    arena = create_pool("contiguous", num_blocks=4, block_bytes=16, device="cpu")
    a, _, c, _ = (arena.allocate(16) for _ in range(4))
    arena.free(a)
    arena.free(c)
    with pytest.raises(OutOfMemory) as err:
        arena.allocate(32)  # 2 units free, not adjacent
    assert err.value.cause == "fragmentation"
    with pytest.raises(OutOfMemory) as err:
        arena.allocate(48)  # 3 units: more than is free
    assert err.value.cause == "capacity"
    assert arena.stats()["ooms"] == {"capacity": 1, "fragmentation": 1}


def test_tiered_metrics_count_whole_tier_blocks() -> None:
    pool = create_pool("tiered", num_blocks=64, block_bytes=16, device="cpu")
    aid = pool.allocate(40)  # a medium block: 4 units of 16 bytes
    s = pool.stats()
    assert pool.allocation(aid).tier == "medium"
    assert s["used_blocks"] == 4 and s["allocated_bytes"] == 64
    assert s["internal_fragmentation"] == 1 - 40 / 64
    assert s["utilization"] == 4 / 64
