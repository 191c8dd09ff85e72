"""Request and response models of the REST API, with the examples shown at /docs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from allocator.vocab import (
    FITS,
    POLICIES,
    PREFIX_POLICIES,
    SCENARIOS,
    SOURCE_STRATEGIES,
    STRATEGIES,
    STRATEGY_INFO,
    WORKLOAD_KINDS,
)
from workloads.spec import MAX_SEED, MAX_SPEED, MAX_TRACE_LIMIT

from .settings import DEVICE_PATTERN

POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
# Printable: no control characters (C0, DEL, C1). '/' cannot reach a path parameter anyway.
KEY_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]{1,256}$"
MAX_BYTES = 1 << 60
MAX_TOKENS = 1 << 40

PoolName = Annotated[str, Field(pattern=POOL_NAME_PATTERN, examples=["default"])]
KEY_FIELD = Field(min_length=1, max_length=256, pattern=KEY_PATTERN, description="cache key",
                  examples=["session-1"])


def check_key(key: str) -> str:
    """The checks a pattern cannot say: printable (no unassigned or separator characters), and
    no U+FFFD, which is what invalid UTF-8 in a URL path decodes to (`%FF` and `%FE` alike)."""
    if not key.isprintable():
        raise ValueError("key must be printable characters")
    if "\ufffd" in key:
        raise ValueError("key must be valid UTF-8 without U+FFFD (invalid bytes in a path decode to it)")
    return key


# The one key type, for path parameters (app/deps.py `EntryKey`) and batch ops alike.
Key = Annotated[str, KEY_FIELD, AfterValidator(check_key)]
Bytes = Annotated[int, Field(gt=0, le=MAX_BYTES, examples=[65536])]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, examples=[128])]
Priority = Annotated[int, Field(ge=-(1 << 31), le=(1 << 31) - 1)]
TtlSeconds = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
# The names come from the one vocabulary (allocator/vocab.py); a new entry there is accepted here.
Policy = Literal[POLICIES]
Strategy = Literal[STRATEGIES + SOURCE_STRATEGIES]
Fit = Literal[FITS]
ScenarioName = Literal[SCENARIOS]
WorkloadKind = Literal[WORKLOAD_KINDS]


def _exactly_one(model: BaseModel, a: str, b: str) -> None:
    if (getattr(model, a) is None) == (getattr(model, b) is None):
        raise ValueError(f"give exactly one of '{a}' or '{b}'")


class Strict(BaseModel):
    """Request bodies: unknown fields are refused, and JSON types are not coerced ("10" is no int)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# -- pools ---------------------------------------------------------------------------------
class TierSpec(Strict):
    name: Annotated[str, Field(min_length=1, max_length=32)]
    units: Annotated[int, Field(ge=1, le=4096)]
    share: Annotated[float, Field(gt=0, le=1)]


class CacheSpec(Strict):
    capacity_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES)] | None = None
    policy: Policy = "lru"


PrefixPolicy = Literal[PREFIX_POLICIES]


class PrefixCachingSpec(Strict):
    policy: PrefixPolicy = Field("lru", description="eviction order of idle cached blocks; "
                                 "belady needs next_use on each sequence")


# An engine's endpoint as its --kv-events-config names it: tcp:// (another host or container) or
# ipc:// (a Unix socket on this host). inproc:// reaches only sockets of this server's own
# process, where no engine publishes: refused with that reason rather than followed in silence.
ZMQ_ENDPOINT = r"^(tcp://[^\s/]+:\d{1,5}|ipc://[^\s]+)$"


def _not_inproc(endpoint):
    if isinstance(endpoint, str) and endpoint.startswith("inproc://"):
        raise ValueError(f"{endpoint!r}: inproc:// reaches only sockets inside this server's process, "
                         "where no engine publishes; give the engine's tcp:// or ipc:// endpoint")
    return endpoint


