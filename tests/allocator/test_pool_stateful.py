"""Stateful property tests of every pool strategy against a small reference model.

Each machine drives random allocate / extend / free / write / defragment / reset sequences and,
after every step, checks `pool.check() == []`, the stats against the model, and that every
byte written into every live allocation reads back identical (the data-integrity property).

The reference model is deliberately naive: a Python list with one owner per unit for the
contiguous arena (fits computed by scanning it), free-block counts for paged and per tier.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.kvtest_util import crc, free_runs_of, histogram, payload, pool_snapshot

from allocator import NotFound, OutOfMemory, create_pool
from allocator.pools.pool import runs_of

BLOCK = 16
UNITS = 64
PENDING = -2  # model id of an allocation whose real id is not known yet
SETTINGS = settings(
    max_examples=int(os.environ.get("KVSCOPE_TEST_EXAMPLES", "100")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)



def tier_extents(pool, owner: list[int]) -> list[int]:
    """Free extents of a tiered pool as a request sees them (in units): every free block of a
    smaller tier alone (one-block requests only), all free blocks of the largest tier together."""
    tiers = pool.config()["tiers"]
    runs: list[int] = []
    for i, t in enumerate(tiers):
        free = [b for b in range(t["blocks"]) if owner[t["start"] + b * t["units"]] == -1]
        if i < len(tiers) - 1:
            runs += [t["units"]] * len(free)
        elif free:
            runs.append(len(free) * t["units"])
    return runs

class ArenaModel:
    """Contiguous arena: one owner per unit; fits found by scanning the free runs."""

    def __init__(self, units: int, fit: str) -> None:
        self.owner = [-1] * units
        self.fit = fit
        self.rover = 0
        self.ext: dict[int, list[int]] = {}  # aid -> [start, units]

    def runs(self) -> list[tuple[int, int]]:
        out, start = [], None
        for i, o in enumerate(self.owner + [0]):
            if o == -1 and start is None:
                start = i
            elif o != -1 and start is not None:
                out.append((start, i - start))
                start = None
        return out

    def free_units(self) -> int:
        return self.owner.count(-1)

    def find(self, units: int) -> int | None:
        runs = self.runs()
        if self.fit == "next":
            i = next((k for k, (s, _) in enumerate(runs) if s >= self.rover), len(runs))
            runs = runs[i:] + runs[:i]
        fits = [(s, n) for s, n in runs if n >= units]
        if not fits:
            return None
        if self.fit == "best":
            return min(fits, key=lambda r: r[1])[0]
        if self.fit == "worst":
            return max(fits, key=lambda r: r[1])[0]
        return fits[0][0]

    def place(self, aid: int, start: int, units: int) -> None:
        self.owner[start : start + units] = [aid] * units
        self.ext[aid] = [start, units]

    def allocate(self, aid: int, units: int) -> str | None:
        start = self.find(units)
        if start is None:
            return "fragmentation" if self.free_units() >= units else "capacity"
        self.place(aid, start, units)
        self.rover = start + units
        return None

    def extend(self, aid: int, new_units: int) -> tuple[str | None, bool]:
        start, units = self.ext[aid]
        extra = new_units - units
        if extra <= 0:
            return None, False
        end = start + units
        following = dict(self.runs()).get(end, 0)
        if following >= extra:
            self.place(aid, start, new_units)
            return None, False
        dest = self.find(new_units)
        if dest is None:  # the old extent widened by its free neighbours
            before = [s for s, n in self.runs() if s + n == start]
            lo = before[0] if before else start
            if end + following - lo >= new_units:
                dest = lo
        if dest is None:
            return ("fragmentation" if self.free_units() >= extra else "capacity"), False
        self.owner[start:end] = [-1] * units
        self.place(aid, dest, new_units)
        return None, True

    def rename(self, old: int, new: int) -> None:
        start, units = self.ext.pop(old)
        self.place(new, start, units)

    def free(self, aid: int) -> None:
        start, units = self.ext.pop(aid)
        self.owner[start : start + units] = [-1] * units

    def compact(self) -> None:
        """Pack extents in address order; next fit starts over from the bottom."""
        cursor = 0
        self.rover = 0
        self.owner = [-1] * len(self.owner)
        for aid, (_start, units) in sorted(self.ext.items(), key=lambda kv: kv[1][0]):
            self.place(aid, cursor, units)
            cursor += units


class PoolMachine(RuleBasedStateMachine):
    strategy = "paged"
    fit = "first"

    @initialize()
    def setup(self) -> None:
        self.pool = create_pool(self.strategy, num_blocks=UNITS, block_bytes=BLOCK, fit=self.fit,
                                device="cpu", event_capacity=64)
        # aid -> [requested_bytes, bytes written, held units, tier index]
        self.live: dict[int, list] = {}
        self.dead: list[int] = []
        self.seed = 0
        if self.strategy == "contiguous":
            self.arena = ArenaModel(UNITS, self.fit)
        if self.strategy == "tiered":
            self.tiers = [[t.units, t.count] for t in self.pool.tiers]  # [units, free blocks]
        self.paged_free = UNITS

    # -- model helpers ----------------------------------------------------------------------
    def used_units(self) -> int:
        return sum(r[2] for r in self.live.values())

    def pick(self, i: int) -> int:
        ids = sorted(self.live)
        return ids[i % len(ids)]

    def fill(self, aid: int, nbytes: int) -> None:
        self.seed += 1
        data = payload(nbytes, self.seed)
        self.pool.write(aid, data)
        self.live[aid][1] = data

    def expect_events(self, seq_before: int, kind: str) -> None:
        events = self.pool.events.after(seq_before)
        assert [e["seq"] for e in events] == [seq_before + 1], events
        assert events[0]["type"] == kind

    # -- predicted outcomes ---------------------------------------------------------------
    def predict_allocate(self, aid: int, nbytes: int) -> tuple[str | None, int, int | None]:
        """(oom cause or None, held units, tier index); updates the model on success."""
        if self.strategy == "paged":
            n = ceil_div(nbytes, BLOCK)
            if n > self.paged_free:
                return "capacity", 0, None
            self.paged_free -= n
            return None, n, None
        if self.strategy == "contiguous":
            units = ceil_div(nbytes, BLOCK)
            return self.arena.allocate(aid, units), units, None
        first = next((i for i, (u, _) in enumerate(self.tiers) if u * BLOCK >= nbytes), len(self.tiers) - 1)
        for i in range(first, len(self.tiers)):
            units, free = self.tiers[i]
            n = ceil_div(nbytes, units * BLOCK)
            if n <= free:
                self.tiers[i][1] -= n
                return None, n * units, i
        free_bytes = (UNITS - self.used_units()) * BLOCK
        return ("fragmentation" if free_bytes >= nbytes else "capacity"), 0, None

    def predict_extend(self, aid: int, nbytes: int) -> tuple[str | None, int, bool]:
        """(oom cause or None, new held units, moved)."""
        requested, _, held, tier = self.live[aid]
        if self.strategy == "paged":
            need = ceil_div(requested + nbytes, BLOCK) - held
            if need > self.paged_free:
                return "capacity", held, False
            self.paged_free -= need
            return None, held + need, False
        if self.strategy == "contiguous":
            new_units = max(held, ceil_div(requested + nbytes, BLOCK))
            cause, moved = self.arena.extend(aid, new_units)
            return cause, (held if cause else new_units), moved
        units, free = self.tiers[tier]
        need = ceil_div(requested + nbytes, units * BLOCK) - held // units
        if need > free:
            free_bytes = (UNITS - self.used_units()) * BLOCK
            return ("fragmentation" if free_bytes >= need * units * BLOCK else "capacity"), held, False
        self.tiers[tier][1] -= need
        return None, held + need * units, False

    def release(self, aid: int) -> None:
        _, _, held, tier = self.live.pop(aid)
        self.dead.append(aid)
        if self.strategy == "paged":
            self.paged_free += held
        elif self.strategy == "contiguous":
            self.arena.free(aid)
        else:
            self.tiers[tier][1] += held // self.tiers[tier][0]

    # -- rules ---------------------------------------------------------------------------
    @rule(nbytes=st.integers(1, 20 * BLOCK))
    def allocate(self, nbytes: int) -> None:
        seq = self.pool.events.last_seq
        cause, held, tier = self.predict_allocate(PENDING, nbytes)
        if cause is not None:
            before = pool_snapshot(self.pool)
            ooms = self.pool.stats()["ooms"][cause]
            with pytest.raises(OutOfMemory) as err:
                self.pool.allocate(nbytes)
            assert err.value.cause == cause
            assert err.value.requested == nbytes
            assert self.pool.stats()["ooms"][cause] == ooms + 1
            assert pool_snapshot(self.pool) == before, "a refused allocation changed the pool"
            self.expect_events(seq, "oom")
            return
        aid = self.pool.allocate(nbytes)
        assert aid not in self.live and aid not in self.dead, "allocation ids are never reused"
        if self.strategy == "contiguous":
            self.arena.rename(PENDING, aid)
        self.live[aid] = [nbytes, b"", held, tier]
        alloc = self.pool.allocation(aid)
        assert alloc.requested_bytes == nbytes
        assert alloc.allocated_bytes == held * BLOCK
        if self.strategy == "contiguous":
            assert alloc.blocks == [self.arena.ext[aid]]
        if self.strategy == "tiered":
            assert alloc.tier == self.pool.tiers[tier].name
        self.expect_events(seq, "allocate")
        self.fill(aid, nbytes)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000), nbytes=st.integers(1, 12 * BLOCK))
    def extend(self, i: int, nbytes: int) -> None:
        aid = self.pick(i)
        seq = self.pool.events.last_seq
        cause, held, moved = self.predict_extend(aid, nbytes)
        if cause is not None:
            before = pool_snapshot(self.pool)
            with pytest.raises(OutOfMemory) as err:
                self.pool.extend(aid, nbytes)
            assert err.value.cause == cause
            assert pool_snapshot(self.pool) == before, "a refused extend changed the pool"
            self.expect_events(seq, "oom")
            return
        old = self.live[aid][1]
        assert self.pool.extend(aid, nbytes) is moved
        self.live[aid][0] += nbytes
        self.live[aid][2] = held
        assert self.pool.allocation(aid).allocated_bytes == held * BLOCK
        if self.strategy == "contiguous":
            assert self.pool.allocation(aid).blocks == [self.arena.ext[aid]]
        self.expect_events(seq, "extend")
        assert self.pool.read(aid, len(old)) == old, "extend lost the allocation's bytes"
        self.fill(aid, self.live[aid][0])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000))
    def free(self, i: int) -> None:
        aid = self.pick(i)
        seq = self.pool.events.last_seq
        self.pool.free(aid)
        self.release(aid)
        self.expect_events(seq, "free")

    @precondition(lambda self: self.dead)
    @rule(i=st.integers(0, 1000), nbytes=st.integers(1, BLOCK))
    def unknown_id_is_not_found(self, i: int, nbytes: int) -> None:
        aid = self.dead[i % len(self.dead)]
        before = pool_snapshot(self.pool)
        seq = self.pool.events.last_seq
        for call in (lambda: self.pool.free(aid), lambda: self.pool.extend(aid, nbytes),
                     lambda: self.pool.read(aid), lambda: self.pool.allocation(aid)):
            with pytest.raises(NotFound):
                call()
        assert pool_snapshot(self.pool) == before
        assert self.pool.events.last_seq == seq

    @rule()
    def defragment(self) -> None:
        before_blocks = {aid: self.pool.block_ids(aid) for aid in self.live}
        before_stats = self.pool.stats()
        report = self.pool.defragment()
        after_stats = self.pool.stats()
        moved = sum(
            sum(a != b for a, b in zip(before_blocks[aid], self.pool.block_ids(aid)))
            for aid in self.live
        )
        assert report.moved_blocks == moved
        assert report.moved_bytes == moved * BLOCK
        for key in ("external_fragmentation", "largest_free_bytes", "free_extent_count"):
            assert report.before[key] == before_stats[key]
            assert report.after[key] == after_stats[key]
        if self.strategy == "contiguous":
            self.arena.compact()
        if self.strategy in ("paged", "contiguous"):
            # Compaction leaves one free run at the top and none below it.
            used = self.used_units()
            owners = list(self.pool.blockmap.owner)
            assert all(o != -1 for o in owners[:used]) and all(o == -1 for o in owners[used:])
            assert after_stats["external_fragmentation"] == 0.0

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000))
    def rewrite(self, i: int) -> None:
        aid = self.pick(i)
        self.fill(aid, self.live[aid][0])

    @rule()
    def reset(self) -> None:
        if len(self.live) < 6:  # rare: let state build up first
            return
        assert self.pool.reset() == len(self.live)
        for aid in list(self.live):
            self.release(aid)
        if self.strategy == "contiguous":
            self.arena.rover = 0

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        pool = self.pool
        assert pool.check() == []
        used = self.used_units()
        requested = sum(r[0] for r in self.live.values())
        s = pool.stats()
        assert s["used_blocks"] == used
        assert s["free_blocks"] == UNITS - used
        assert s["allocation_count"] == len(self.live)
        assert s["requested_bytes"] == requested
        assert s["allocated_bytes"] == used * BLOCK
        assert s["utilization"] == used / UNITS
        assert s["internal_fragmentation"] == (1 - requested / (used * BLOCK) if used else 0.0)
        owner = self.arena.owner if self.strategy == "contiguous" else list(pool.blockmap.owner)
        runs = tier_extents(pool, owner) if self.strategy == "tiered" else free_runs_of(owner)
        if self.strategy == "contiguous":
            assert list(pool.blockmap.owner) == owner
        assert s["largest_free_bytes"] == max(runs, default=0) * BLOCK
        assert s["external_fragmentation"] == (1 - max(runs) / sum(runs) if runs else 0.0)
        assert s["free_extents"] == histogram(runs)
        assert sum(runs) == UNITS - used
        for aid, (_, data, _, _) in self.live.items():
            got = pool.read(aid, len(data))
            assert crc(got) == crc(data), f"allocation {aid} lost its bytes"
            # the runs REST and batch results show: those of the block ids, in data order
            assert pool.block_runs(aid) == pool.allocation(aid).blocks == runs_of(pool.block_ids(aid)), aid


def machine(strategy: str, fit: str = "first"):
    cls = type(f"{strategy.title()}{fit.title()}Machine", (PoolMachine,),
               {"strategy": strategy, "fit": fit})
    cls.TestCase.settings = SETTINGS
    return cls.TestCase


TestPaged = machine("paged")
TestTiered = machine("tiered")
TestContiguousFirst = machine("contiguous", "first")
TestContiguousBest = machine("contiguous", "best")
TestContiguousWorst = machine("contiguous", "worst")
TestContiguousNext = machine("contiguous", "next")
