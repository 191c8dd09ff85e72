"""The vocabulary of kvscope: every name a client may send or will see, and what it means.

This is the one contract module. Strategies, fits, eviction policies, block states, event kinds,
scenario and workload names, and the routing lab's policies and routers live here and nowhere
else: the request schemas derive their `Literal`s from it, `GET /api/meta` and the stream's
`hello` carry `meta()`, the page renders its options from it, and the JS keeps no copy of any
list. Adding a name is one entry here (plus the code that implements it: a strategy's module, a
policy's class, the code that records an event).

Pure: the standard library only, so that every layer (and the compiled core) may import it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class StrategyInfo:
    """An allocation strategy: what a client may ask for, and what its numbers mean.

    `impl` is `module:Class` inside `allocator` (`pools.paged:PagedPool`; imported on first use,
    so that this module stays import-free). `options` are the create options only this strategy
    takes (another strategy refuses them). `compare`: run by default in the page's Compare view.
    `scatter_fails`: whether free space scattered in pieces can fail a request; on a paged pool
    any free block serves any request, so its "external fragmentation" is only scatter, and its
    `stranded_free_bytes` stat is always 0.
    """

    name: str
    label: str
    impl: str
    scatter_fails: bool
    options: tuple[str, ...] = ()
    compare: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """An eviction policy of the KV cache. `needs_next_use`: usable only when the caller supplies
    each entry's next-use time (an offline oracle such as Belady's MIN)."""

    name: str
    label: str
    description: str = ""
    needs_next_use: bool = False


@dataclass(frozen=True, slots=True)
class BlockState:
    """A block's state byte in the block map (and in the stream's frames: the codes are wire
    format, so a code is never reused)."""

    name: str
    code: int
    description: str = ""


@dataclass(frozen=True, slots=True)
class EventKind:
    """An event kind of a pool's EventLog: its fields after the common (seq, ts, type), in the
    order the log stores them (new fields go at the end; none is renamed or removed), and the
    page's log-filter group it belongs to."""

    name: str
    fields: tuple[str, ...]
    group: str


@dataclass(frozen=True, slots=True)
class ScenarioInfo:
    """A scripted workload (workloads/scenarios.py). `uses_cache`: its pool wants a KV cache.
    `uses_prefix`: it opens sequences, so its pool wants prefix caching (the Compare view runs it
    with prefix caching on and off side by side)."""

    name: str
    description: str
    uses_cache: bool = False
    uses_prefix: bool = False


def _by_name(*items):
    return {item.name: item for item in items}


STRATEGY_INFO: dict[str, StrategyInfo] = _by_name(
    StrategyInfo("paged", "paged", "pools.paged:PagedPool", scatter_fails=False, compare=True,
                 description="fixed-size blocks from a free stack; any free block serves any request"),
    StrategyInfo("contiguous", "contiguous", "pools.contiguous:ContiguousPool", scatter_fails=True,
                 options=("fit",), compare=True,
                 description="one contiguous extent per allocation, placed by a fit rule"),
    StrategyInfo("tiered", "tiered", "pools.tiered:TieredPool", scatter_fails=True, options=("tiers",),
                 description="small / medium / large block pools in one tensor"),
)
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_INFO)

# Strategies whose pool follows an outside source instead of allocating: read-only, created with
# their own option, never in Compare nor in the allocation strategies above.
SOURCE_STRATEGY_INFO: dict[str, StrategyInfo] = _by_name(
    StrategyInfo("mirror", "mirror (read-only)", "prefix.mirror:MirrorPool", scatter_fails=False,
                 options=("mirror",),
                 description="a live vLLM/SGLang engine's prefix cache, from its KV events, on "
                             "logical slots (the events carry no physical block ids)"),
)
SOURCE_STRATEGIES: tuple[str, ...] = tuple(SOURCE_STRATEGY_INFO)

FITS: tuple[str, ...] = ("first", "best", "worst", "next")

POLICY_INFO: dict[str, PolicyInfo] = _by_name(
    PolicyInfo("lru", "LRU", "least recently used goes first"),
    PolicyInfo("fifo", "FIFO", "oldest insertion goes first"),
    PolicyInfo("lfu", "LFU", "fewest hits goes first (oldest among equals)"),
    PolicyInfo("s3fifo", "S3-FIFO", "small probationary FIFO, main FIFO and a ghost queue"),
)
POLICIES: tuple[str, ...] = tuple(POLICY_INFO)

# Eviction order of a prefix-caching pool's idle cached blocks: the cache's policies, and Bélády's
# (the block whose supplied next use is furthest away goes first).
PREFIX_POLICY_INFO: dict[str, PolicyInfo] = {
    **POLICY_INFO,
    "belady": PolicyInfo("belady", "Bélády", "the block needed furthest in the future goes first "
                         "(next_use supplied per block)", needs_next_use=True),
}
PREFIX_POLICIES: tuple[str, ...] = tuple(PREFIX_POLICY_INFO)

