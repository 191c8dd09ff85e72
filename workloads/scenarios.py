"""Scenarios: deterministic streams of pool and cache operations, run offline or live.

A scenario is a generator of `Op`s. It receives each op's result through `send()` (an
allocation id, True/False for a cache lookup, or the `OutOfMemory` the op raised), so it can
react ("allocate until the pool is full"). Everything random comes from `numpy.random
.default_rng(seed)`: the same seed on the same pool geometry gives the same ops.

- `fragmentation`: fill the pool with mixed sizes, free every other allocation in shuffled
  order, then ask for one large allocation: less than the free total, more than any hole. A
  contiguous pool fails it with an OOM of cause "fragmentation"; a paged pool serves it.
- `chat`: multi-turn conversations with Zipf-skewed popularity on the pool's KVCache. Each turn
  `get`s the conversation's key (a hit means its KV prefix is still cached) and `put`s it grown by
  the new turn; a conversation that grows too long ends and a new one takes its rank.
- `burst`: waves of arrivals that overfill the pool (some fail with OOMs), each allocation held
  for a random lifetime, with quiet gaps in which the pool drains.

`Op.dt` is the simulated time before the op: it paces a live run (speed 1.0 gives 20-200 ops/s).
An op marked `probe` (fragmentation's large request) is the one the scenario exists for: the
runner records the pool as it stood when it was asked (free bytes, largest free extent,
utilization) and whether it was served. `compare_scenario` runs one seeded scenario on a fresh
pool of each strategy (`kvscope scenario fragmentation`: contiguous next to paged) and
`comparison_text` prints them side by side.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from allocator import InvalidRequest, KVCache, NotFound, OutOfMemory, Pool, PrefixPool, create_pool
from allocator.vocab import SCENARIOS


@dataclass(frozen=True, slots=True)
class Op:
    """One operation. `ref` is a scenario handle (allocate/extend/free) or a cache key."""

    kind: str
    ref: int | str = 0
    nbytes: int = 0
    dt: float = 0.04
    probe: bool = False  # the op the scenario exists for: OpRunner records the pool around it
    tokens: tuple = ()  # token ids of a sequence op (open / append)


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a scenario sizes itself by: a block (the allocation unit), how many are free at the
    start, and the cache's capacity (0 without a cache)."""

    block_bytes: int
    free_blocks: int
    cache_bytes: int = 0
    tokens_per_block: int = 16

    @classmethod
    def of(cls, pool: Pool) -> Geometry:
        cache = pool.cache
        return cls(pool.block_bytes, pool.num_blocks - pool.used_blocks,
                   cache.capacity_bytes if cache is not None else 0, pool.tokens_per_block or 16)


ScenarioGen = Generator[Op, object, None]


