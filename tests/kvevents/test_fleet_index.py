"""FleetIndex's engine bookkeeping: names, limits, block sizes, fallback keys, engine removal."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.errors import Conflict, InvalidRequest, NotFound
from kvevents.codec import Removed, Stored
from kvevents.fleet import APPLY_PART_BLOCKS, _parts
from kvevents.index import MAX_FLEET_ENGINES, FleetIndex

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
    assert f.add("d").eid == 1  # the freed id is reused
    with pytest.raises(NotFound):
        f.discard("zz")
    assert MAX_FLEET_ENGINES == 1024
    with pytest.raises(InvalidRequest):
        FleetIndex(max_engines=MAX_FLEET_ENGINES + 1)


def test_a_full_fleet_of_dp_ranks_indexes_matches_and_refuses_one_more():
    """128 servers x 8 DP ranks: every rank holds the shared system prompt, each server its
    own prompt on its ranks, each rank its own tail; matches give each its prefix."""
    f = FleetIndex()
    system = list(range(1000, 1000 + 8))  # two blocks of 4
    for s in range(128):
        for r in range(8):
            info = f.add(f"s{s}:dp{r}", server=f"s{s}", dp_rank=r, block_size=4)
            assert info.eid == s * 8 + r
            own = [s] * 4 + [10_000 + info.eid] * 4
            f.apply(info.eid, [Stored([1, 2, 3, 4], None, system + own, 4)])
    with pytest.raises(Conflict, match=r"the most it takes \(1024\)"):
        f.add("one-more")
    assert f.holdings == 1024 * 4 and f.unique == 2 + 128 + 1024 and f.check() == []
    got = f.match(system + [5] * 4 + [10_000 + 42] * 4)
    assert got["s5:dp2"] == 4  # 5 * 8 + 2 = 42: the whole prompt
    assert all(got[f"s5:dp{r}"] == 3 for r in range(8) if r != 2)
    assert sum(n == 2 for n in got.values()) == 1024 - 8
    assert f.match_engine_hashes("s127:dp7", [1, 2, 3]) == {
        n: (3 if n.startswith("s127:") else 2) for n in f.engines}
    # every server but one drops the system prompt's first block: the trunk keeps 8 holders
    for s in range(127):
        for r in range(8):
            f.remove(s * 8 + r, [1])
    assert f.mask_of(f.keys_of(system, 4)[0]) == 0xFF << (127 * 8)
    assert f.chunk_of(f.keys_of(system, 4)[0]) is None  # one page left: back inline
    assert f.check() == []
    f.discard("s127:dp0")
    assert f.add("again").eid == 127 * 8  # the freed id, on its server's page


@given(st.lists(st.tuples(st.integers(0, MAX_FLEET_ENGINES - 1), st.booleans()), min_size=1,
                max_size=200))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_block_held_and_dropped_across_every_page(steps):
    """Engines anywhere in 0..1023 take and drop one block: its engines, the counts and the
    invariants (a chunk of pages only while they span two or more, sorted) hold at each step."""
    f = FleetIndex(max_engines=MAX_FLEET_ENGINES)
    for e in range(MAX_FLEET_ENGINES):
        f.add(f"e{e}", block_size=4)
    key = f.keys_of(TOKENS[:4], 4)[0]
    held: set[int] = set()
    for e, store in steps:
        if store:
            f.apply(e, [Stored([7], None, TOKENS[:4], 4)])
            if e in held:  # stored again: one more copy, dropped by one more remove
                f.apply(e, [Removed([7])])
            held.add(e)
        elif e in held:
            f.apply(e, [Removed([7])])
            held.discard(e)
        assert f.mask_of(key) == sum(1 << x for x in held)
        assert f.holdings == len(held) and f.unique == (1 if held else 0)
        assert f.duplicated == (1 if len(held) > 1 else 0)
        chunk = f.chunk_of(key)
        pages = sorted({x >> 6 for x in held})
        assert (chunk is None) == (len(pages) < 2)
        if chunk is not None:
            assert chunk[0] == pages and chunk[2] >= len(pages)
        want = {f"e{x}": 1 for x in held}
        assert {n: v for n, v in f.match(TOKENS[:4]).items() if v} == want
    assert f.check() == []
    lay = f.layout()
    if held:
        assert lay.engines_of(0) == sorted(held)
        assert [lay.positions[lay.by_engine[x]:lay.by_engine[x + 1]].tolist() for x in sorted(held)] \
            == [[0]] * len(held)


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


def test_a_stored_chain_is_found_again_from_its_last_block():
    f = FleetIndex()
    f.add("a")
    f.add("b")
    f.apply(0, [Stored([1, 2, 3], None, TOKENS[:12], 4)])
    f.apply(1, [Stored([7, 8], None, TOKENS[:8], 4)])
    key = f.key_of(0, 3)
    chain = f.chain_of(key)
    assert chain == f.keys_of(TOKENS[:12], 4)
    assert f.match_chain(key) == {"a": 3, "b": 2}
    assert f.key_of(0, 99) is None and f.chain_of(12345) == []
    f.apply(0, [Removed([2])])
    f.apply(1, [Removed([8])])  # nobody holds the middle block now
    assert f.chain_of(key) == [key]  # the chain starts below the missing block
    assert f.match_chain(key) == {"a": 0, "b": 0}  # a chain that does not start at the root


def test_layout_names_each_block_s_chain_root():
    f = FleetIndex()
    f.add("a")
    f.add("b")
    f.apply(0, [Stored([1, 2, 3], None, TOKENS[:12], 4)])
    f.apply(1, [Stored([5, 6], None, [9] * 8, 4), Stored([7], 6, [8] * 4, 4)])
    lay = f.layout()
    root_of = dict(zip(lay.keys.tolist(), lay.roots.tolist()))
    a = f.keys_of(TOKENS[:12], 4)
    b = f.keys_of([9] * 8 + [8] * 4, 4)
    assert all(root_of[k] == a[0] for k in a) and all(root_of[k] == b[0] for k in b)
    # small trees: one colour group per root
    group_of = dict(zip(lay.keys.tolist(), lay.groups.tolist()))
    assert group_of == root_of and lay.cycles == 0 and not lay.cycle_blocks.any()
    f.apply(1, [Removed([5])])  # b's root goes: its chain now starts at its second block
    lay = f.layout()
    root_of = dict(zip(lay.keys.tolist(), lay.roots.tolist()))
    assert root_of[b[1]] == b[1] and root_of[b[2]] == b[1]


def cycle_events(pairs: int, base: int = 1000) -> list:
    """Per pair, without token ids: store A; store B under A; remove A; store A under B. Such
    blocks are keyed by the engine's own hashes, so A's new node names B as its parent while
    B's names A: a 2-block parent cycle."""
    out = []
    for i in range(pairs):
        a, b = base + 2 * i, base + 2 * i + 1
        out += [Stored([a], None, None, None), Stored([b], a, None, None), Removed([a]),
                Stored([a], b, None, None)]
    return out


