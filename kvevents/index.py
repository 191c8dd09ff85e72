"""FleetIndex: one prefix index across many engines, with duplication and missed-reuse figures.

The compiled `kvevents._index.FleetCore` keeps the blocks keyed by their tokens and each
engine's table from its own hashes to those keys; this class adds engine names, DP ranks, the
configured block sizes, the fleet figures and `check()`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from allocator.errors import Conflict, InvalidRequest, NotFound

from . import tiers as tiermap
from ._index import (
    COUNTERS,
    DEFAULT_ENGINE_BLOCKS,
    GROUP_DIVISOR,
    MAX_FLEET_ENGINES,
    MIN_GROUP,
    FleetCore,
    Layout,
    continue_runs,
    engine_color_lists,
    layout_of,
    match_tiers,
    snapshot_buffers,
    snapshot_fits,
)

__all__ = ["COUNTERS", "DEFAULT_ENGINE_BLOCKS", "GROUP_DIVISOR", "MAX_FLEET_ENGINES", "MIN_GROUP",
           "EngineInfo", "FleetIndex", "Layout", "engine_color_lists", "layout_of", "snapshot_buffers", "snapshot_fits"]


@dataclass(slots=True)
class EngineInfo:
    """An engine of the fleet: `server` groups the DP ranks of one server (its own name when it
    has one rank); `block_size` is what it was configured with (None: take it from its events)."""

    name: str
    eid: int
    server: str
    dp_rank: int = 0
    block_size: int | None = None


class FleetIndex(FleetCore):
    """Engines by name over the compiled index (see `kvevents/_index.pyx` for the keys and the
    invariants). At most `MAX_FLEET_ENGINES` engines (1,024), numbered from 0 in the order they
    are added (the lowest free id first), so the DP ranks of a server added together share a
    page of 64 engines.

    `apply(name_or_id, events)` takes a batch of normalised events; `match(tokens)` and
    `match_hashes(engine, hashes)` answer as Dynamo's `find_matches` does: per engine, the
    number of leading blocks of the chain it holds.

    Tiers (kvevents/tiers.py): this index is the GPU's. An event of another medium goes to its
    tier's own compiled index in `tiers` (made when a first event names it, with the same
    engines), so an engine holds a block on the GPU and on the CPU at once exactly while its
    events say so; a GPU-only fleet never makes one. The tiers share keys: a block's key is
    its content's whichever tier holds it, and a hash a tier does not know is resolved on the
    others (a parent held on the GPU, an offloaded block announced without its tokens).
    """

    def __init__(self, capacity: int = 1024, max_engines: int = MAX_FLEET_ENGINES) -> None:
        if not 1 <= max_engines <= MAX_FLEET_ENGINES:
            raise InvalidRequest(f"max_engines must be 1..{MAX_FLEET_ENGINES}")
        self.max_engines = max_engines
        self.engines: dict[str, EngineInfo] = {}
        self._by_id: dict[int, EngineInfo] = {}
        self._free_ids: list[int] = []  # ids given back below _next_id (a heap: lowest first)
        self._next_id = 0
        self._names: list[str | None] = [None] * MAX_FLEET_ENGINES  # by engine id
        self._groups: dict[int, int | None] | None = None  # `_block_size_groups`, kept
        self._groups_pending: list[int] = []  # engines whose events have not given a size yet
        self.tiers: dict[str, FleetCore] = {}  # tier -> its index, the GPU's (self) not among them

    # -- tiers ----------------------------------------------------------------------------------
    def tier_index(self, medium) -> FleetCore | None:
        """The index of `medium`'s tier, made on its first event (None: not a tier)."""
        tier = tiermap.tier_of(medium)
        if tier is None:
            return None
        if tier == tiermap.PRIMARY:
            return self
        core = self.tiers.get(tier)
        if core is None:
            core = FleetCore(16)
            core.tier_id = tiermap.TIERS.index(tier)
            for eid in self._by_id:
                core.add_engine(eid)
            self.tiers = {t: c for t in tiermap.TIERS for c in [self.tiers.get(t, core if t == tier else None)] if c}
            self.peers = tuple(self.tiers.values())
        return core

    def tier_cores(self) -> list[tuple[str, FleetCore]]:
        """(tier, its index) for every tier the fleet has, the GPU's first."""
        return [(tiermap.PRIMARY, self), *self.tiers.items()]

    def version(self) -> int:
        return FleetCore.version(self) + sum(c.version() for c in self.tiers.values())

    # -- engines --------------------------------------------------------------------------------
    def add(self, name: str, *, server: str | None = None, dp_rank: int = 0,
            block_size: int | None = None, max_blocks: int | None = None) -> EngineInfo:
        """Register an engine; `max_blocks`: its KV block count, the most it can hold (default
        DEFAULT_ENGINE_BLOCKS). Raises Conflict (name taken, or the fleet is full)."""
        if name in self.engines:
            raise Conflict(f"engine {name!r} is already in the fleet")
        if len(self.engines) >= self.max_engines:
            raise Conflict(f"the fleet has {len(self.engines)} engines, the most it takes "
                           f"({self.max_engines}); remove one first")
        if self._free_ids:
            eid = heapq.heappop(self._free_ids)
        else:
            eid, self._next_id = self._next_id, self._next_id + 1
        self.add_engine(eid)
        try:
            if max_blocks is not None:
                self.set_max_blocks(eid, max_blocks)
        except BaseException:
            self.drop_engine(eid)
            heapq.heappush(self._free_ids, eid)
            raise
        for core in self.tiers.values():
            core.add_engine(eid)
        info = EngineInfo(name, eid, server or name, dp_rank, block_size)
        self.engines[name] = info
        self._by_id[eid] = info
        self._names[eid] = name
        self._groups = None
        return info

    def release(self) -> None:
        """Forget every engine and free the index's memory now."""
        super().release()
        for core in self.tiers.values():
            core.release()
        self.tiers = {}
        self.peers = ()
        self.media = {}
        self.engines.clear()
        self._by_id.clear()
        self._free_ids.clear()
        self._next_id = 0
        self._names = [None] * MAX_FLEET_ENGINES
        self._groups = None

    def discard(self, name: str) -> None:
        """Forget an engine and what it held. Raises NotFound."""
        info = self.engine(name)
        self.drop_engine(info.eid)
        for core in self.tiers.values():
            core.drop_engine(info.eid)
        del self.engines[name], self._by_id[info.eid]
        self._names[info.eid] = None
        self._groups = None
        heapq.heappush(self._free_ids, info.eid)

    def clear_all(self, eid: int) -> int:
        """Engine `eid` holds nothing any more, on any tier (it restarted). Returns the blocks
        it dropped."""
        return self.clear(eid) + sum(core.clear(eid) for core in self.tiers.values())

    def engine(self, name: str) -> EngineInfo:
        info = self.engines.get(name)
        if info is None:
            raise NotFound("engine", name)
        return info

    def name_of(self, eid: int) -> str:
        return self._by_id[eid].name

    def _named(self, scores: dict[int, int], out: dict[str, int]) -> dict[str, int]:
        names = self._names
        for eid, n in scores.items():
            out[names[eid]] = n
        return out

    # -- matching -------------------------------------------------------------------------------
    def match(self, tokens: list[int], lora_id: int | None = None) -> dict[str, int]:
        """Each engine's longest cached prefix of `tokens`, in blocks (0 when none). Engines of
        one block size are matched on that size's blocks."""
        out = dict.fromkeys(self.engines, 0)
        for bs, mask in self._block_size_groups().items():
            self._named(self.match_tokens(list(tokens), bs, lora_id, mask), out)
        return out

    def match_engine_hashes(self, engine: str, hashes: list[int]) -> dict[str, int]:
        """The same for a chain named by `engine`'s own block hashes."""
        out = dict.fromkeys(self.engines, 0)
        return self._named(self.match_hashes(self.engine(engine).eid, list(hashes)), out)

    def match_chain(self, key: int) -> dict[str, int]:
        """The same for the chain from the root down to an indexed block `key` (a recent
        store's last block, say); 0 everywhere when no engine holds its first blocks any more
        (the chain no longer reaches the root, so nothing can reuse it)."""
        out = dict.fromkeys(self.engines, 0)
        chain = self.chain_of(key)
        if not chain or self.parent_of(chain[0]) != 0:
            return out
        return self._named(self.match_keys(chain), out)

    def block_size(self, name: str) -> int | None:
        """Tokens per block of an engine: from its events, else as configured."""
        info = self.engine(name)
        return self.block_size_of(info.eid) or info.block_size

    def _block_size_groups(self) -> dict[int, int | None]:
        """{block size: the engines of that size, as a mask (None: every engine)}. Kept until an
        engine is added or removed, or one whose events had not given its size yet gives it (an
        engine's size never changes after its first store)."""
        pending = self._groups_pending
        if self._groups is not None and not any(self.block_size_of(e) for e in pending):
            return self._groups
        groups: dict[int, int] = {}
        pending.clear()
        for info in self.engines.values():
            seen = self.block_size_of(info.eid)
            if not seen:
                pending.append(info.eid)
            bs = seen or info.block_size
            if bs:
                groups[bs] = groups.get(bs, 0) | (1 << info.eid)
        active = self.active
        self._groups = {bs: None if m == active else m for bs, m in groups.items()}
        return self._groups

    # -- figures --------------------------------------------------------------------------------
    def stats(self) -> dict:
        """The fleet's figures. `cross_engine_recomputes`: blocks an engine stored while another
        engine already held the same block (reuse the fleet had and did not capture);
        `recompute_tokens` their tokens."""
        tot = self.counter_totals()
        return {
            "engines": len(self.engines),
            "unique_blocks": self.unique,
            "duplicated_blocks": self.duplicated,
            "duplicate_copies": self.holdings - self.unique,
            "cross_engine_recomputes": tot["cross_engine_recomputes"],
            "recompute_tokens": tot["recompute_tokens"],
            "fallback_blocks": tot["fallback_blocks"],
            "tiers": {t: {"unique_blocks": c.unique, "blocks": c.holdings} for t, c in self.tier_cores()},
        }

    def engine_stats(self, name: str) -> dict:
        info = self.engine(name)
        out = self.counters_of(info.eid)
        out["cached_blocks"] = self.held_of(info.eid)
        out["block_size"] = self.block_size_of(info.eid)
        seen, want = out["block_size"], info.block_size
        other = self.block_size_refused_of(info.eid)
        if seen and want and seen != want:
            out["block_size_error"] = (f"events say {seen} tokens per block, the engine was "
                                       f"configured with {want}")
        elif other:
            out["block_size_error"] = (
                f"{out['block_size_changes']} blocks came at {other} tokens per block after "
                f"{seen}: not indexed (an engine's block size cannot change mid-stream; "
                f"restart it, or re-add it with the new size)")
        else:
            out["block_size_error"] = None
        out["max_blocks"] = self.max_blocks_of(info.eid)
        out["capacity_error"] = (
            f"{out['over_capacity_blocks']} blocks stored past the engine's {out['max_blocks']} "
            f"blocks were not indexed (its events store more than it can hold: a wrong "
            f"num_blocks, or missed removes)" if out["over_capacity_blocks"] else None)
        out["keyed_by"] = ("engine hashes" if out["fallback_blocks"] and not
                           out["stored_blocks"] - out["fallback_blocks"] else "tokens")
        out["tiers"] = {t: c.held_of(info.eid) for t, c in self.tier_cores()}
        if self.tiers:
            tc = out["tier_counters"] = {t: {k: v for k, v in c.counters_of(info.eid).items() if v}
                                         for t, c in self.tiers.items()}
            out["malformed_events"] += sum(c.get("malformed_events", 0) for c in tc.values())
        return out

    # -- matching across tiers --------------------------------------------------------------------
    def match_weighted(self, keys: list[int], weights: dict[str, float], among=None) -> dict[int, float]:
        """llm-d's LongestPrefixScorer on a chain of keys: {engine id: score} for every engine
        (of `among`, a bit mask) holding the chain's first block on some tier, its longest run
        from block 0 held on any tier, each block weighing its best tier's weight (`weights`,
        a tier not named weighs 1.0)."""
        cores = sorted(self.tier_cores(), key=lambda tc: -weights.get(tc[0], 1.0))
        if len(cores) == 1:
            w = weights.get(cores[0][0], 1.0)
            return {e: n * w for e, n in self.match_keys(keys, among).items()}
        return match_tiers([c for _, c in cores], keys, among, [weights.get(t, 1.0) for t, _ in cores])

    def match_lower_tiers(self, keys: list[int], device: dict[int, int], among=None) -> dict[str, dict[int, int]]:
        """Dynamo's walk down the tiers after the device match (`device`: {engine id: blocks},
        engines with none left out): per tier below the GPU that the fleet has, in the order
        cpu, disk, external, {engine id: blocks} each engine holds there consecutively from
        where the tiers above left it (an engine that matched nothing above starts at block 0
        where it holds the first block). Engines outside `among` are left out."""
        pos = dict(device)
        out: dict[str, dict[int, int]] = {}
        for tier, core in self.tiers.items():
            hits = continue_runs(core, keys, pos)
            if among is not None:
                hits = {e: n for e, n in hits.items() if among >> e & 1}
            for e, n in hits.items():
                pos[e] = pos.get(e, 0) + n
            out[tier] = hits
        return out

    # -- invariants -----------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Every invariant of the index, of each tier's; each problem names the engine or key
        that breaks it (and the tier, below the GPU's)."""
        problems = self._check_core(self)
        for tier, core in self.tiers.items():
            problems += [f"tier {tier}: {p}" for p in self._check_core(core)]
            if core.active != self.active:
                problems.append(f"tier {tier} has engines {core.active:#x}, the fleet {self.active:#x}")
        return problems

    def _check_core(self, core: FleetCore) -> list[str]:
        problems: list[str] = []
        keys, _parents, masks = core.nodes()
        if keys.size != core.unique:
            problems.append(f"{keys.size} live nodes, unique says {core.unique}")
        if core.table_size() != core.unique:
            problems.append(f"key table holds {core.table_size()} keys, unique says {core.unique}")
        if np.unique(keys).size != keys.size:
            problems.append("a key is on two nodes")
        counts = np.array([m.bit_count() for m in masks], dtype=np.int64)
        if int((counts >= 2).sum()) != core.duplicated:
            problems.append(f"duplicated says {core.duplicated}, masks say {int((counts >= 2).sum())}")
        if int(counts.sum()) != core.holdings:
            problems.append(f"holdings says {core.holdings}, masks say {int(counts.sum())}")
        mask_of = dict(zip(keys.tolist(), masks))
        for name, info in self.engines.items():
            bit = 1 << info.eid
            table = core.engine_table(info.eid)
            if len(table) != core.held_of(info.eid):
                problems.append(f"engine {name}: {len(table)} hashes, held says {core.held_of(info.eid)}")
            held = set(table.values())
            for k in held:
                if not mask_of.get(k, 0) & bit:
                    problems.append(f"engine {name} maps a hash to key {k:016x} without its bit")
                    break
            marked = {k for k, m in mask_of.items() if m & bit}
            if marked - held:
                k = next(iter(marked - held))
                problems.append(f"key {k:016x} has engine {name}'s bit, no hash of it maps there")
            for (eid, h) in core.extra:
                if eid == info.eid and h not in table:
                    problems.append(f"engine {name}: extra copies of hash {h:016x} it does not hold")
        active = core.active
        for m in masks:
            if m & ~active:
                problems.append(f"a node is held by engine bits {m & ~active:#x} not in the fleet")
                break
        for k, m in mask_of.items():
            chunk = core.chunk_of(k)
            pages = sorted({e >> 6 for e in range(m.bit_length()) if m >> e & 1})
            if chunk is None:
                if len(pages) > 1:
                    problems.append(f"key {k:016x} is held across pages {pages} without a chunk")
                    break
                continue
            got, bits, cap = chunk
            if len(got) < 2 or got != pages or not all(bits) or not len(got) <= cap <= 16:
                problems.append(f"key {k:016x}: chunk pages {got} (capacity {cap}), its engines "
                                f"are on pages {pages}")
                break
        return problems
