"""Storage tiers in the fleet index (kvevents/tiers.py, kvevents/index.py): the compiled tiers
against a plain model (tests/kvevents/tier_model.py) over random stores, removes and clears on
every medium; the weighted (llm-d) and tiered (Dynamo) matches against the model's; the media
names; and the GPU-only path staying one index."""

from __future__ import annotations

import gc
import hashlib
import weakref

import pytest
from fleet_model import add_at
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tier_model import TierModel

from kvevents.codec import Cleared, Removed, Stored
from kvevents.index import MAX_FLEET_ENGINES, FleetIndex
from kvevents.tiers import TIERS, tier_of, weights_of

BS = 2
EDGES = (0, 1, 63, 64, 65, 511, MAX_FLEET_ENGINES - 1)
IDS = st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, MAX_FLEET_ENGINES - 1)),
               min_size=2, max_size=6, unique=True)
PICK = st.integers(0, 15)
# vLLM's media (None: an engine that names none), Dynamo's as kvscope decodes them, one no tier
MEDIA = st.sampled_from([None, "GPU", "GPU", "CPU", "CPU", "STORAGE", "CPU_PINNED", "DISK", "EXTERNAL",
                         "TAPE"])
BASE = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 6, 6, 7, 7, 8, 8]]
WEIGHTS = st.sampled_from([{"gpu": 1.0, "cpu": 0.8}, {"gpu": 1.0}, {"cpu": 2.0, "disk": 0.5, "gpu": 0.0},
                           {"gpu": 1.0, "cpu": 0.8, "disk": 0.5, "external": 0.25}])