def test_parent_cycles_are_cut_counted_once_and_bound_every_walk():
    f = FleetIndex()
    f.add("a")
    f.add("b")
    f.apply(0, cycle_events(3))
    f.apply(1, [Stored([1, 2], None, TOKENS[:8], 4)])
    assert f.check() == []
    a = f.key_of(0, 1000)
    b = f.key_of(0, 1001)
    assert f.parent_of(a) == b and f.parent_of(b) == a  # the cycle is in the index
    assert f.chain_of(a) == [b, a] and f.chain_of(b) == [a, b]  # stops at the block met again
    assert f.match_chain(a) == {"a": 0, "b": 0}  # a loop never reaches the root
    lay = f.layout()
    assert lay.cycles == 3
    assert lay.cycle_blocks[0] == 6 and lay.cycle_blocks[1] == 0
    root_of = dict(zip(lay.keys.tolist(), lay.roots.tolist()))
    assert root_of[a] in (a, b) and root_of[b] == root_of[a]  # each cycle is one tree once cut
    assert len(lay.keys) == f.unique
    f.apply(0, [Removed([1000])])
    assert f.layout().cycles == 2  # counted from what is indexed now


def test_a_long_cycle_costs_one_pass():
    f = FleetIndex()
    f.add("a")
    n = 50_000  # a ring of n blocks: store them in a chain, then re-store the first under the last
    f.apply(0, [Stored(list(range(1, n + 1)), None, None, None), Removed([1]),
                Stored([1], n, None, None)])
    assert len(f.chain_of(f.key_of(0, 1))) == n
    lay = f.layout()
    assert lay.cycles == 1 and lay.cycle_blocks[0] == n


