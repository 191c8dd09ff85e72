"""The routers' query APIs over a fleet (app/routes/fleet_query.py): Dynamo's standalone indexer's
bodies (unknown fields ignored, as serde does) and llm-d's GetPodScores."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kvevents import query as q

from .common import Endpoint

MAX_QUERY_TOKENS = 1 << 20
MAX_QUERY_HASHES = 1 << 16
MAX_PODS = 4096

Token = Annotated[int, Field(ge=0, lt=1 << 32)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Group = Annotated[str, Field(max_length=256)]


class DynamoBody(BaseModel):
    """Dynamo's request bodies: unknown fields ignored (as serde does), types not coerced."""

    model_config = ConfigDict(extra="ignore", strict=True)


class DynamoQuery(DynamoBody):
    token_ids: Annotated[list[Token], Field(max_length=MAX_QUERY_TOKENS,
                                            description=f"the prompt's token ids (u32; at most {MAX_QUERY_TOKENS:,})")]
    model_name: Name
    routing_group: Group = q.DEFAULT_GROUP
    tenant_id: Group | None = Field(None, description="accepted and ignored, as Dynamo 1.6 does")
    lora_name: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="the LoRA adapter, mixed into Dynamo's block hash (engines keyed by "
                          "Dynamo's tokens_hash only)")
    cache_salt: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="not supported: refused with 422")


class DynamoQueryByHash(DynamoBody):
    block_hashes: Annotated[list[Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)]],
                            Field(max_length=MAX_QUERY_HASHES,
                                  description="Dynamo's block hashes (tokens_hash chain), i64 or u64")]
    model_name: Name
    routing_group: Group = q.DEFAULT_GROUP
    tenant_id: Group | None = None
    cache_salt: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="refused, as Dynamo does: the hashes already carry it")


class DynamoRegister(DynamoBody):
    """A worker's engine-side ZeroMQ publisher (vLLM's or SGLang's wire), as Dynamo's indexer
    registers it: the fleet follows it as engine `{instance_id}` (`{instance_id}:dp{rank}`)."""

    instance_id: Annotated[int, Field(ge=0, lt=1 << 64)]
    endpoint: Endpoint
    model_name: Name
    block_size: Annotated[int, Field(ge=1, le=1 << 16)]
    dp_rank: Annotated[int, Field(ge=0, le=1023)] | None = None
    replay_endpoint: Endpoint | None = None
    routing_group: Group = q.DEFAULT_GROUP
    tenant_id: Group | None = None


class DynamoUnregister(DynamoBody):
    instance_id: Annotated[int, Field(ge=0, lt=1 << 64)]
    model_name: Name
    routing_group: Group | None = None
    tenant_id: Group | None = None
    dp_rank: Annotated[int, Field(ge=0, le=1023)] | None = None


class PodScoresIn(BaseModel):
    """llm-d's GetPodScores / ScoreTokens: the prompt as token ids (kvscope has no tokenizer of
    the model, so a text `prompt` is refused), the model, and the pods to score (none: all)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    tokens: Annotated[list[Token], Field(max_length=MAX_QUERY_TOKENS)] | None = None
    prompt: Annotated[str, Field(max_length=1 << 20)] | None = Field(
        None, description="refused with 422: tokenize with the model's tokenizer and send `tokens`")
    model_name: Name | None = None
    pod_identifiers: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=MAX_PODS)] = []
    weights: Annotated[dict[Annotated[str, Field(max_length=32)], Annotated[float, Field(ge=0, le=1e6)]],
                       Field(max_length=16, description="per tier: gpu, cpu, disk, external (or a medium "
                             "naming one: vLLM's GPU / CPU / STORAGE, Dynamo's device / host_pinned); "
                             "llm-d's default gpu 1.0, cpu 0.8; a tier not named weighs 1.0")] | None = None
