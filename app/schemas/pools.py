"""Pools: create (with their cache, prefix caching, mirror and publish options), list, inspect,
stats, reset, check, defragment, the cache's policy, events and the block map."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from allocator.vocab import PREFIX_POLICIES, STRATEGY_INFO

from ..settings import DEVICE_PATTERN
from .common import (
    MAX_BYTES,
    BindEndpoint,
    Endpoint,
    Fit,
    Policy,
    PoolName,
    Strategy,
    Strict,
    Topic,
    exactly_one,
)


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
        exactly_one(self, "num_blocks", "capacity_bytes")
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
    """The metrics of docs/ALLOCATOR.md (Metrics). Strategy-specific extras (`fit`, `tiers`) pass through."""

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