def _tcp_port(endpoint: str) -> str:
    """A tcp:// endpoint's port must be a real one (the pattern allows five digits)."""
    if endpoint.startswith("tcp://") and not 0 < int(endpoint.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(f"port of {endpoint!r} is not in 1..65535")
    return endpoint


Endpoint = Annotated[str, Field(max_length=256, pattern=ZMQ_ENDPOINT, examples=["tcp://127.0.0.1:5557"]),
                     BeforeValidator(_not_inproc), AfterValidator(_tcp_port)]
Topic = Annotated[str, Field(max_length=256)]
# A publisher binds: over the API only TCP, so that a request cannot make the server create a
# socket file at a path of its choosing (ipc://).
BindEndpoint = Annotated[str, Field(max_length=256, pattern=r"^tcp://[^\s/]+:\d{1,5}$",
                                    examples=["tcp://*:5557"]), AfterValidator(_tcp_port)]


class MirrorSpec(Strict):
    """Where the engine publishes (its `--kv-events-config` endpoints, seen from here)."""

    endpoint: Endpoint
    topic: Topic = ""
    replay_endpoint: Endpoint | None = None
    metrics_url: Annotated[str, Field(max_length=2048, pattern=r"^https?://\S+$")] | None = None


class PublishSpec(Strict):
    """Where this pool publishes its prefix-cache events (vLLM's wire format): TCP endpoints,
    bound when the host is `*` (vLLM's rule; `tcp://*:5557`), else connected to."""

    endpoint: BindEndpoint
    topic: Topic = ""
    replay_endpoint: BindEndpoint | None = None


class PoolCreate(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "demo", "strategy": "paged", "num_blocks": 4096, "block_bytes": 4096,
         "cache": {"policy": "lru"}},
        {"name": "frag", "strategy": "contiguous", "num_blocks": 1024, "block_bytes": 4096, "fit": "best"},
        {"name": "llama", "strategy": "paged", "capacity_bytes": 268435456, "model": "llama-3-8b",
         "tokens_per_block": 16},
        {"name": "prefix", "strategy": "paged", "num_blocks": 4096, "block_bytes": 4096,
         "tokens_per_block": 16, "prefix_caching": {"policy": "lru"}},
        {"name": "engine", "strategy": "mirror", "num_blocks": 20000,
         "mirror": {"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}},
    ]})

    name: PoolName
    strategy: Strategy = "paged"
    device: Annotated[str, Field(pattern=DEVICE_PATTERN)] | None = None
    num_blocks: Annotated[int, Field(gt=0, le=1 << 32)] | None = None
    capacity_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES)] | None = None
    block_bytes: Annotated[int, Field(gt=0, le=1 << 36)] | None = None
    tokens_per_block: Annotated[int, Field(gt=0, le=1 << 16)] | None = None
    model: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    tiers: Annotated[list[TierSpec], Field(min_length=1, max_length=8)] | None = None
    fit: Fit | None = None
    cache: CacheSpec | None = None
    prefix_caching: PrefixCachingSpec | None = Field(
        None, description="share full blocks between sequences by hash (paged only; needs "
                          "tokens_per_block or a model)")
    mirror: MirrorSpec | None = Field(None, description="strategy 'mirror': the engine to follow")
    publish: PublishSpec | None = Field(None, description="publish this pool's prefix-cache events")

    @model_validator(mode="after")
    def _sizes(self) -> PoolCreate:
        if self.strategy == "mirror":
            return self._mirror()
        if self.mirror is not None:
            raise ValueError("'mirror' applies only to strategy 'mirror'")
        if self.publish is not None and getattr(self, "prefix_caching", None) is None:
            raise ValueError("'publish' needs a pool that has prefix-cache events: give "
                             "'prefix_caching', or use strategy 'mirror'")
        _exactly_one(self, "num_blocks", "capacity_bytes")
        if self.block_bytes is None and self.model is None:
            raise ValueError("give 'block_bytes', or 'model' (with optional 'tokens_per_block')")
        # Options of another strategy are refused rather than silently ignored.
        if self.prefix_caching is not None:
            if self.strategy != "paged":
                raise ValueError(f"'prefix_caching' applies only to strategy 'paged', not {self.strategy!r}")
            if self.tokens_per_block is None and self.model is None:
                raise ValueError("'prefix_caching' needs 'tokens_per_block' (or a 'model')")
        takes = STRATEGY_INFO[self.strategy].options
        for option in ("fit", "tiers"):
            if getattr(self, option) is not None and option not in takes:
                owners = [s for s, info in STRATEGY_INFO.items() if option in info.options]
                raise ValueError(f"'{option}' applies only to strategy {' or '.join(map(repr, owners))}, "
                                 f"not {self.strategy!r}")
        return self

    def _mirror(self) -> PoolCreate:
        if self.mirror is None:
            raise ValueError("strategy 'mirror' needs 'mirror': {endpoint, topic, replay_endpoint, metrics_url}")
        if self.num_blocks is None and self.mirror.metrics_url is None:
            raise ValueError("give 'num_blocks' (the engine's KV block count), or "
                             "'mirror.metrics_url' to read it from vllm:cache_config_info")
        for key in ("capacity_bytes", "cache", "tiers", "fit", "model"):
            if getattr(self, key) is not None:
                raise ValueError(f"'{key}' does not apply to strategy 'mirror' (it holds no KV bytes)")
        return self