BLOCK_STATE_INFO: dict[str, BlockState] = _by_name(
    BlockState("free", 0, "no owner"),
    BlockState("used", 1, "a raw allocation"),
    BlockState("cached", 2, "a cache entry the policy may evict"),
    BlockState("pinned", 3, "a cache entry that is never evicted"),
    BlockState("shared", 4, "a prefix-cache block held by two or more sequences (reference count >= 2); "
               "in a prefix-caching pool `used` is a block with one holder, `cached` an idle cached one"),
)
BLOCK_STATES: dict[str, int] = {s.name: s.code for s in BLOCK_STATE_INFO.values()}
STATE_NAMES: dict[int, str] = {s.code: s.name for s in BLOCK_STATE_INFO.values()}

EVENT_KINDS: dict[str, EventKind] = _by_name(
    # Map-changing kinds end with the block-map rows they change (`block_ids`: rows now owned;
    # `freed_ids`: rows released; `moves`: (src, dst, count) runs applied in order) and what
    # the history needs to rebuild the numbers (state code, bytes added or removed), so any
    # past map replays exactly from a keyframe (allocator/history/replay.py). Cache kinds (put,
    # evict, remove) change the map through the allocate / extend / truncate / free they cause.
    EventKind("allocate", ("id", "requested_bytes", "allocated_bytes", "blocks", "block_ids", "state"), "alloc"),
    EventKind("extend", ("id", "requested_bytes", "allocated_bytes", "moved", "block_ids", "freed_ids",
                         "added_bytes", "state"), "alloc"),
    EventKind("free", ("id", "blocks", "block_ids", "requested_bytes"), "alloc"),
    EventKind("truncate", ("id", "requested_bytes", "allocated_bytes", "block_ids", "removed_bytes"), "alloc"),
    EventKind("oom", ("requested_bytes", "free_bytes", "largest_free_bytes", "cause"), "oom"),
    EventKind("defragment", ("moved_blocks", "moved_bytes", "seconds", "before", "after", "moves",
                             "moved_allocations"), "defragment"),
    EventKind("reset", ("freed",), "reset"),
    EventKind("put", ("key", "id", "bytes", "blocks"), "cache"),
    EventKind("hit", ("key",), "cache"),
    EventKind("miss", ("key",), "cache"),
    EventKind("remove", ("key", "bytes"), "cache"),
    EventKind("evict", ("key", "bytes", "blocks", "reason", "policy", "age_s", "idle_s"), "evict"),
    EventKind("policy", ("policy",), "policy"),
    EventKind("workload", ("name", "state", "done", "total"), "workload"),
    # Prefix-cache events: vLLM's BlockStored / BlockRemoved / AllBlocksCleared content, which the
    # KV-event publisher and the mirror share, plus what a history replay needs.
    # `owners` / `state` (at the end): each block's block-map owner and the state code
    # the blocks took, so a history replays stored blocks exactly (-1 in `blocks`: no slot).
    EventKind("stored", ("blocks", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                         "seq_id", "owners", "state"), "prefix"),
    # `taken_by`: the sequence or allocation that took the evicted blocks, whose
    # event (just before) names them with their new owner; absent or None: the blocks went free.
    EventKind("removed", ("blocks", "block_hashes", "reason", "taken_by"), "prefix"),
    # `freed_ids`: the blocks that went free (a prefix-caching pool's idle ones; held
    # blocks stay with their sequences); absent or None: every block named.
    EventKind("cleared", ("blocks", "block_hashes", "freed_ids"), "prefix"),
    # Sequences of a prefix-caching pool: `blocks` of open are all its blocks (cached ones first),
    # of append the blocks newly taken, of close the blocks released. What replay needs:
    # open's blocks become the sequence's (USED) except `shared_ids`, hits on blocks other
    # sequences hold (SHARED, owner unchanged); append's become the sequence's; close names what
    # each block became (`freed_ids` free, `cached_ids` idle cached, `used_ids` one holder left;
    # the rest stay SHARED); `added_bytes`: the change of the pool's requested bytes.
    EventKind("open", ("seq_id", "num_tokens", "cached_tokens", "blocks", "shared_ids", "added_bytes"), "seq"),
    EventKind("append", ("seq_id", "num_tokens", "blocks", "added_bytes"), "seq"),
    EventKind("close", ("seq_id", "blocks", "freed_ids", "cached_ids", "used_ids", "added_bytes"), "seq"),
    # The blocks of allocation `id` took state code `state` (the cache pins and unpins).
    EventKind("state", ("id", "state", "block_ids"), "cache"),
)
# Field names of each event kind, after the common (seq, ts, type) (allocator/pools/events.py reads it).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {k.name: k.fields for k in EVENT_KINDS.values()}

