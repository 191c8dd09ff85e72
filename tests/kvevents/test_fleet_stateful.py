"""The compiled fleet index against the plain model (tests/kvevents/fleet_model.py), step by
step: random stores (shared prompts, per-engine hash seeds, duplicates, fallback to engine hashes,
unknown parents), removes (known and unknown), clears and malformed events."""

from __future__ import annotations

import hashlib

from fleet_model import FleetModel
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvevents.codec import Cleared, Removed, Stored
from kvevents.index import FleetIndex

BS = 2
ENGINES = ("e0", "e1", "e2")
# A few prompts sharing prefixes, so engines store the same blocks.
BASE = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 6, 6, 7, 7, 8, 8]]


def engine_hash(seed: int, parent: int | None, tokens: tuple) -> int:
    d = hashlib.blake2b(repr((seed, parent, tokens)).encode(), digest_size=8).digest()
    return int.from_bytes(d, "big")


class FleetMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.fleet = FleetIndex(capacity=16)
        self.model = FleetModel()
        for name in ENGINES:
            self.fleet.add(name)
            self.model.add(name)
        self.seen: dict[str, list[int]] = {e: [] for e in ENGINES}

    def apply(self, e: str, events) -> None:
        self.fleet.apply(self.fleet.engine(e).eid, events)
        for ev in events:
            if ev.kind == "stored":
                self.model.store(e, ev.block_hashes, ev.parent, ev.token_ids, ev.block_size)
            elif ev.kind == "removed":
                self.model.remove(e, ev.block_hashes)
            else:
                self.model.clear(e)

    @rule(e=st.sampled_from(ENGINES), prompt=st.sampled_from(range(len(BASE))),
          start=st.integers(0, 3), n=st.integers(1, 4), tokens=st.booleans(),
          orphan=st.booleans(), seed_shared=st.booleans())
    def store(self, e, prompt, start, n, tokens, orphan, seed_shared):
        # Engines hash with their own seed, except sometimes all alike (as Dynamo assumes).
        seed = 0 if seed_shared else ENGINES.index(e) + 1
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

    @precondition(lambda self: any(self.seen.values()))
    @rule(data=st.data(), e=st.sampled_from(ENGINES))
    def remove(self, data, e):
        pool = self.seen[e] or [777]
        hashes = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        self.apply(e, [Removed(hashes, "GPU")])

    @rule(e=st.sampled_from(ENGINES))
    def clear(self, e):
        self.apply(e, [Cleared()])

    @rule(e=st.sampled_from(ENGINES))
    def malformed(self, e):
        bad = [Stored([1, 2], None, [1, 2, 3], BS, "GPU"),  # token count does not fit
               Stored([3], None, ["a", "b"], BS, "GPU"),
               Removed([-5], "GPU"),
               Stored([4], None, [1, 2], BS, "CPU")]  # another medium: skipped
        before = self.fleet.engine_stats(e)["malformed_events"]
        assert self.fleet.apply(self.fleet.engine(e).eid, bad) == 3
        assert self.fleet.engine_stats(e)["malformed_events"] == before + 3

    @rule(prompt=st.sampled_from(range(len(BASE))), cut=st.integers(0, 8))
    def match(self, prompt, cut):
        toks = BASE[prompt][:cut]
        assert self.fleet.match(toks) == self.model.match(toks)

    @precondition(lambda self: any(self.seen.values()))
    @rule(data=st.data(), e=st.sampled_from(ENGINES))
    def match_hashes(self, data, e):
        pool = self.seen[e] or [1]
        hashes = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        assert self.fleet.match_engine_hashes(e, hashes) == self.model.match_hashes(e, hashes)

    @invariant()
    def same_figures(self):
        if not hasattr(self, "fleet"):
            return
        s = self.fleet.stats()
        assert {k: s[k] for k in self.model.stats()} == self.model.stats()
        for e in ENGINES:
            assert self.fleet.engine_stats(e)["cached_blocks"] == len(self.model.tables[e])
        assert self.fleet.check() == []


TestFleetStateful = FleetMachine.TestCase
TestFleetStateful.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