class PoolSummary(BaseModel):
    name: str
    strategy: str
    num_blocks: int
    block_bytes: int
    capacity_bytes: int
    device: str
    used_blocks: int
    utilization: float
    cache: dict | None = None
    prefix_caching: dict | None = None


class PoolList(BaseModel):
    pools: list[PoolSummary]


class PoolOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "default", "config": {"strategy": "paged", "num_blocks": 4096, "block_bytes": 4096},
         "stats": {"utilization": 0.25, "used_blocks": 1024}}]})

    name: str
    config: dict
    stats: dict


class StatsOut(BaseModel):
    """The metrics of docs/ARCHITECTURE.md (Metrics). Strategy-specific extras (`fit`, `tiers`) pass through."""

    model_config = ConfigDict(extra="allow")

    strategy: str
    total_blocks: int
    used_blocks: int
    free_blocks: int
    blocks_by_state: dict[str, int]
    block_bytes: int
    capacity_bytes: int
    utilization: float
    requested_bytes: int
    allocated_bytes: int
    allocation_count: int
    internal_fragmentation: float
    external_fragmentation: float
    largest_free_bytes: int
    free_bytes: int
    free_extents: Any
    free_extent_count: int
    scatter_fails: bool = Field(description="whether scattered free space can fail a request here "
                                "(false on a paged pool: any free block serves any request)")
    stranded_free_bytes: int = Field(description="free bytes outside the largest free extent when "
                                     "scattered free space can fail a request; 0 when it cannot")
    counters: dict[str, int]
    ooms: dict[str, int]
    last_event_seq: int
    cache: dict | None = Field(None, description="the cache's stats; absent when the pool has none")
    prefix: dict | None = Field(None, description="prefix caching: token-weighted queries / hits, "
                                "hit ratio, blocks by state, block-time histograms; absent without it")


class ResetOut(BaseModel):
    freed: int


class CheckOut(BaseModel):
    ok: bool
    problems: list[str]


class DefragOut(BaseModel):
    moved_blocks: int
    moved_bytes: int
    seconds: float = Field(description="the whole call")
    copy_seconds: float = Field(description="the tensor gather + scatter alone")
    before: dict
    after: dict