def engine_hash(seed: int, parent: int | None, tokens: tuple) -> int:
    d = hashlib.blake2b(repr((seed, parent, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(d, "big")


class TierMachine(RuleBasedStateMachine):
    @initialize(ids=IDS)
    def start(self, ids):
        self.fleet = FleetIndex(capacity=16)
        self.names = [f"e{i}" for i in ids]
        add_at(self.fleet, dict(zip(self.names, ids)))
        self.model = TierModel(self.names)
        self.seen: dict[str, list[int]] = {e: [] for e in self.names}

    def pick(self, i: int) -> str:
        return self.names[i % len(self.names)]

    def apply(self, e: str, events) -> None:
        self.fleet.apply(self.fleet.engine(e).eid, events)
        for ev in events:
            self.model.apply(e, ev)

    @rule(i=PICK, medium=MEDIA, prompt=st.sampled_from(range(len(BASE))), start=st.integers(0, 3),
          n=st.integers(1, 4), how=st.sampled_from(["tokens", "tokens", "no tokens", "placeholder"]),
          orphan=st.booleans())
    def store(self, i, medium, prompt, start, n, how, orphan):
        e = self.pick(i)
        seed = self.names.index(e) + 1  # every engine hashes its own way: keys come from tokens
        toks = BASE[prompt]
        n = min(n, len(toks) // BS - start)
        if n <= 0:
            return
        parent = None
        for j in range(start):
            parent = engine_hash(seed, parent, tuple(toks[j * BS:(j + 1) * BS]))
        if orphan and parent is None:
            parent = 12345
        hashes, h = [], parent
        for j in range(start, start + n):
            h = engine_hash(seed, h, tuple(toks[j * BS:(j + 1) * BS]))
            hashes.append(h)
        self.seen[e].extend(hashes)
        if how == "tokens":
            ev = Stored(hashes, parent, toks[start * BS:(start + n) * BS], BS, medium)
        elif how == "no tokens":
            ev = Stored(hashes, parent, None, BS, medium)
        else:  # vLLM's offloading placeholder: one hash, no parent, no tokens, block size 0
            ev = Stored(hashes[-1:], None, [], 0, medium)
        self.apply(e, [ev])

    @rule(i=PICK, media=st.lists(st.sampled_from(["CPU", "STORAGE", "CPU_PINNED", "EXTERNAL"]), min_size=4,
                                 max_size=4), k=st.integers(1, 4), placeholder=st.booleans(), evict=st.booleans())
    def offload(self, i, media, k, placeholder, evict):
        """What offloading connectors do, in one batch: copy some of the engine's GPU blocks to
        other tiers (announced by hash alone, or with their payload under the same parent), and
        maybe evict them from the GPU afterwards."""
        e = self.pick(i)
        gpu = list(self.model.tables[e]["gpu"].items())[:k]
        if not gpu:
            return
        events = []
        for j, (h, (key, _n)) in enumerate(gpu):
            medium = media[j]
            if placeholder or not isinstance(key[2], tuple) or key[0] is not None:
                events.append(Stored([h], None, [], 0, medium))
            else:  # a root block with its tokens
                events.append(Stored([h], None, list(key[2]), BS, medium))
        if evict:
            events.append(Removed([h for h, _ in gpu], "GPU"))
        self.apply(e, events)

    @rule(i=PICK, prompt=st.sampled_from(range(len(BASE))), n=st.integers(2, 4), start=st.integers(1, 3),
          medium=st.sampled_from(["CPU", "STORAGE", "CPU_PINNED"]), evict=st.booleans())
    def offload_tail(self, i, prompt, n, start, medium, evict):
        """A chain stored on the GPU whose tail goes to another tier with its payload, under
        its parent's hash (a block the tier does not hold), then maybe leaves the GPU."""
        start = min(start, n - 1)
        e = self.pick(i)
        seed = self.names.index(e) + 1
        toks = BASE[prompt]
        hashes, h = [], None
        for j in range(n):
            h = engine_hash(seed, h, tuple(toks[j * BS:(j + 1) * BS]))
            hashes.append(h)
        self.seen[e].extend(hashes)
        events = [Stored(hashes, None, toks[:n * BS], BS, "GPU"),
                  Stored(hashes[start:], hashes[start - 1], toks[start * BS:n * BS], BS, medium)]
        if evict:
            events.append(Removed(hashes[start:], "GPU"))
        self.apply(e, events)

    @precondition(lambda self: any(self.seen.values()))
    @rule(data=st.data(), i=PICK, medium=MEDIA)
    def remove(self, data, i, medium):
        e = self.pick(i)
        pool = self.seen[e] or [777]
        self.apply(e, [Removed(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4)), medium)])

    @rule(i=PICK, medium=st.sampled_from([None, None, "GPU", "CPU", "STORAGE"]))
    def clear(self, i, medium):
        self.apply(self.pick(i), [Cleared(medium=medium)])

    @rule(i=PICK)
    def restart(self, i):
        e = self.pick(i)
        self.fleet.clear_all(self.fleet.engine(e).eid)
        self.model.apply(e, Cleared())

    @rule(prompt=st.sampled_from(range(len(BASE))), cut=st.integers(0, 8), weights=WEIGHTS)
    def weighted_match(self, prompt, cut, weights):
        toks = BASE[prompt][:cut]
        keys = self.fleet.keys_of(toks, BS)
        got = {self.fleet.name_of(e): s for e, s in self.fleet.match_weighted(keys, weights).items()}
        assert got == pytest.approx(self.model.weighted(self.model.keys_of(toks, BS), weights))

    @rule(prompt=st.sampled_from(range(len(BASE))), cut=st.integers(0, 8))
    def tiered_match(self, prompt, cut):
        toks = BASE[prompt][:cut]
        keys = self.fleet.keys_of(toks, BS)
        device = self.fleet.match_keys(keys) if keys else {}
        lower = self.fleet.match_lower_tiers(keys, device)
        want = self.model.tiered(self.model.keys_of(toks, BS))
        name = self.fleet.name_of
        assert {name(e): n for e, n in device.items()} == {e: r["gpu"] for e, r in want.items() if r.get("gpu")}
        for tier in TIERS[1:]:
            if tier in lower:
                assert {name(e): n for e, n in lower[tier].items()} == \
                    {e: r[tier] for e, r in want.items() if tier in r}, tier
            else:  # a tier no event named yet: nobody holds anything there
                assert not any(r.get(tier) for r in want.values())

    @invariant()
    def same_blocks(self):
        if not hasattr(self, "fleet"):
            return
        for e in self.names:
            got = self.fleet.engine_stats(e)["tiers"]
            want = self.model.blocks(e)
            assert got == {t: want[t] for t in got} and not any(want[t] for t in TIERS if t not in got)
        assert self.fleet.check() == []


TestTiersAgainstTheModel = TierMachine.TestCase
TestTiersAgainstTheModel.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def test_one_block_on_the_gpu_and_the_cpu_at_once_and_removes_name_their_medium():
    fleet = FleetIndex()
    a = fleet.add("a").eid
    toks = list(range(8))
    fleet.apply(a, [Stored([1, 2], None, toks, 4, "GPU"), Stored([1, 2], None, toks, 4, "CPU")])
    assert fleet.engine_stats("a")["tiers"] == {"gpu": 2, "cpu": 2}
    assert fleet.engine_stats("a")["tier_counters"] == {"cpu": {"stored_events": 1, "stored_blocks": 2}}
    assert fleet.stats()["unique_blocks"] == 2 and fleet.stats()["tiers"]["cpu"]["unique_blocks"] == 2
    fleet.apply(a, [Removed([2], "GPU")])  # evicted from the GPU, still offloaded
    assert fleet.engine_stats("a")["tiers"] == {"gpu": 1, "cpu": 2}
    keys = fleet.keys_of(toks, 4)
    assert fleet.match_keys(keys) == {a: 1}
    assert fleet.match_weighted(keys, {"gpu": 1.0, "cpu": 0.8}) == {a: pytest.approx(1.8)}
    fleet.apply(a, [Removed([1, 9], "CPU"), Stored([3], None, [1], 4, "CPU")])  # 9: not held; bad tokens
    c = fleet.engine_stats("a")
    assert c["tier_counters"]["cpu"]["unknown_removes"] == 1 and c["malformed_events"] == 1
    fleet.apply(a, [Removed([2], "CPU"), Cleared()])
    assert fleet.engine_stats("a")["tiers"] == {"gpu": 0, "cpu": 0} and fleet.check() == []


def test_a_gpu_only_fleet_makes_no_other_index_and_unknown_media_are_counted():
    fleet = FleetIndex()
    a = fleet.add("a").eid
    fleet.apply(a, [Stored([1], None, [1, 2], 2, None), Stored([2], 1, [3, 4], 2, "GPU"),
                    Removed([7], "GPU"), Cleared(medium="GPU")])
    assert fleet.tiers == {} and fleet.engine_stats("a")["tiers"] == {"gpu": 0}
    fleet.apply(a, [Stored([3], None, [1, 2], 2, "TAPE"), Stored([4], None, [1, 2], 2, "x" * 100)])
    assert fleet.tiers == {} and fleet.engine_stats("a")["other_medium"] == 2


def test_tiers_follow_the_engines_added_and_removed():
    fleet = FleetIndex()
    a = fleet.add("a").eid
    fleet.apply(a, [Stored([1], None, [1, 2], 2, "CPU")])
    b = fleet.add("b").eid
    fleet.apply(b, [Stored([5], None, [1, 2], 2, "CPU")])
    assert fleet.tiers["cpu"].unique == 1 and fleet.tiers["cpu"].holdings == 2
    fleet.discard("a")
    assert fleet.tiers["cpu"].holdings == 1 and fleet.check() == []
    v = fleet.version()
    fleet.apply(b, [Removed([5], "CPU")])
    assert fleet.version() > v  # a change on another tier is a change of the fleet's index
    fleet.release()
    assert fleet.tiers == {} and fleet.engines == {}


def test_an_index_with_tiers_is_freed_by_reference_counting_alone():
    """No core refers back to the GPU's (a tier's core is handed the others with each event), so
    a dropped index with tiers goes without the cycle collector, released or not."""
    for release in (False, True):
        fleet = FleetIndex()
        a = fleet.add("a").eid
        fleet.apply(a, [Stored([1, 2], None, [1, 2, 3, 4], 2, "GPU"), Stored([2], 1, [], 0, "CPU"),
                        Stored([3], None, [], 0, "STORAGE")])
        assert set(fleet.tiers) == {"cpu", "disk"} and fleet.check() == []
        ref = weakref.ref(fleet)  # (the compiled cores take no weak references: the index's does)
        if release:
            fleet.release()
        gc.collect()
        gc.disable()
        try:
            del fleet
            assert ref() is None
        finally:
            gc.enable()


def test_the_media_names_map_to_the_tiers():
    assert [tier_of(m) for m in (None, "GPU", "gpu", "device", "CPU", "cpu", "host_pinned", "CPU_PINNED",
                                 "STORAGE", "disk", "DISK", "external", "EXTERNAL")] == \
        ["gpu", "gpu", "gpu", "gpu", "cpu", "cpu", "cpu", "cpu", "disk", "disk", "disk", "external", "external"]
    assert tier_of("TAPE") is None and tier_of(3) is None and tier_of("G" * 40) is None
    assert weights_of(None) == {"gpu": 1.0, "cpu": 0.8}
    assert weights_of({"GPU": 1, "host_pinned": 0.5, "STORAGE": 0}) == {"gpu": 1.0, "cpu": 0.5, "disk": 0.0}
    for bad, says in (({"tape": 1.0}, "not a tier"), ({"cpu": 1.0, "CPU": 0.5}, "both name tier 'cpu'"),
                      ({"gpu": -1.0}, "finite number"), ({"gpu": float("inf")}, "finite number"),
                      ({"gpu": float("nan")}, "finite number"), ({"gpu": True}, "finite number")):
        with pytest.raises(ValueError, match=says):
            weights_of(bad)