def test_a_shared_trunk_is_split_into_the_subtrees_below_it():
    f = FleetIndex()
    f.add("a")
    f.add("b")
    trunk = [7] * 8  # every prompt starts with the same two blocks
    prompts = [trunk + [100 + i] * 12 for i in range(10)]
    for i, p in enumerate(prompts):
        f.store(i % 2, [1000 * i + j for j in range(5)], None, p, 4)
    lay = f.layout(divisor=8, min_group=1)  # 42 blocks: groups of at most 5
    group_of = dict(zip(lay.keys.tolist(), lay.groups.tolist()))
    root_of = dict(zip(lay.keys.tolist(), lay.roots.tolist()))
    t = f.keys_of(trunk, 4)
    assert len(set(root_of.values())) == 1  # one root for everything
    assert group_of[t[0]] == group_of[t[1]] == 0  # the trunk: shared
    for p in prompts:
        ks = f.keys_of(p, 4)[2:]
        assert {group_of[k] for k in ks} == {ks[0]}  # each request's own subtree, one colour
    assert len({g for g in group_of.values() if g}) == 10
    # with the default bound (64 blocks here) a small index keeps one colour per root
    assert set(f.layout().groups.tolist()) == {t[0]}


def test_the_version_rises_with_every_change():
    f = FleetIndex()
    f.add("a")
    seen = [f.version()]

    def changed():
        v = f.version()
        assert v > seen[-1]
        seen.append(v)

    f.apply(0, [Stored([1], None, TOKENS[:4], 4)])
    changed()
    f.store(0, [2], 1, TOKENS[4:8], 4)
    changed()
    f.remove(0, [2])
    changed()
    f.clear(0)
    changed()
    f.add("b")
    changed()
    f.discard("a")
    changed()
    f.add("a")  # takes bit 0 again: its counters restart, the version does not go back
    changed()
    same = f.version()
    f.layout(), f.chain_of(1), f.nodes()
    assert f.version() == same


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["stored", "removed", "tokens"]),
                          st.integers(1, 3 * 4096 + 7), st.integers(0, 3)), min_size=1, max_size=5))
def test_a_batch_applied_in_parts_is_the_batch_applied_whole(spec):
    """The fleet applies a batch in parts of at most APPLY_PART_BLOCKS blocks, splitting a longer
    event into pieces (a stored chain's later pieces under the piece before): the index, its
    counters and its matches are those of the batch applied whole, event by event."""
    events, base = [], 1
    for kind, n, parent_of in spec:
        if kind == "removed":
            events.append(Removed(list(range(1, 1 + n))))
            continue
        parent = None if parent_of == 0 or base == 1 else base - 1
        tokens = list(range(base * 2, base * 2 + n * 2)) if kind == "tokens" else None
        events.append(Stored(list(range(base, base + n)), parent, tokens, 2))
        base += n
    whole, parted = FleetIndex(), FleetIndex()
    for ix in (whole, parted):
        ix.add("e", max_blocks=1 << 20)
    whole.apply(whole.engine("e").eid, events, True)
    parts = _parts(events)
    assert all(sum(len(getattr(ev, "block_hashes", ())) for ev in p) <= APPLY_PART_BLOCKS
               for p in parts)
    for i, part in enumerate(parts):
        parted.apply(parted.engine("e").eid, part, i == 0)
    assert parted.engine_stats("e") == whole.engine_stats("e")
    assert parted.stats() == whole.stats()
    probe = list(range(2, 2 + min(base, 9000) * 2))
    assert parted.match(probe) == whole.match(probe)