# -- allocations ----------------------------------------------------------------------------
class SizeIn(Strict):
    """A size in bytes or in tokens (token-sized pools only)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"bytes": 65536}, {"tokens": 128}]})

    bytes: Bytes | None = None
    tokens: Tokens | None = None

    @model_validator(mode="after")
    def _one(self) -> SizeIn:
        _exactly_one(self, "bytes", "tokens")
        return self


class AllocationOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"id": 7, "requested_bytes": 10000, "allocated_bytes": 12288, "blocks": [[0, 3]],
         "state": "used", "tier": None}]})

    id: int
    requested_bytes: int
    allocated_bytes: int
    blocks: list[list[int]]
    state: str
    tier: str | None = None
    moved: bool | None = Field(None, description="extend only: whether the data had to move")
    key: str | None = None
    age_s: float | None = None
    idle_s: float | None = None


# -- cache entries --------------------------------------------------------------------------
class EntryPut(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"bytes": 65536}, {"tokens": 512, "priority": 1, "ttl_s": 60, "pinned": False}]})

    bytes: Bytes | None = None
    tokens: Tokens | None = None
    priority: Priority | None = Field(
        None, description="eviction priority (lower goes first); omitted: keep the entry's, 0 when new")
    ttl_s: TtlSeconds | None = Field(None, description="seconds to live; omitted: keep the entry's, none when new")
    pinned: bool | None = Field(None, description="never evicted while true; omitted: keep, false when new")

    @model_validator(mode="after")
    def _one(self) -> EntryPut:
        _exactly_one(self, "bytes", "tokens")
        return self


class EntryOut(BaseModel):
    key: str
    id: int
    bytes: int
    allocated_bytes: int
    priority: int
    pinned: bool
    ttl_s: float | None
    expires_in_s: float | None
    age_s: float
    idle_s: float
    hits: int
    data_bytes: int = Field(description="bytes written into the entry's blocks with PUT .../data")
    blocks: list[list[int]] | None = None


class PutOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"entry": {"key": "session-1", "id": 3, "bytes": 65536, "allocated_bytes": 65536,
                   "priority": 0, "pinned": False, "ttl_s": None, "expires_in_s": None,
                   "age_s": 0.0, "idle_s": 0.0, "hits": 0, "data_bytes": 0, "blocks": [[0, 16]]},
         "evicted": ["session-0"], "created": True}]})

    entry: EntryOut
    evicted: list[str]
    created: bool = Field(description="a new entry (REST: 201), else an existing one refreshed (200)")


class EntryList(BaseModel):
    entries: list[EntryOut]
    total: int


class PolicyIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"policy": "lfu"}]})

    policy: Policy


class PolicyOut(BaseModel):
    policy: str


# -- events, block map ------------------------------------------------------------------------
class EventList(BaseModel):
    events: list[dict]
    last_seq: int
    instance_id: str = Field(description="the server process that answered (app/instance.py)")
    started_at: float = Field(description="when it started, Unix seconds")


class BlockMapOut(BaseModel):
    """Run-length encoded block map: `[start, count, owner, state]` per run."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"num_blocks": 8, "states": {"0": "free", "1": "used"},
         "runs": [[0, 3, 1, 1], [3, 5, -1, 0]]}]})

    num_blocks: int
    states: dict[str, str]
    runs: list[list[int]]
    at_seq: int | None = Field(None, description="the event seq this map is of (absent for the live map)")


# -- sequences (prefix caching) ------------------------------------------------------------------
MAX_SEQUENCE_TOKENS = 1 << 20
TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=1 << 63)]],
                     Field(max_length=MAX_SEQUENCE_TOKENS, description="token ids")]
BlockHashes = Annotated[list[Annotated[int, Field(ge=0, lt=1 << 64)]],
                        Field(max_length=MAX_SEQUENCE_TOKENS, description="one hash per full block, "
                              "64-bit unsigned")]
Salt = Annotated[str, Field(max_length=256, description="separates caches (e.g. per tenant)")]
NextUse = Annotated[list[Annotated[float, Field(ge=0)]], Field(
    max_length=MAX_SEQUENCE_TOKENS, description="belady: when each block is next needed "
    "(larger = later; a huge number for never)")]


class SequenceOpen(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9]},
        {"block_hashes": [17, 42], "num_tokens": 40},
        {"tokens": [1, 2, 3], "salt": "tenant-a"}]})

    tokens: TokenIds | None = None
    block_hashes: BlockHashes | None = None
    num_tokens: Tokens | None = None
    salt: Salt | None = None
    next_use: NextUse | None = None


class SequenceAppend(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"tokens": [10, 11]}, {"num_tokens": 16, "block_hashes": [99]}]})

    tokens: TokenIds | None = None
    num_tokens: Tokens | None = None
    block_hashes: BlockHashes | None = None


class SequenceOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"id": 3, "num_tokens": 9, "cached_tokens": 8, "blocks": [0, 1, 5]}]})

    id: int
    num_tokens: int
    cached_tokens: int = Field(description="tokens served from the prefix cache at open")
    blocks: list[int] = Field(description="block ids in data order")


class SequenceList(BaseModel):
    ids: list[int]


class PrefixResetOut(BaseModel):
    cleared: int = Field(description="cached hashes dropped")


class EvictionOrderOut(BaseModel):
    blocks: list[int] = Field(description="idle cached blocks, next victim first")
    total: int


class BlockInfoOut(BaseModel):
    block: int
    state: str
    refcount: int
    hash: str | None = Field(description="16 hex digits, none when the block is not cached")
    depth: int | None = Field(description="position in its prefix chain (0 = first block)")
    hits: int
    owner: int