def fragmentation(seed: int, geo: Geometry) -> ScenarioGen:
    rng = np.random.default_rng(seed)
    bb, n = geo.block_bytes, max(geo.free_blocks, 8)
    lo, hi = max(1, n // 400), max(2, n // 40)
    held: list[int] = []  # refs in allocation order (= address order on a fresh contiguous pool)
    sizes: dict[int, int] = {}
    ref = 0
    while True:  # 1. fill with mixed sizes until the pool refuses
        blocks = int(rng.integers(lo, hi + 1))
        nbytes = blocks * bb - int(rng.integers(0, bb))
        result = yield Op("allocate", ref, nbytes, dt=0.03)
        if isinstance(result, OutOfMemory) or len(held) >= 2000:
            break
        held.append(ref)
        sizes[ref] = blocks
        ref += 1
    victims = held[0::2]  # 2. free every other one, out of order
    rng.shuffle(victims)
    for r in victims:
        yield Op("free", r, dt=0.02)
        del sizes[r]
    kept = held[1::2]
    yield Op("wait", dt=1.0)
    free_blocks = max(1, n - sum(sizes.values()))
    big = max(1, int(free_blocks * 0.6))  # 3. less than the free total, more than any hole
    result = yield Op("allocate", ref, big * bb, dt=0.5, probe=True)
    if not isinstance(result, OutOfMemory):
        kept.append(ref)
    yield Op("wait", dt=3.0)  # hold the picture
    order = list(kept)  # 4. clean up, out of order
    rng.shuffle(order)
    for r in order:
        yield Op("free", r, dt=0.02)


def chat(seed: int, geo: Geometry, conversations: int = 64, turns: int = 500,
         zipf_s: float = 1.1) -> ScenarioGen:
    if geo.cache_bytes <= 0:
        raise InvalidRequest("the chat scenario needs a pool with a cache")
    rng = np.random.default_rng(seed)
    cap = geo.cache_bytes
    turn_lo, turn_hi = max(1, cap // 400), max(2, cap // 100)
    longest = max(turn_hi, cap // 8)
    weights = 1.0 / np.arange(1, conversations + 1) ** zipf_s
    ranks = rng.choice(conversations, size=turns, p=weights / weights.sum())
    grow = rng.integers(turn_lo, turn_hi + 1, size=turns)
    length = [0] * conversations
    generation = [0] * conversations
    for rank, add in zip(ranks.tolist(), grow.tolist()):
        key = f"chat-{rank}-{generation[rank]}"
        if length[rank] + add > longest:  # the conversation ends; a new one takes the rank
            yield Op("remove", key, dt=0.02)
            generation[rank] += 1
            length[rank] = 0
            key = f"chat-{rank}-{generation[rank]}"
        if length[rank]:
            yield Op("get", key, dt=0.04)  # hit: the prefix is cached; miss: recompute it all
        length[rank] += add
        yield Op("put", key, length[rank], dt=0.02)


def burst(seed: int, geo: Geometry, waves: int = 4) -> ScenarioGen:
    rng = np.random.default_rng(seed)
    bb, n = geo.block_bytes, max(geo.free_blocks, 8)
    arrivals: list[tuple[float, int]] = []
    t = 0.0
    for _ in range(waves):
        count = int(rng.integers(40, 80))
        mean_blocks = max(1.0, 1.3 * n / count)  # each wave asks for about 130% of the pool
        for _ in range(count):
            t += float(rng.exponential(0.015))
            blocks = max(1, int(rng.exponential(mean_blocks)))
            arrivals.append((t, min(blocks, n) * bb))
        t += 4.0 + float(rng.uniform(0, 2))  # a quiet gap: the pool drains
    frees: list[tuple[float, int]] = []
    now = 0.0
    for ref, (at, nbytes) in enumerate(arrivals):
        while frees and frees[0][0] <= at:
            when, r = heapq.heappop(frees)
            yield Op("free", r, dt=when - now)
            now = when
        result = yield Op("allocate", ref, nbytes, dt=at - now)
        now = at
        if not isinstance(result, OutOfMemory):
            heapq.heappush(frees, (at + float(rng.uniform(0.5, 3.0)), ref))
    while frees:
        when, r = heapq.heappop(frees)
        yield Op("free", r, dt=when - now)
        now = when


# -- prefix-chat --------------------------------------------------------------------------------
# The `prefix-chat` scenario: multi-turn conversations whose prompts share prefixes.
#
# Every turn's prompt is the previous prompt plus the model's reply plus a new user message, and
# every conversation starts with one of a few system prompts, so on a prefix-caching pool each turn
# reuses its conversation's cached blocks (and the system prompt is shared by every conversation
# that uses it): sharing, hits and eviction are all visible live. Each turn opens the prompt as a
# sequence, appends the reply token by token-chunk (decode), and closes it; a conversation that
# outgrows its budget ends and a new one takes its place. Popularity is Zipf-skewed.
#
# On a pool without prefix caching the same ops run as plain allocations (open = allocate the
# prompt, append = extend, close = free): every prompt is computed again, the baseline that the
# compare view puts beside it.

SYSTEM_PROMPTS = 3
BATCH = 6  # turns in flight together
VOCAB = 32_000


def prefix_chat(seed: int, geo: Geometry, conversations: int | None = None, turns: int = 400,
                zipf_s: float = 1.1) -> ScenarioGen:
    rng = np.random.default_rng(seed)
    tpb = geo.tokens_per_block
    n = max(geo.free_blocks, 16)
    if conversations is None:
        conversations = max(4, min(48, n // 24))
    # Budget per conversation: long enough to share many blocks, short enough that the live
    # conversations overfill the pool and the cache has to evict.
    longest = max(4 * tpb, (n * tpb) // max(4, conversations // 2))
    systems = [rng.integers(0, VOCAB, size=int(rng.integers(2, 5)) * tpb).tolist()
               for _ in range(SYSTEM_PROMPTS)]
    weights = 1.0 / np.arange(1, conversations + 1) ** zipf_s
    ranks = rng.choice(conversations, size=turns, p=weights / weights.sum()).tolist()
    history: list[list[int] | None] = [None] * conversations
    handle = 0
    step = max(1, tpb // 2)
    for start in range(0, turns, BATCH):
        # A batch of turns in flight at once, as a serving engine schedules them: conversations
        # on the same system prompt hold its blocks together (shared), then decode, then finish.
        batch = []
        for rank in ranks[start:start + BATCH]:
            message = rng.integers(0, VOCAB, size=int(rng.integers(tpb // 2, 2 * tpb) + 1)).tolist()
            reply = rng.integers(0, VOCAB, size=int(rng.integers(tpb, 3 * tpb) + 1)).tolist()
            prompt = history[rank]
            if prompt is None or len(prompt) + len(message) + len(reply) > longest:
                prompt = list(systems[int(rng.integers(SYSTEM_PROMPTS))])  # a new conversation
            prompt = prompt + message
            handle += 1
            result = yield Op("open", handle, dt=0.03, tokens=tuple(prompt))
            history[rank] = None  # unless this turn completes
            if not isinstance(result, Exception):
                batch.append((rank, handle, prompt, reply))
        for i in range(0, 3 * tpb + 1, step):  # decode: every reply grows by a chunk per step
            for _, h, _, reply in batch:
                if i < len(reply):
                    yield Op("append", h, dt=0.005, tokens=tuple(reply[i:i + step]))
        for rank, h, prompt, reply in batch:
            yield Op("close", h, dt=0.01)
            history[rank] = prompt + reply


FACTORIES = {"fragmentation": fragmentation, "chat": chat, "burst": burst, "prefix-chat": prefix_chat}
assert set(FACTORIES) == set(SCENARIOS), "allocator/vocab.py SCENARIO_INFO and FACTORIES disagree"


def make_scenario(name: str, seed: int, geo: Geometry) -> ScenarioGen:
    """The generator of scenario `name`. Raises InvalidRequest."""
    try:
        factory = FACTORIES[name]
    except (KeyError, TypeError):
        raise InvalidRequest(f"unknown scenario {name!r}; choose one of {list(SCENARIOS)}") from None
    return factory(seed, geo)


def estimate_ops(name: str, geo: Geometry) -> int:
    """A rough op count for progress bars (the real count depends on the pool's answers)."""
    n = max(geo.free_blocks, 8)
    if name == "fragmentation":
        mean = (max(1, n // 400) + max(2, n // 40)) / 2
        return int(2 * n / mean) + 4
    if name == "chat":
        return 1000
    if name == "prefix-chat":
        return 400 * 6
    return 4 * 60 * 2


@dataclass(slots=True)
class OpRunner:
    """Applies ops to a pool (and its cache), maps scenario refs to allocation ids, counts.

    Invariant: `held` maps each live ref to an allocation of this runner, and nothing else.
    """

    pool: Pool
    held: dict = field(default_factory=dict)
    ops: int = 0
    ooms: dict = field(default_factory=lambda: {"capacity": 0, "fragmentation": 0})
    hits: int = 0
    misses: int = 0
    evicted: int = 0
    lost: int = 0
    failures: list = field(default_factory=list)
    peak_utilization: float = 0.0
    peak_external_fragmentation: float = 0.0
    probes: list = field(default_factory=list)
    prefix_queries: int = 0  # prompt tokens opened (sequence ops)
    prefix_hits: int = 0  # of them, served from the prefix cache

    def apply(self, op: Op) -> object:
        """Run `op`; returns the id, hit flag or the OutOfMemory it raised."""
        self.ops += 1
        pool, kind = self.pool, op.kind
        if self.ops % 8 == 0:
            self._peak()
        if op.probe:
            return self._probe(op)
        try:
            if kind == "allocate":
                aid = pool.allocate(op.nbytes)
                self.held[op.ref] = aid
                self._peak()
                return aid
            if kind == "extend":
                return pool.extend(self.held[op.ref], op.nbytes)
            if kind == "free":
                aid = self.held.pop(op.ref, None)
                if aid is not None:
                    pool.free(aid)
                return None
            if kind in ("get", "put", "remove"):
                return self._cache_op(op)
            if kind in ("open", "append", "close"):
                return self._sequence_op(op)
            return None
        except OutOfMemory as exc:
            self.ooms[exc.cause] += 1
            if len(self.failures) < 20:
                self.failures.append({"op": kind, **exc.details(), **self._pool_state()})
            return exc
        except NotFound:  # someone else freed it (a live pool reset): forget it
            self.lost += 1
            self.held.pop(op.ref, None)
            return None

    def _pool_state(self) -> dict:
        """Utilization and external fragmentation now (an O(pool) scan: failures and probes only)."""
        stats = self._stats()
        frag = stats["external_fragmentation"]
        self.peak_external_fragmentation = max(self.peak_external_fragmentation, frag)
        return {"utilization": stats["utilization"], "external_fragmentation": frag}

    def _stats(self) -> dict:
        """pool.stats(), with fragmentation read as what the pool can serve: where scattered free
        space cannot fail a request (`scatter_fails` false: paged), the largest usable extent is
        the free total (its block map still shows the scatter; the pool's own stats report that)."""
        stats = self.pool.stats()
        if not stats["scatter_fails"]:
            stats = {**stats, "external_fragmentation": 0.0, "largest_free_bytes": stats["free_bytes"]}
        return stats

    def _probe(self, op: Op) -> object:
        """Run a probe op (an allocation) and record the pool as it stood when it was asked."""
        self.ops -= 1  # counted again by apply()
        stats = self._stats()
        before = {"op": op.kind, "requested_bytes": op.nbytes, "free_bytes": stats["free_bytes"],
                  "largest_free_bytes": stats["largest_free_bytes"],
                  "utilization": stats["utilization"],
                  "external_fragmentation": stats["external_fragmentation"]}
        self.peak_external_fragmentation = max(self.peak_external_fragmentation,
                                               before["external_fragmentation"])
        result = self.apply(Op(op.kind, op.ref, op.nbytes, op.dt))
        failed = isinstance(result, OutOfMemory)
        self.probes.append({**before, "served": not failed,
                            "cause": result.cause if failed else None})
        return result

    def _cache_op(self, op: Op) -> object:
        cache: KVCache | None = self.pool.cache
        if cache is None:
            raise InvalidRequest("this scenario needs a pool with a cache")
        if op.kind == "get":
            hit = cache.get(op.ref) is not None
            if hit:
                self.hits += 1
            else:
                self.misses += 1
            return hit
        if op.kind == "put":
            result = cache.put(op.ref, op.nbytes)
            self.evicted += len(result.evicted)
            self._peak()
            return result.entry.id
        if op.ref in cache:
            cache.remove(op.ref)
        return None

    def _sequence_op(self, op: Op) -> object:
        """A sequence op: on a prefix-caching pool a sequence (cached prefixes reused); on any
        other pool a plain allocation of the same tokens (every prompt computed again)."""
        pool = self.pool
        prefix = isinstance(pool, PrefixPool)
        if op.kind == "open":
            self.prefix_queries += len(op.tokens)
            if prefix:
                seq = pool.open_sequence(tokens=list(op.tokens))
                self.prefix_hits += seq.cached_tokens
                self.held[op.ref] = seq.id
            else:
                self.held[op.ref] = pool.allocate(self._token_bytes(len(op.tokens)))
            self._peak()
            return self.held[op.ref]
        ident = self.held.get(op.ref)
        if ident is None:
            return None
        if op.kind == "append":
            if prefix:
                pool.append(ident, tokens=list(op.tokens))
            else:
                pool.extend(ident, self._token_bytes(len(op.tokens)))
            return ident
        del self.held[op.ref]
        (pool.close_sequence if prefix else pool.free)(ident)
        return None

    def _token_bytes(self, n: int) -> int:
        pool = self.pool
        return max(1, n * pool.block_bytes // (pool.tokens_per_block or 16))

    def _peak(self) -> None:
        pool = self.pool
        util = pool.used_blocks / pool.num_blocks
        if util > self.peak_utilization:
            self.peak_utilization = util
        if pool.scatter_fails and self.ops % 8 == 0:  # an O(pool) scan: every 8th op only
            frag = self._stats()["external_fragmentation"]
            self.peak_external_fragmentation = max(self.peak_external_fragmentation, frag)

    def release_all(self) -> int:
        """Free every allocation this runner still holds; returns how many."""
        n = 0
        prefix = isinstance(self.pool, PrefixPool)
        for ref in list(self.held):
            aid = self.held.pop(ref)
            try:
                if prefix and aid in self.pool.sequence_ids():
                    self.pool.close_sequence(aid)
                else:
                    self.pool.free(aid)
                n += 1
            except NotFound:
                self.lost += 1
        return n

    def summary(self) -> dict:
        lookups = self.hits + self.misses
        return {
            "ops": self.ops,
            "ooms": dict(self.ooms),
            "failures": list(self.failures),
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / lookups if lookups else 0.0,
            "evictions": self.evicted,
            "peak_utilization": self.peak_utilization,
            "peak_external_fragmentation": self.peak_external_fragmentation,
            "held": len(self.held),
            "lost": self.lost,
            "probes": list(self.probes),
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "prefix_hit_ratio": self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0,
        }


def drive(gen: ScenarioGen, runner: OpRunner, max_ops: int | None = None,
          pending: Op | None = None) -> tuple[Op | None, bool]:
    """Feed ops from `gen` to `runner` (at most `max_ops`). Returns (next op not yet run, done)."""
    count = 0
    result: object = None
    op = pending
    try:
        if op is None:
            op = next(gen)
        while True:
            if max_ops is not None and count >= max_ops:
                return op, False
            result = runner.apply(op)
            count += 1
            op = gen.send(result)
    except StopIteration:
        return None, True


def scenario_pool(strategy: str = "paged", num_blocks: int = 1024, tokens_per_block: int = 16,
                  model: str = "tiny", cache_share: float = 1.0, policy: str = "lru",
                  prefix: bool = False) -> Pool:
    """A small CPU pool for offline scenario runs, with a KVCache over `cache_share` of it (or,
    with `prefix`, prefix caching under `policy` instead)."""
    pool = create_pool(strategy, num_blocks=num_blocks, tokens_per_block=tokens_per_block,
                       model=model, device="cpu", name=f"{strategy}-scenario",
                       prefix_caching={"policy": policy} if prefix else None)
    if cache_share > 0:
        KVCache(pool, max(pool.block_bytes, int(pool.capacity_bytes * cache_share)) // pool.block_bytes
                * pool.block_bytes, policy=policy)
    return pool


def run_scenario(name: str, strategy: str = "paged", seed: int = 0, num_blocks: int = 1024,
                 policy: str = "lru", pool: Pool | None = None) -> dict:
    """Run scenario `name` to completion on a fresh pool (or `pool`); returns its report."""
    if pool is None:
        pool = scenario_pool(strategy, num_blocks, cache_share=1.0 if name == "chat" else 0.0,
                             policy=policy, prefix=name == "prefix-chat" and strategy == "paged")
    gen = make_scenario(name, seed, Geometry.of(pool))
    runner = OpRunner(pool)
    drive(gen, runner)
    runner.release_all()
    out = {"scenario": name, "strategy": pool.strategy, "seed": seed,
           "num_blocks": pool.num_blocks, "block_bytes": pool.block_bytes, **runner.summary()}
    if pool.cache is not None:
        out["cache"] = pool.cache.stats()
    out["pool_counters"] = dict(pool.counters)
    if isinstance(pool, PrefixPool):
        out["prefix"] = {k: v for k, v in pool.prefix_stats().items() if k != "histograms"}
    out["check"] = pool.check() + (pool.cache.check() if pool.cache is not None else [])
    return out


COMPARE_STRATEGIES = ("contiguous", "paged")


def compare_prefix_caching(seed: int = 0, num_blocks: int = 1024, policy: str = "lru") -> dict:
    """The prefix-chat scenario on a paged pool with prefix caching and on one without, same
    seed and geometry: hit ratio, blocks needed, OOMs side by side."""
    on = run_scenario("prefix-chat", "paged", seed, num_blocks, policy)
    off_pool = scenario_pool("paged", num_blocks, cache_share=0.0)
    off = run_scenario("prefix-chat", "paged", seed, num_blocks, policy, pool=off_pool)
    return {"scenario": "prefix-chat", "seed": seed, "num_blocks": num_blocks,
            "block_bytes": on["block_bytes"], "strategies": {"prefix caching on": on,
                                                              "prefix caching off": off}}


def compare_scenario(name: str, seed: int = 0, num_blocks: int = 1024, policy: str = "lru",
                     strategies: tuple[str, ...] = COMPARE_STRATEGIES) -> dict:
    """Run the same seeded scenario on a fresh pool of each strategy; returns the reports side
    by side (same geometry, so the same ops up to where the pools answer differently)."""
    runs = {s: run_scenario(name, s, seed, num_blocks, policy) for s in strategies}
    first = runs[strategies[0]]
    return {"scenario": name, "seed": seed, "num_blocks": first["num_blocks"],
            "block_bytes": first["block_bytes"], "strategies": runs}


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def comparison_text(cmp: dict) -> str:
    """A side-by-side plain-text report of `compare_scenario`'s result."""
    runs = cmp["strategies"]
    names = list(runs)
    bb, blocks = cmp["block_bytes"], cmp["num_blocks"]
    rows: list[tuple[str, list[str]]] = [
        ("ops run", [str(r["ops"]) for r in runs.values()]),
        ("OOMs, capacity", [str(r["ooms"]["capacity"]) for r in runs.values()]),
        ("OOMs, fragmentation", [str(r["ooms"]["fragmentation"]) for r in runs.values()]),
        ("peak utilization", [f"{r['peak_utilization']:.1%}" for r in runs.values()]),
        ("peak external fragmentation", [f"{r['peak_external_fragmentation']:.1%}" for r in runs.values()]),
    ]
    if any(r.get("prefix_queries") for r in runs.values()):
        rows += [
            ("prompt tokens", [str(r["prefix_queries"]) for r in runs.values()]),
            ("  served from the prefix cache", [f"{r['prefix_hits']} ({r['prefix_hit_ratio']:.1%})"
                                                for r in runs.values()]),
            ("  computed again", [str(r["prefix_queries"] - r["prefix_hits"]) for r in runs.values()]),
            ("cached blocks evicted", [str(r["prefix"]["evicted"]) if "prefix" in r else "-"
                                       for r in runs.values()]),
        ]
    probes = {n: (r["probes"][0] if r["probes"] else None) for n, r in runs.items()}
    if any(probes.values()):
        def cell(n: str, fn) -> str:
            p = probes[n]
            return fn(p) if p else "-"
        rows += [
            ("large request", [cell(n, lambda p: "served" if p["served"] else f"FAILED ({p['cause']})")
                               for n in names]),
            ("  requested", [cell(n, lambda p: _size(p["requested_bytes"])) for n in names]),
            ("  free at the time", [cell(n, lambda p: _size(p["free_bytes"])) for n in names]),
            ("  largest free extent", [cell(n, lambda p: _size(p["largest_free_bytes"])) for n in names]),
            ("  utilization at the time", [cell(n, lambda p: f"{p['utilization']:.1%}") for n in names]),
            ("  external fragmentation", [cell(n, lambda p: f"{p['external_fragmentation']:.1%}") for n in names]),
        ]
    rows.append(("pool check", ["ok" if not r["check"] else "; ".join(r["check"]) for r in runs.values()]))
    w0 = max(len(label) for label, _ in rows) + 2
    widths = [max(len(n), *(len(vals[i]) for _, vals in rows)) + 2 for i, n in enumerate(names)]
    lines = [
        f"{cmp['scenario']} scenario, seed {cmp['seed']}: the same ops on a fresh pool of each "
        f"strategy ({blocks} blocks of {_size(bb)} = {_size(blocks * bb)})",
        "",
        " " * w0 + "".join(n.rjust(w) for n, w in zip(names, widths)),
    ]
    for label, vals in rows:
        lines.append(label.ljust(w0) + "".join(v.rjust(w) for v, w in zip(vals, widths)))
    lines.append("")
    verdict = []
    for n in names:
        p, r = probes[n], runs[n]
        if p is None:
            continue
        if p["served"]:
            frag = r["ooms"]["fragmentation"]
            verdict.append(f"{n} served it" + ("" if frag else " and never failed for fragmentation") + ".")
        else:
            verdict.append(
                f"{n} failed a {_size(p['requested_bytes'])} request with {_size(p['free_bytes'])} "
                f"free ({p['requested_bytes'] / max(1, p['free_bytes']):.0%} of it), because the "
                f"largest free extent was {_size(p['largest_free_bytes'])}: {p['cause']}.")
    if verdict:
        lines.append("Verdict: " + " ".join(verdict))
    if "paged" in runs:
        lines.append("(paged: any free blocks serve a request, so its largest usable extent is its "
                     "whole free total and no memory is stranded.)")
    if cmp["scenario"] == "fragmentation":
        lines.append("(Each pool's capacity OOM is the fill phase's deliberate \"allocate until the "
                     "pool refuses\".)")
    return "\n".join(lines) + "\n"