# The page's event-log filter, in display order: group -> (label, shown by default).
EVENT_GROUPS: dict[str, tuple[str, bool]] = {
    "evict": ("evict", True),
    "oom": ("oom", True),
    "defragment": ("defragment", True),
    "reset": ("reset", True),
    "policy": ("policy", True),
    "workload": ("workload", True),
    "alloc": ("alloc/free", False),
    "cache": ("put/hit/miss", False),
    "prefix": ("stored/removed/cleared", True),
    "seq": ("open/append/close", False),
}

SCENARIO_INFO: dict[str, ScenarioInfo] = _by_name(
    ScenarioInfo("fragmentation", "mixed sizes, every other one freed, then one large request"),
    ScenarioInfo("chat", "multi-turn conversations with Zipf-skewed popularity on the KV cache", uses_cache=True),
    ScenarioInfo("burst", "waves of arrivals that overfill the pool, with quiet gaps between"),
    ScenarioInfo("prefix-chat", "multi-turn conversations over shared system prompts on a "
                 "prefix-caching pool: each prompt is the previous one plus reply plus message",
                 uses_prefix=True),
)
SCENARIOS: tuple[str, ...] = tuple(SCENARIO_INFO)

# mooncake: the Mooncake trace (prompt block hashes) replayed into a prefix-caching pool.
WORKLOAD_KINDS: tuple[str, ...] = ("scenario", "trace", "mooncake")

# Why an allocation failed (`oom` events, OutOfMemory.cause): not enough free in total, or enough
# free in total but not in the shape the request needs.
OOM_CAUSES: tuple[str, ...] = ("capacity", "fragmentation")
# Why a cache entry left (`evict` events' `reason`, the cache's `evictions` counters).
EVICTION_REASONS: tuple[str, ...] = ("capacity", "oom", "ttl", "manual")

# The routing lab's policies (workloads/routing/registry.py `make_policy` builds each; a test
# checks the two agree), variants included, in the order the page and `kvscope route` list them.
ROUTING_POLICIES: tuple[str, ...] = (
    "round_robin", "random", "least_loaded", "power_of_two", "session", "longest_prefix",
    "sglang_cache_aware", "sglang_cache_aware_code", "vllm_cache_aware", "vllm_kv_aware",
    "dynamo_kv", "dynamo_kv_approx", "llmd_precise", "llmd_precise_minmax",
)
# The real routers the routing lab's router mode puts in front of simulated engines
# (vllm-kv: vllm-router's kv_aware policy, following the engines' KV events).
ROUTING_ROUTERS: tuple[str, ...] = ("sglang", "vllm", "vllm-kv")

# Defaults every layer shares.
DEFAULT_TOKENS_PER_BLOCK = 16


def strategy_info(name: str) -> StrategyInfo | None:
    """The strategy named `name`, or None."""
    return STRATEGY_INFO.get(name) or SOURCE_STRATEGY_INFO.get(name)


def _public(info: StrategyInfo) -> dict:
    out = asdict(info)
    del out["impl"]  # where the core finds the class is no client's business
    out["options"] = list(info.options)
    return out


def meta() -> dict:
    """The whole vocabulary as plain JSON values (`GET /api/meta`, the stream's `hello`)."""
    return {
        "strategies": {k: _public(v) for k, v in STRATEGY_INFO.items()},
        "source_strategies": {k: _public(v) for k, v in SOURCE_STRATEGY_INFO.items()},
        "fits": list(FITS),
        "policies": {k: asdict(v) for k, v in POLICY_INFO.items()},
        "prefix_policies": {k: asdict(v) for k, v in PREFIX_POLICY_INFO.items()},
        "block_states": {k: asdict(v) for k, v in BLOCK_STATE_INFO.items()},
        "events": {k: {"fields": list(v.fields), "group": v.group} for k, v in EVENT_KINDS.items()},
        "event_groups": {k: {"label": label, "default": on} for k, (label, on) in EVENT_GROUPS.items()},
        "scenarios": {k: asdict(v) for k, v in SCENARIO_INFO.items()},
        "workload_kinds": list(WORKLOAD_KINDS),
        "oom_causes": list(OOM_CAUSES),
        "eviction_reasons": list(EVICTION_REASONS),
        "defaults": {"tokens_per_block": DEFAULT_TOKENS_PER_BLOCK},
    }


__all__ = [
    "BLOCK_STATES", "BLOCK_STATE_INFO", "BlockState", "DEFAULT_TOKENS_PER_BLOCK", "EVENT_FIELDS",
    "EVENT_GROUPS", "EVENT_KINDS", "EVICTION_REASONS", "EventKind", "FITS", "OOM_CAUSES",
    "POLICIES", "POLICY_INFO", "PREFIX_POLICIES", "PREFIX_POLICY_INFO", "PolicyInfo",
    "ROUTING_POLICIES", "ROUTING_ROUTERS", "SCENARIOS", "SCENARIO_INFO", "SOURCE_STRATEGIES",
    "SOURCE_STRATEGY_INFO", "STATE_NAMES", "STRATEGIES", "STRATEGY_INFO", "ScenarioInfo",
    "StrategyInfo", "WORKLOAD_KINDS", "meta", "strategy_info",
]
