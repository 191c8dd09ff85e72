"""The routing lab: start / stop a run, switch a live run's policy, its decisions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from allocator.vocab import ROUTING_POLICIES, ROUTING_ROUTERS
from workloads.spec import MAX_SEED, MAX_TRACE_LIMIT

from .common import Strict

# The names come from the one vocabulary (allocator/vocab.py), which workloads/routing's
# registry is checked against.
RoutingPolicy = Literal[ROUTING_POLICIES]
ROUTING_RUN_ID_PATTERN = r"^r[0-9]{1,12}$"
ROUTING_SERVING_TOKENS = 1 << 28  # simulated KV over all replicas of a run the server makes
ROUTING_MAX_SPEED = 1e6
ROUTING_LIVE_REPLICAS = 16


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
