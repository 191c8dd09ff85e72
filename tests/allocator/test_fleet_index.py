"""FleetIndex's engine bookkeeping: names, limits, block sizes, fallback keys, engine removal."""

from __future__ import annotations

import pytest

from allocator.errors import Conflict, NotFound
from allocator.fleet import MAX_FLEET_ENGINES, FleetIndex
from kvevents.codec import Stored

TOKENS = list(range(16))


def test_names_and_the_engine_limit():
    f = FleetIndex(max_engines=3)
    for n in ("a", "b", "c"):
        f.add(n)
    with pytest.raises(Conflict, match="already in the fleet"):
        f.add("a")
    with pytest.raises(Conflict, match=r"the most it takes \(3\)"):
        f.add("d")
    f.discard("b")
    assert f.add("d").eid == 1  # the freed bit is reused
    with pytest.raises(NotFound):
        f.discard("zz")
    assert MAX_FLEET_ENGINES == 64


def test_block_size_comes_from_events_and_a_mismatch_is_an_engine_error():
    f = FleetIndex()
    f.add("a", block_size=8)
    f.add("b", block_size=4)
    f.apply(0, [Stored([1, 2], None, TOKENS[:8], 4)])
    f.apply(1, [Stored([5, 6], None, TOKENS[:8], 4)])
    a, b = f.engine_stats("a"), f.engine_stats("b")
    assert a["block_size"] == 4 and "configured with 8" in a["block_size_error"]
    assert b["block_size_error"] is None
    assert f.match(TOKENS) == {"a": 2, "b": 2}  # both on the block size their events show


def test_events_without_token_ids_fall_back_to_engine_hashes():
    f = FleetIndex()
    for n in ("a", "b", "c"):
        f.add(n, block_size=4)
    f.apply(0, [Stored([10, 11], None, None, 4)])
    f.apply(1, [Stored([10, 11], None, None, 4)])  # hashes alike: the same blocks
    f.apply(2, [Stored([20, 21], None, None, 4)])  # its own seed: nothing shared
    assert f.engine_stats("a")["keyed_by"] == "engine hashes"
    assert f.stats()["unique_blocks"] == 4 and f.stats()["duplicated_blocks"] == 2
    assert f.match_engine_hashes("a", [10, 11]) == {"a": 2, "b": 2, "c": 0}
    assert f.match(TOKENS[:8]) == {"a": 0, "b": 0, "c": 0}  # no tokens were ever seen
    assert f.check() == []


def test_removing_an_engine_drops_what_it_held():
    f = FleetIndex()
    f.add("a")
    f.add("b")
    f.apply(0, [Stored([1, 2], None, TOKENS[:8], 4)])
    f.apply(1, [Stored([3, 4], None, TOKENS[:8], 4)])
    f.discard("a")
    s = f.stats()
    assert (s["unique_blocks"], s["duplicated_blocks"], s["duplicate_copies"]) == (2, 0, 0)
    assert f.match(TOKENS) == {"b": 2}
    assert f.check() == []


def test_the_index_grows_past_its_first_capacity_and_stays_consistent():
    f = FleetIndex(capacity=16)
    f.add("a")
    f.add("b")
    for i in range(200):
        toks = [i] * 4 + [7] * 4
        f.apply(i % 2, [Stored([2 * i + 1, 2 * i + 2], None, toks, 4)])
    assert f.unique == 400 and f.check() == []
    assert f.memory_bytes() / f.holdings < 200