# -- batch ops ----------------------------------------------------------------------------------
class OpAllocate(Strict):
    op: Literal["allocate"]
    bytes: Bytes | None = None
    tokens: Tokens | None = None


class OpExtend(Strict):
    op: Literal["extend"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]
    bytes: Bytes | None = None
    tokens: Tokens | None = None


class OpFree(Strict):
    op: Literal["free"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]


class OpPut(Strict):
    op: Literal["put"]
    key: Key
    bytes: Bytes | None = None
    tokens: Tokens | None = None
    priority: Priority | None = None  # omitted: keep the entry's (0 when new), as for PUT
    ttl_s: TtlSeconds | None = None
    pinned: bool | None = None


class OpGet(Strict):
    op: Literal["get"]
    key: Key


class OpDelete(Strict):
    op: Literal["delete"]
    key: Key


class OpEvict(Strict):
    op: Literal["evict"]
    key: Key


class OpDefragment(Strict):
    op: Literal["defragment"]


class OpOpen(Strict):
    op: Literal["open"]
    tokens: TokenIds | None = None
    block_hashes: BlockHashes | None = None
    num_tokens: Tokens | None = None
    salt: Salt | None = None
    next_use: NextUse | None = None


class OpAppend(Strict):
    op: Literal["append"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]
    tokens: TokenIds | None = None
    num_tokens: Tokens | None = None
    block_hashes: BlockHashes | None = None


class OpClose(Strict):
    op: Literal["close"]
    id: Annotated[int, Field(ge=0, le=1 << 62)]


Op = Annotated[OpAllocate | OpExtend | OpFree | OpPut | OpGet | OpDelete | OpEvict | OpDefragment
               | OpOpen | OpAppend | OpClose,
               Field(discriminator="op")]


class BatchIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"ops": [{"op": "allocate", "bytes": 65536}, {"op": "free", "id": 1},
                 {"op": "put", "key": "a", "bytes": 4096}, {"op": "get", "key": "a"}],
         "stop_on_error": False}]})

    ops: list[Op]
    stop_on_error: bool = False


class BatchOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"results": [{"ok": True, "id": 1, "requested_bytes": 65536, "allocated_bytes": 65536,
                      "blocks": [[0, 16]], "state": "used", "tier": None},
                     {"ok": False, "error": {"code": "not_found", "message": "allocation 9 not found",
                                             "details": {"kind": "allocation", "id": 9}}}]}]})

    results: list[dict]


# -- workloads -------------------------------------------------------------------------------
class WorkloadIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"kind": "scenario", "name": "fragmentation", "seed": 0, "speed": 1.0},
        {"kind": "trace", "limit": 500, "speed": 1.0}]})

    kind: WorkloadKind
    name: ScenarioName | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    speed: Annotated[float, Field(gt=0, le=MAX_SPEED, allow_inf_nan=False)] = 1.0
    limit: Annotated[int, Field(gt=0, le=MAX_TRACE_LIMIT)] | None = None

    @model_validator(mode="after")
    def _named(self) -> WorkloadIn:
        if self.kind == "scenario" and self.name is None:
            raise ValueError("a scenario needs 'name'")
        return self


class WorkloadOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"workload": {"name": "fragmentation", "kind": "scenario", "state": "running", "done": 0, "total": 400}}]})

    workload: dict


# -- vocabulary ----------------------------------------------------------------------------------
class MetaOut(BaseModel):
    """The vocabulary (allocator/vocab.py `meta()`): every name a client may send or will see."""

    model_config = ConfigDict(extra="allow")

    strategies: dict[str, dict]
    fits: list[str]
    policies: dict[str, dict]
    block_states: dict[str, dict]
    events: dict[str, dict]
    event_groups: dict[str, dict]
    scenarios: dict[str, dict]
    workload_kinds: list[str]
    defaults: dict


# -- prefix capacity curve -----------------------------------------------------------------------
class CurvePoint(BaseModel):
    """One point of the capacity curve: the hit ratio one policy reaches at one capacity."""

    capacity_tokens: int
    policy: str = Field(description="an eviction policy of the prefix cache, or `belady` (MIN)")
    hit_ratio: float = Field(ge=0, le=1)


