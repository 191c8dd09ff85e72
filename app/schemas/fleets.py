"""Fleets: create one (engines, a listening endpoint, a NATS component), add an engine, match a
prompt across the fleet's engines."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kvevents.index import MAX_FLEET_ENGINES

from .common import POOL_NAME_PATTERN, BindEndpoint, Endpoint, Strict, Topic

MAX_MATCH_TOKENS = 1 << 20
MAX_MATCH_HASHES = 1 << 16

EngineName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$",
                                  examples=["vllm-0"])]


class EngineIn(Strict):
    """One engine of a fleet: where it publishes its KV events (its `--kv-events-config`)."""

    name: EngineName
    endpoint: Endpoint
    replay_endpoint: Endpoint | None = None
    topic: Topic = ""
    metrics_url: Annotated[str, Field(max_length=2048, pattern=r"^https?://\S+$")] | None = None
    num_blocks: Annotated[int, Field(ge=1, le=1 << 26)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    dp_rank: Annotated[int, Field(ge=0, le=1023)] = 0
    server: EngineName | None = Field(None, description="groups the DP ranks of one server "
                                      "given as separate endpoints (default: the engine's name)")
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    wire: Literal["vllm", "dynamo"] = Field(
        "vllm", description="vllm: vLLM's and SGLang's ZeroMQ publisher; dynamo: a Dynamo "
                            "worker's event plane over ZeroMQ (its PUB endpoint, from Dynamo's "
                            "discovery; block_size: its kv block size)")


class ListenIn(Strict):
    """Bind one endpoint that every engine's PUB connects to, as llm-d's indexer does; each
    topic `kv@<pod>@<model>` is an engine. Binds loopback unless another interface is named
    (`tcp://0.0.0.0:5557`): ZeroMQ has no authentication, so any host reaching the port can
    publish into the fleet."""

    endpoint: BindEndpoint = "tcp://127.0.0.1:5557"
    topic: Topic = "kv@"
    replay_endpoint: Endpoint | None = Field(
        None, description="each pod's replay endpoint as seen from here, `{pod}` standing for "
                          "the pod's name, e.g. tcp://{pod}.vllm:5558 (default: none, gaps "
                          "are counted lost)")
    num_blocks: Annotated[int, Field(ge=1, le=1 << 26)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None


SubjectToken = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$", examples=["dynamo"])]


class NatsIn(Strict):
    """Follow a Dynamo component's KV events on NATS core (workers started with
    DYN_EVENT_PLANE=nats): every worker is an engine. Credentials are the server's own
    (KVSCOPE_NATS_TOKEN, KVSCOPE_NATS_USER and KVSCOPE_NATS_PASSWORD, KVSCOPE_NATS_CREDS, or
    their _FILE forms), never part of a request."""

    url: Annotated[str, Field(max_length=256, pattern=r"^(nats|tls)://[^\s/@]+:\d{1,5}$",
                              examples=["nats://127.0.0.1:4222"])]
    namespace: SubjectToken
    component: SubjectToken
    subject: Annotated[str, Field(pattern=r"^[A-Za-z0-9_*>.-]{1,256}$")] | None = Field(
        None, description="instead of Dynamo's subjects, namespace.{ns}.component.{comp}"
                          "[.endpoint.*].kv-events")
    num_blocks: Annotated[int, Field(ge=1, le=1 << 26)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16, description="the workers' kv block size "
                                     "(to match prompts by their tokens)")] | None = None


class FleetCreate(Strict):
    name: Annotated[str, Field(pattern=POOL_NAME_PATTERN, examples=["demo"])]
    engines: Annotated[list[EngineIn], Field(max_length=MAX_FLEET_ENGINES,
                                             description=f"at most {MAX_FLEET_ENGINES}")] = []
    listen: ListenIn | None = None
    nats: NatsIn | None = None
    max_engines: Annotated[int, Field(ge=1, le=MAX_FLEET_ENGINES, description=(
        "the most engines the fleet takes (default and at most "
        f"{MAX_FLEET_ENGINES}); a listening fleet refuses pods past it"))] | None = None


class MatchIn(Strict):
    """A prompt's token ids, a chain of one engine's own block hashes, or the chain down to an
    indexed block `key` (as `recent_chains` name them)."""

    tokens: Annotated[list[Annotated[int, Field(ge=0, lt=1 << 63)]],
                      Field(max_length=MAX_MATCH_TOKENS)] | None = None
    block_hashes: Annotated[list[Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)]],
                            Field(max_length=MAX_MATCH_HASHES)] | None = None
    engine: EngineName | None = None
    key: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")] | None = None
    lora_id: Annotated[int, Field(ge=0, lt=1 << 63)] | None = None

    @model_validator(mode="after")
    def _one(self):
        if sum(x is not None for x in (self.tokens, self.block_hashes, self.key)) != 1:
            raise ValueError("give exactly one of 'tokens', 'block_hashes' or 'key'")
        if self.block_hashes is not None and self.engine is None:
            raise ValueError("'block_hashes' are one engine's own: name it in 'engine'")
        return self
