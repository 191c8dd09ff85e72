"""Cache policy study: hit rate of each eviction policy on one access stream, next to MIN.

Every policy runs on the REAL `allocator.KVCache` over a real (CPU) paged pool: an access is a
`get(key)`; a miss `put`s the entry. Streams:

- `chat`: the chat scenario's turns (Zipf-popular conversations, one key per conversation);
- `trace`: the Azure trace's rows, keyed by context length (`ctx-<ContextTokens>`): the trace has
  no conversation ids, so requests with the same prompt length stand in for a shared prefix.
  That is a proxy, stated as one.

Modes: `unit` (every entry one block; Bélády's MIN is the exact optimum, an upper bound) and
`sized` (entries sized in tokens; the bound column is the size-aware MIN heuristic, see belady.py).
"""

from __future__ import annotations

from allocator import POLICIES, KVCache, PagedPool

from .belady import min_hits, sized_min_hits
from .scenarios import Geometry, Op, chat
from .trace import ATTRIBUTION, Trace, load_trace

POLICY_NAMES = tuple(sorted(POLICIES))
TOKENS_PER_BLOCK = 16


def chat_stream(seed: int = 0, turns: int = 4000, conversations: int = 256,
                cache_tokens: int = 65_536) -> tuple[list[str], list[int]]:
    """(keys, sizes in tokens) of the chat scenario's turns; a turn's size is after it grew."""
    keys: list[str] = []
    sizes: list[int] = []
    gen = chat(seed, Geometry(1, cache_tokens, cache_tokens), conversations=conversations, turns=turns)
    for op in gen:
        op: Op
        if op.kind == "put":
            keys.append(op.ref)
            sizes.append(op.nbytes)
    return keys, sizes


def trace_stream(trace: Trace | None = None) -> tuple[list[str], list[int]]:
    trace = trace if trace is not None else load_trace()
    ctx = trace.context.tolist()
    return [f"ctx-{c}" for c in ctx], ctx


def policy_hits(keys: list[str], sizes: list[int] | None, capacity: int, policy: str) -> int:
    """Hits of `policy` on a real KVCache. `capacity` in entries (unit) or tokens (sized)."""
    if sizes is None:
        pool = PagedPool(capacity, 1, device="cpu", event_capacity=1)
        cache = KVCache(pool, capacity, policy=policy)
        for k in keys:
            if cache.get(k) is None:
                cache.put(k, 1)
        return cache.hits
    blocks = capacity // TOKENS_PER_BLOCK
    pool = PagedPool(blocks, TOKENS_PER_BLOCK, device="cpu", event_capacity=1)
    cache = KVCache(pool, blocks * TOKENS_PER_BLOCK, policy=policy)
    limit = blocks * TOKENS_PER_BLOCK
    for k, size in zip(keys, sizes):
        if cache.get(k) is None or cache.peek(k).nbytes != size:
            if pool.footprint(size) <= limit:
                cache.put(k, size)
    return cache.hits


def study(keys: list[str], sizes: list[int], capacities: list[int], mode: str = "unit") -> list[dict]:
    """One row per capacity: hit rate of each policy and of MIN (the bound)."""
    rows = []
    n = len(keys)
    for cap in capacities:
        row: dict = {"capacity": cap, "mode": mode, "accesses": n}
        for p in POLICY_NAMES:
            row[p] = policy_hits(keys, None if mode == "unit" else sizes, cap, p) / n
        if mode == "unit":
            row["belady"] = min_hits(keys, cap) / n
        else:
            foot = [-(-s // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK for s in sizes]
            row["belady"] = sized_min_hits(keys, foot, cap // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK) / n
        rows.append(row)
    return rows


def run_study(seed: int = 0, trace: Trace | None = None, shares=(0.05, 0.1, 0.25)) -> dict:
    """Both streams, unit mode at `shares` of the distinct keys, sized mode at the same shares
    of the distinct keys' total final size."""
    out: dict = {"policies": list(POLICY_NAMES), "streams": {}, "attribution": ATTRIBUTION,
                 "bound": {"unit": "Bélády's MIN (exact optimum for equal sizes)",
                           "sized": "size-aware MIN heuristic (furthest next use first; not a proven bound)"}}
    for name, (keys, sizes) in (("chat", chat_stream(seed)), ("trace", trace_stream(trace))):
        final: dict[str, int] = {}
        for k, s in zip(keys, sizes):
            final[k] = max(final.get(k, 0), s)
        distinct = len(final)
        total = sum(final.values())
        unit_caps = [max(1, int(distinct * s)) for s in shares]
        sized_caps = [max(TOKENS_PER_BLOCK * 64, int(total * s)) for s in shares]
        out["streams"][name] = {
            "accesses": len(keys), "distinct_keys": distinct,
            "unit": study(keys, sizes, unit_caps, "unit"),
            "sized": study(keys, sizes, sized_caps, "sized"),
        }
    return out


def markdown(result: dict) -> str:
    pols = result["policies"]
    lines = ["# Cache policy study: hit rate vs Bélády's MIN", ""]
    for name, s in result["streams"].items():
        lines.append(f"## {name} stream: {s['accesses']:,} accesses, {s['distinct_keys']:,} keys")
        lines.append("")
        lines.append("| mode | capacity | " + " | ".join(pols) + " | MIN |")
        lines.append("|---|---:|" + "---:|" * (len(pols) + 1))
        for mode in ("unit", "sized"):
            for row in s[mode]:
                unit = "entries" if mode == "unit" else "tokens"
                cells = " | ".join(f"{row[p]:.1%}" for p in pols)
                lines.append(f"| {mode} | {row['capacity']:,} {unit} | {cells} | {row['belady']:.1%} |")
        lines.append("")
    lines += [f"MIN: unit = {result['bound']['unit']}; sized = {result['bound']['sized']}.", "",
              "---", result["attribution"], ""]
    return "\n".join(lines)