class PrefixCurveOut(BaseModel):
    """The bundled Mooncake trace's hit ratio vs cache capacity, per policy (workloads/prefix_curve_data.py)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "trace": {"source": "mooncake_conversation.jsonl", "requests": 12031, "input_tokens_total": 144793823},
        "tokens_per_block": 512, "capacities_tokens": [100000, 3000000], "policies": ["lru"],
        "max_hit_ratio": 0.374, "definition": "arrival order, no concurrency; ...",
        "curve": [{"capacity_tokens": 100000, "policy": "lru", "hit_ratio": 0.043},
                  {"capacity_tokens": 3000000, "policy": "lru", "hit_ratio": 0.139}]}]})

    trace: dict
    tokens_per_block: int
    definition: str
    capacities_tokens: list[int]
    policies: list[str]
    max_hit_ratio: float = Field(ge=0, le=1, description="hit ratio with infinite capacity")
    attribution: str = ""
    curve: list[CurvePoint]


# -- routing lab ---------------------------------------------------------------------------------
def _routing_policies() -> tuple[str, ...]:
    from workloads.routing import policy_names

    return tuple(policy_names())


RoutingPolicy = Literal[_routing_policies()]
ROUTING_RUN_ID_PATTERN = r"^r[0-9]{1,12}$"
ROUTING_SERVING_TOKENS = 1 << 28  # simulated KV over all replicas of a run the server makes
ROUTING_MAX_SPEED = 1e6
ROUTING_LIVE_REPLICAS = 16
ROUTING_ROUTERS = ("sglang", "vllm", "vllm-kv")  # router mode's real routers


class RoutingIn(Strict):
    """Start a routing run (`action` start: the other fields) or stop one (`action` stop, `id`)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"action": "start", "policies": ["round_robin", "sglang_cache_aware", "dynamo_kv",
                                         "llmd_precise"], "replicas": 4,
         "capacity_tokens": 1000000, "limit": 2000, "mode": "sequence"},
        {"action": "start", "mode": "live", "policy": "sglang_cache_aware", "replicas": 4,
         "capacity_tokens": 1000000, "limit": 2000, "speed": 20.0},
        {"action": "start", "mode": "live", "compare": ["round_robin", "sglang_cache_aware"],
         "replicas": 3, "capacity_tokens": 1000000, "limit": 2000, "speed": 20.0},
        {"action": "start", "mode": "router", "router": "sglang", "replicas": 4,
         "capacity_tokens": 1000000, "limit": 2000},
        {"action": "stop", "id": "r1"}]})

    action: Literal["start", "stop"] = "start"
    id: Annotated[str, Field(pattern=ROUTING_RUN_ID_PATTERN)] | None = None
    policies: Annotated[list[RoutingPolicy], Field(min_length=1, max_length=16)] = [
        "round_robin", "sglang_cache_aware", "dynamo_kv", "llmd_precise"]
    replicas: Annotated[int, Field(ge=1, le=64)] = 4
    capacity_tokens: Annotated[int, Field(ge=512, le=1 << 30)] = 1_000_000
    limit: Annotated[int, Field(gt=0, le=MAX_TRACE_LIMIT)] = 2000
    mode: Literal["sequence", "serving", "live", "router"] = "sequence"
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    policy: RoutingPolicy | None = Field(None, description="live mode: the policy to start with "
                                         "(default: the first of 'policies')")
    speed: Annotated[float, Field(gt=0, le=ROUTING_MAX_SPEED)] | None = Field(
        None, description="live and router modes: times the trace's timestamps (default 1 live; "
        "router mode: the requests in about 60 s)")
    router: Literal[ROUTING_ROUTERS] | None = Field(  # type: ignore[valid-type]
        None, description="router mode: the real router in front of the simulated engines: "
        "sglang or vllm (cache_aware) or vllm-kv (vllm-router's kv_aware on their KV events); "
        "needs kvscope[routers]")
    compare: Annotated[list[RoutingPolicy], Field(min_length=2, max_length=2)] | None = Field(
        None, description="live mode: two different policies, each routing the same requests "
        "to its own set of `replicas` pools (instead of `policy`)")

    @model_validator(mode="after")
    def _stop_names_a_run(self) -> RoutingIn:
        if self.action == "stop" and self.id is None:
            raise ValueError("stopping needs the run's 'id'")
        if (self.mode == "router") != (self.router is not None):
            raise ValueError("mode 'router' needs 'router' (sglang, vllm or vllm-kv), and "
                             "'router' is only for mode 'router'")
        if self.mode not in ("live", "router") and self.speed is not None:
            raise ValueError("'speed' is for modes 'live' and 'router' (the other modes run "
                             "every policy of 'policies' as fast as they go)")
        if self.mode != "live" and self.policy is not None:
            raise ValueError("'policy' is for mode 'live' (the other modes run every policy of "
                             "'policies')")
        if self.mode == "router":
            if self.replicas > ROUTING_LIVE_REPLICAS:
                raise ValueError(f"router mode runs at most {ROUTING_LIVE_REPLICAS} simulated "
                                 "engines: lower 'replicas'")
            if self.replicas * self.capacity_tokens > ROUTING_SERVING_TOKENS:
                raise ValueError(f"router mode simulates at most {ROUTING_SERVING_TOKENS:,} tokens "
                                 "of KV over all engines: lower 'replicas' or 'capacity_tokens'")
        if self.compare is not None:
            if self.mode != "live":
                raise ValueError("'compare' is for mode 'live' (the other modes already compare "
                                 "every policy of 'policies')")
            if self.policy is not None:
                raise ValueError("give either 'policy' or 'compare', not both")
            if self.compare[0] == self.compare[1]:
                raise ValueError(f"'compare' needs two different policies, not {self.compare[0]!r} "
                                 "twice")
        if self.mode == "live" and self.replicas > ROUTING_LIVE_REPLICAS:
            raise ValueError(f"live mode runs at most {ROUTING_LIVE_REPLICAS} replicas (one pool "
                             "and one publisher each): lower 'replicas'")
        if self.mode == "serving" and self.replicas * self.capacity_tokens > ROUTING_SERVING_TOKENS:
            raise ValueError(f"serving mode simulates at most {ROUTING_SERVING_TOKENS:,} tokens of "
                             "KV over all replicas: lower 'replicas' or 'capacity_tokens'")
        return self


