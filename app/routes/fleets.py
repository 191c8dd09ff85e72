"""Fleets: many engines mirrored at once into one prefix index; matches across them."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from pydantic import Field, model_validator

from allocator.errors import InvalidRequest, NotFound
from kvevents.index import MAX_FLEET_ENGINES

from ..deps import services_of
from ..fleets import FleetHandle, Fleets
from ..schemas import POOL_NAME_PATTERN, BindEndpoint, Endpoint, Strict, Topic

router = APIRouter(prefix="/api/fleets", tags=["fleets"])
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

    @model_validator(mode="after")
    def _some(self):
        if not self.engines and self.listen is None and self.nats is None:
            raise ValueError("give 'engines', 'listen' or 'nats' (or several)")
        return self


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


async def get_fleets(request: Request) -> Fleets:
    return services_of(request).fleets


FleetsDep = Annotated[Fleets, Depends(get_fleets)]
FleetName = Annotated[str, Path(pattern=POOL_NAME_PATTERN, description="fleet name")]


async def get_fleet(fleet: FleetName, fleets: FleetsDep) -> FleetHandle:
    return fleets.get(fleet)


FleetDep = Annotated[FleetHandle, Depends(get_fleet)]


@router.get("")
async def list_fleets(fleets: FleetsDep) -> dict:
    out = []
    for h in fleets:
        async with h.lock:
            out.append(h.fleet.summary())
    return {"fleets": out, "max_fleets": fleets.max_fleets, "max_engines": MAX_FLEET_ENGINES}


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_fleet(body: FleetCreate, fleets: FleetsDep) -> dict:
    """Start following every engine; 409 for a taken fleet name or an engine name given twice,
    422 past the engine limit. Engines that cannot be reached yet show `unreachable` and are
    retried with backoff."""
    handle = await fleets.create(body.name, [e.model_dump() for e in body.engines],
                                 listen=body.listen.model_dump() if body.listen else None,
                                 nats=body.nats.model_dump() if body.nats else None,
                                 max_engines=body.max_engines or MAX_FLEET_ENGINES)
    async with handle.lock:
        return handle.fleet.describe()


@router.get("/{fleet}")
async def get_fleet_state(handle: FleetDep, samples: Annotated[int, Query(ge=0, le=600)] = 120) -> dict:
    """Every engine (cached blocks, stream health and lag, block size, the engine's own
    /metrics), the fleet's figures, and the last `samples` of them (one a second)."""
    async with handle.lock:
        out = handle.fleet.describe()
        out["samples"] = list(handle.fleet.samples)[-samples:] if samples else []
    return out


@router.get("/{fleet}/blocks", response_class=Response,
            responses={200: {"content": {"application/json": {}}}})
async def fleet_blocks(handle: FleetDep) -> Response:
    """For the page's maps: per engine the colour group of each block it holds (docs/FLEET.md:
    the topmost block above it whose subtree holds at most 1/8 of the blocks; 0: the shared
    trunk above those), sorted so a group's blocks sit together, at most 65,536 per engine;
    the largest groups with the engine sets holding them; parent-hash cycles per engine.

    Under the fleet's lock only the index's arrays are copied; the layout and the JSON run in a
    worker thread, one computation per fleet at a time, shared by every client asking
    meanwhile, and kept while the index does not change."""
    return Response(await block_map(handle), media_type="application/json")


async def block_map(handle: FleetHandle) -> bytes:
    """The fleet's /blocks body: the kept one while the index is unchanged, else the one under
    way, else a new computation (whose snapshot is taken under the lock, on the loop)."""
    bm = handle.fleet.block_map
    task = bm.inflight
    if task is None and not bm.current(handle.fleet.index):
        # fresh buffers fault their pages in a worker, not in the copy under the lock
        await asyncio.to_thread(bm.reserve, handle.fleet.index.snapshot_sizes())
        task = bm.inflight
    if task is None:
        async with handle.lock:
            task = bm.inflight
            if task is None:
                if bm.current(handle.fleet.index):
                    return bm.body
                job = bm.snapshot(handle.fleet.index)
                task = bm.inflight = asyncio.get_running_loop().create_task(
                    asyncio.to_thread(bm.compute, job), name=f"fleet-{handle.name}-blocks")
                task.add_done_callback(lambda _t: setattr(bm, "inflight", None))
    return await asyncio.shield(task)


@router.delete("/{fleet}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_fleet(fleet: FleetName, fleets: FleetsDep) -> Response:
    await fleets.delete(fleet)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{fleet}/engines", status_code=status.HTTP_201_CREATED)
async def add_engine(body: EngineIn, fleet: FleetName, fleets: FleetsDep) -> dict:
    """Add an engine to a live fleet (409: name taken, or the fleet is full)."""
    await fleets.add_engine(fleet, body.model_dump())
    handle = fleets.get(fleet)
    async with handle.lock:
        return handle.fleet.describe()


@router.delete("/{fleet}/engines/{engine}", status_code=status.HTTP_204_NO_CONTENT)
async def remove_engine(fleet: FleetName, engine: Annotated[str, Path(max_length=80)],
                        fleets: FleetsDep) -> Response:
    await fleets.remove_engine(fleet, engine)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{fleet}/match")
async def match(body: MatchIn, handle: FleetDep) -> dict:
    """Each engine's longest cached prefix, in blocks, as Dynamo's `find_matches` scores it
    (0 for an engine holding none of it)."""
    async with handle.lock:
        index = handle.fleet.index
        if body.tokens is not None:
            if not set(handle.fleet.block_sizes().values()) - {None}:
                raise InvalidRequest("no engine's block size is known yet (none has stored a "
                                     "block, and none was given 'block_size')")
            engines = handle.fleet.match_tokens(body.tokens, body.lora_id)
        elif body.key is not None:
            if not index.chain_of(int(body.key, 16)):
                raise NotFound("block", body.key)
            engines = index.match_chain(int(body.key, 16))
        else:
            engines = index.match_engine_hashes(body.engine, [h & ((1 << 64) - 1) for h in body.block_hashes])
        return {"engines": engines, "block_sizes": handle.fleet.block_sizes()}
