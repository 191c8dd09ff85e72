"""The compiled fleet index against the plain model (tests/kvevents/fleet_model.py), step by
step: random stores (shared prompts, per-engine hash seeds, duplicates, fallback to engine hashes,
unknown parents), removes (known and unknown), clears and malformed events, by 3-16 engines whose
ids are drawn from the whole range (0..1023), so blocks are held within one page of 64 engines
and across several."""

from __future__ import annotations

import hashlib

from fleet_model import FleetModel, add_at
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvevents.codec import Cleared, Removed, Stored
from kvevents.index import MAX_FLEET_ENGINES, FleetIndex

BS = 2
# Engine ids: anywhere, and often at the edges of a page (64 engines) or of the range.
EDGES = (0, 1, 62, 63, 64, 65, 127, 128, 130, 511, 512, 959, 1022, MAX_FLEET_ENGINES - 1)
IDS = st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, MAX_FLEET_ENGINES - 1)),
               min_size=3, max_size=16, unique=True)
PICK = st.integers(0, 15)  # an engine: its index into the drawn ones, modulo their number
# A few prompts sharing prefixes, so engines store the same blocks.
BASE = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 6, 6, 7, 7, 8, 8]]


def engine_hash(seed: int, parent: int | None, tokens: tuple) -> int:
    d = hashlib.blake2b(repr((seed, parent, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(d, "big")


class FleetMachine(RuleBasedStateMachine):
    @initialize(ids=IDS)
    def start(self, ids):
        self.fleet = FleetIndex(capacity=16)
        self.model = FleetModel()
        self.names = [f"e{i}" for i in ids]
        add_at(self.fleet, dict(zip(self.names, ids)))
        for name in self.names:
            self.model.add(name)
        self.seen: dict[str, list[int]] = {e: [] for e in self.names}

    def pick(self, i: int) -> str:
        return self.names[i % len(self.names)]

    def apply(self, e: str, events) -> None:
        self.fleet.apply(self.fleet.engine(e).eid, events)
        for ev in events:
            if ev.kind == "stored":
                self.model.store(e, ev.block_hashes, ev.parent, ev.token_ids, ev.block_size)
            elif ev.kind == "removed":
                self.model.remove(e, ev.block_hashes)
            else:
                self.model.clear(e)

    @rule(i=PICK, prompt=st.sampled_from(range(len(BASE))),
          start=st.integers(0, 3), n=st.integers(1, 4), tokens=st.booleans(),
          orphan=st.booleans(), seed_shared=st.booleans())
    def store(self, i, prompt, start, n, tokens, orphan, seed_shared):
        e = self.pick(i)
        # Engines hash with their own seed, except sometimes all alike (as Dynamo assumes).
        seed = 0 if seed_shared else self.names.index(e) + 1
        toks = BASE[prompt]
        n = min(n, len(toks) // BS - start)
        if n <= 0:
            return
        parent = None
        for i in range(start):
            parent = engine_hash(seed, parent, tuple(toks[i * BS:(i + 1) * BS]))
        if orphan and parent is None:
            parent = 12345  # an engine hash nobody stored
        hashes, h = [], parent
        for i in range(start, start + n):
            h = engine_hash(seed, h, tuple(toks[i * BS:(i + 1) * BS]))
            hashes.append(h)
        self.seen[e].extend(hashes)
        body = toks[start * BS:(start + n) * BS] if tokens else None
        self.apply(e, [Stored(hashes, parent, body, BS, "GPU")])

    @rule(prompt=st.sampled_from(range(len(BASE))), n=st.integers(1, 4), every=st.integers(1, 3))
    def store_everywhere(self, prompt, n, every):
        """A popular prompt: every `every`-th engine stores its first `n` blocks (so a block is
        held on many pages at once)."""
        for e in self.names[::every]:
            self.store(self.names.index(e), prompt, 0, n, True, False, False)

    @precondition(lambda self: any(self.seen.values()))
    @rule(data=st.data(), i=PICK)
    def remove(self, data, i):
        e = self.pick(i)
        pool = self.seen[e] or [777]
        hashes = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        self.apply(e, [Removed(hashes, "GPU")])

    @rule(i=PICK)
    def clear(self, i):
        self.apply(self.pick(i), [Cleared()])

    @rule(i=PICK)
    def malformed(self, i):
        e = self.pick(i)
        bad = [Stored([1, 2], None, [1, 2, 3], BS, "GPU"),  # token count does not fit
               Stored([3], None, ["a", "b"], BS, "GPU"),
               Removed([-5], "GPU"),
               Stored([4], None, [1, 2], BS, "TAPE")]  # a medium that is no tier: skipped
        before = self.fleet.engine_stats(e)["malformed_events"]
        assert self.fleet.apply(self.fleet.engine(e).eid, bad) == 3
        assert self.fleet.engine_stats(e)["malformed_events"] == before + 3

    @rule(prompt=st.sampled_from(range(len(BASE))), cut=st.integers(0, 8))
    def match(self, prompt, cut):
        toks = BASE[prompt][:cut]
        assert self.fleet.match(toks) == self.model.match(toks)

    @precondition(lambda self: any(self.seen.values()))
    @rule(data=st.data(), i=PICK)
    def match_hashes(self, data, i):
        e = self.pick(i)
        pool = self.seen[e] or [1]
        hashes = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        assert self.fleet.match_engine_hashes(e, hashes) == self.model.match_hashes(e, hashes)

    @invariant()
    def same_figures(self):
        if not hasattr(self, "fleet"):
            return
        s = self.fleet.stats()
        assert {k: s[k] for k in self.model.stats()} == self.model.stats()
        for e in self.names:
            assert self.fleet.engine_stats(e)["cached_blocks"] == len(self.model.tables[e])
        assert self.fleet.check() == []

    @rule()
    def layout(self):
        """The block map's engines per block and blocks per engine are the model's holders."""
        lay = self.fleet.layout()
        keys = lay.keys.tolist()
        for j, k in enumerate(keys):
            assert self.fleet.mask_of(k) == sum(1 << e for e in lay.engines_of(j))
        for e in (self.fleet.engine(n).eid for n in self.names):
            mine = {keys[j] for j in lay.positions[lay.by_engine[e]:lay.by_engine[e + 1]].tolist()}
            assert mine == set(self.fleet.engine_table(e).values())
        same = {}
        for j in range(len(keys)):  # equal engine sets, equal set hashes (and only those)
            assert same.setdefault(tuple(lay.engines_of(j)), int(lay.sets[j])) == int(lay.sets[j])
        assert len(set(same.values())) == len(same)


TestFleetStateful = FleetMachine.TestCase
TestFleetStateful.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