class RoutingPolicyIn(Strict):
    """The policy a live run routes with from its next request on."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"policy": "dynamo_kv"}]})

    policy: RoutingPolicy


class DecisionCandidate(BaseModel):
    replica: int
    matched_blocks: int
    load: int
    score: float | None


class Decision(BaseModel):
    request: int = Field(description="the request's 0-based line in the trace")
    policy: str
    replicas: int
    capacity_tokens: int
    replica: int = Field(description="the 0-based replica that served it")
    rule: str = Field(description="what decided, in one word (docs/ROUTING.md#decisions)")
    why: str = Field(description="the policy's own sentence for it")
    candidates: list[DecisionCandidate]
    best_matched_blocks: int
    captured_tokens: int | None = Field(description="tokens it found cached where it was served")
    available_tokens: int | None = Field(description="tokens the best replica held for it")


class DecisionsOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "run": "r1", "policy": "sglang_cache_aware", "total": 2000, "offset": 0, "limit": 1,
        "decisions": [{"request": 0, "policy": "sglang_cache_aware", "replicas": 2,
                       "capacity_tokens": 1000000, "replica": 0, "rule": "low_match",
                       "why": "match 0% <= 0.3: least loaded", "candidates": [
                           {"replica": 0, "matched_blocks": 0, "load": 0, "score": None},
                           {"replica": 1, "matched_blocks": 0, "load": 0, "score": None}],
                       "best_matched_blocks": 0, "captured_tokens": 0, "available_tokens": 0}],
        "logs": [{"policy": "sglang_cache_aware", "decisions": 2000, "dropped": 0,
                  "by_rule": {"low_match": 800, "match": 1200}, "by_replica": [1010, 990],
                  "captured_tokens": 3100000, "available_tokens": 3300000}]}]})

    run: str
    policy: str | None
    total: int
    offset: int
    limit: int
    decisions: list[Decision]
    logs: list[dict]


class RoutingListOut(BaseModel):
    runs: list[dict] = Field(description="each run as GET /api/routing/{id} shows it")


class RoutingOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"routing": {"id": "r1", "state": "running", "mode": "sequence", "replicas": 4,
                     "capacity_tokens": 1000000, "limit": 2000, "policies": ["round_robin"],
                     "current": "round_robin", "done": 512, "total": 2000, "results": [],
                     "error": None}}]})

    routing: dict
