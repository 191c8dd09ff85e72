"""The fleet index against NVIDIA Dynamo's own index (`dynamo._core.RadixTree`, from the
ai-dynamo-runtime wheel), fed the same random multi-engine event streams.

Dynamo assumes every worker names a block with the same hash; kvscope's engines do not (each
hashes with its own seed, as vLLM processes do) and send token ids instead. So Dynamo gets
uniform hashes and per-block token hashes, kvscope gets per-engine hashes and token ids, and
after every step both must give every engine (and DP rank) the same score for random prompts.

The streams keep to what both define alike: an engine stores under a parent it holds, never
re-stores a block it holds (Dynamo keeps a set, kvscope counts copies), and evicts a block with
the descendants it holds (Dynamo drops those itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest
from fleet_model import add_at

from kvevents.codec import Cleared, Removed, Stored
from kvevents.index import MAX_FLEET_ENGINES, FleetIndex

try:
    from dynamo._core import RadixTree
except ImportError as exc:  # a third-party wheel: CI installs it with the test extra
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"ai-dynamo-runtime is not installed ({exc}): pip install -e '.[test]'",
                allow_module_level=True)

BS = 4
# (worker id, dp rank): worker 2 is a server with two DP ranks, worker 3 one with four.
RANKS = [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (3, 3)]


def h64(*parts) -> int:
    d = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(d, "big") >> 1  # Dynamo's JSON hashes are signed 64-bit


def prompts(rng: random.Random) -> list[list[int]]:
    systems = [[rng.randrange(50) for _ in range(BS * n)] for n in (2, 3)]
    out = []
    for _ in range(6):
        base = list(rng.choice(systems))
        base += [rng.randrange(50) for _ in range(BS * rng.randrange(1, 5))]
        out.append(base)
    return out


class Stream:
    """The engines' state on the generator's side: the token-block chains each rank holds."""

    def __init__(self, rng: random.Random, ranks=RANKS) -> None:
        self.rng = rng
        self.ranks = ranks
        self.prompts = prompts(rng)
        self.held: dict[tuple, set[tuple]] = {r: set() for r in ranks}  # chain prefixes held

    @staticmethod
    def blocks(chain: tuple) -> tuple:
        return tuple(chain[i:i + BS] for i in range(0, len(chain), BS))

    def engine_hash(self, rank, chain: tuple) -> int:
        return h64("engine", rank, chain)  # per-rank seed: no two engines agree

    def step(self):
        """One ([rank], kind, chains) step: a store of a chain's missing blocks, an eviction of a
        block with its held descendants, or a clear (of that rank alone, as vLLM's DP ranks
        each clear their own cache and Dynamo's index clears only the rank it names)."""
        rng = self.rng
        rank = rng.choice(self.ranks)
        held = self.held[rank]
        roll = rng.random()
        if roll < 0.03:
            held.clear()
            return [rank], "cleared", []
        if roll < 0.35 and held:
            victim = rng.choice(sorted(held))
            gone = sorted((c for c in held if c[:len(victim)] == victim), key=len, reverse=rng.random() < 0.5)
            held.difference_update(gone)
            return [rank], "removed", gone
        p = rng.choice(self.prompts)
        n = rng.randrange(1, len(p) // BS + 1)
        chains = [tuple(p[:(i + 1) * BS]) for i in range(n)]
        first = next((i for i, c in enumerate(chains) if c not in held), None)
        if first is None:
            return [rank], "stored", []
        # store from the first missing block on (later held ones are stored again by vLLM only
        # after eviction; keep the run to blocks this rank lacks)
        run = []
        for c in chains[first:]:
            if c in held:
                break
            run.append(c)
        held.update(run)
        return [rank], "stored", run


def dynamo_event(eid: int, kind: str, chains, rank) -> bytes:
    if kind == "cleared":
        data = "cleared"
    elif kind == "removed":
        data = {"removed": {"block_hashes": [h64("uniform", c) for c in chains]}}
    else:
        parent = chains[0][:-BS]
        data = {"stored": {"parent_hash": h64("uniform", parent) if parent else None,
                           "blocks": [{"block_hash": h64("uniform", c),
                                       "tokens_hash": h64("tokens", c[-BS:])} for c in chains]}}
    return json.dumps({"event_id": eid, "data": data, "dp_rank": rank[1]}).encode()


def kvscope_event(stream: Stream, kind: str, chains, rank):
    if kind == "cleared":
        return Cleared()
    if kind == "removed":
        return Removed([stream.engine_hash(rank, c) for c in chains], "GPU")
    parent = chains[0][:-BS]
    return Stored([stream.engine_hash(rank, c) for c in chains],
                  stream.engine_hash(rank, parent) if parent else None,
                  list(chains[-1][len(parent):]), BS, "GPU")


@pytest.mark.parametrize("seed", range(6))
def test_fleet_matches_equal_dynamo_after_every_step(seed):
    """Seed 0 numbers the engines 0..7 (one page of 64); the others place them at random ids
    up to the fleet's limit, each server's ranks together as the fleet adds them, so blocks
    are held across pages."""
    rng = random.Random(seed)
    stream = Stream(rng)
    tree = RadixTree()
    fleet = FleetIndex()
    names = {f"w{w}" if dp == 0 else f"w{w}:dp{dp}": (w, dp) for w, dp in RANKS}
    kw = {n: {"server": f"w{w}", "dp_rank": dp, "block_size": BS} for n, (w, dp) in names.items()}
    if seed == 0:
        ids = list(range(len(RANKS)))
    else:
        ids, at = [], 0
        for w in sorted({w for w, _ in RANKS}):
            at = rng.randrange(at, MAX_FLEET_ENGINES - 8 * (4 - w))
            ids += [at + dp for ww, dp in RANKS if ww == w]
            at = ids[-1] + 1
    add_at(fleet, dict(zip(names, ids)), **kw)
    assert max(ids) >= 64 or seed == 0
    eid = 0
    nonzero_scores = 0
    for _ in range(250):
        ranks, kind, chains = stream.step()
        if kind != "cleared" and not chains:
            continue
        eid += 1
        tree.apply_event(ranks[0][0], dynamo_event(eid, kind, chains, ranks[0]))
        for r in ranks:
            name = next(n for n, v in names.items() if v == r)
            fleet.apply(fleet.engine(name).eid, [kvscope_event(stream, kind, chains, r)])
        for _ in range(3):
            p = rng.choice(stream.prompts)
            q = p[:BS * rng.randrange(0, len(p) // BS + 1)]
            if rng.random() < 0.3:
                q = q + [rng.randrange(50) for _ in range(BS * 2)]
            want = tree.find_matches([h64("tokens", tuple(q[i:i + BS]))
                                      for i in range(0, len(q) - BS + 1, BS)]).scores
            got = {names[n]: s for n, s in fleet.match(q).items() if s}
            assert got == dict(want), (kind, chains, q)
            nonzero_scores += bool(want)
    assert fleet.check() == []
    assert nonzero_scores > 100, "the streams must produce real matches, not empty ones"
    assert fleet.stats()["duplicated_blocks"] > 0 or fleet.stats()["cross_engine_recomputes"] > 0
