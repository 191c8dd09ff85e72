"""The routers' query APIs over a fleet: Dynamo's standalone indexer and llm-d's pod scores.

Dynamo's `python -m dynamo.indexer` serves its routes at the root of its port; a fleet serves
the same routes, with the same JSON, under `/api/fleets/{fleet}/dynamo`: a script or router
that calls Dynamo's indexer at a base URL calls kvscope unchanged with the base URL
`http://HOST:PORT/api/fleets/{fleet}/dynamo` (and, when the server has a token, its
`Authorization: Bearer` header). Dynamo's request bodies ignore fields they do not know; so do
these. llm-d's `GetPodScores` is `POST /api/fleets/{fleet}/llm-d/pod-scores`.

Every request's work is bounded before it starts: at most MAX_QUERY_TOKENS token ids (what fits
Dynamo's own 8 MiB /query body), MAX_QUERY_HASHES hashes (app/schemas/fleet_query.py), a dump of
at most MAX_DUMP_BLOCKS.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from allocator.errors import InvalidRequest, NotFound
from kvevents import query as q
from kvevents import tiers

from ..deps import FleetDep, FleetName, FleetsDep
from ..schemas import DynamoQuery, DynamoQueryByHash, DynamoRegister, DynamoUnregister, PodScoresIn

router = APIRouter(prefix="/api/fleets", tags=["fleet queries"])

QUERY_EXAMPLE = {"scores": {"11": {"0": 48}}, "frequencies": [],
                 "instances": {"11": {"longest_matched": 48, "gpu": 48, "dp": {"0": 48}, "cpu": 48, "disk": 48}}}
ANSWERS = {200: {"content": {"application/json": {"example": QUERY_EXAMPLE}}}}


def _query_checks(body) -> None:
    if body.cache_salt is not None:
        raise InvalidRequest("cache_salt is not supported here: the fleet keys blocks without "
                             "Dynamo's cache namespaces")


@router.post("/{fleet}/dynamo/query", responses=ANSWERS)
async def dynamo_query(body: DynamoQuery, handle: FleetDep) -> dict:
    """Dynamo's `/query`: per instance and DP rank, the tokens of the prompt's longest cached
    prefix (blocks matched x block size), as Dynamo's standalone indexer answers on the same
    events; `instances` in Mooncake's per-tier shape. 404: no engine serves `model_name`."""
    _query_checks(body)
    async with handle.lock:
        return q.dynamo_query(handle.fleet, body.token_ids, body.model_name, body.routing_group, body.lora_name)


@router.post("/{fleet}/dynamo/query_by_hash", responses=ANSWERS)
async def dynamo_query_by_hash(body: DynamoQueryByHash, handle: FleetDep) -> dict:
    """Dynamo's `/query_by_hash`: the same for a chain of Dynamo's block hashes (tokens_hash),
    on the engines keyed by them (Dynamo's wire); 422 when the fleet has none."""
    if body.cache_salt is not None:
        raise InvalidRequest("cache_salt is not accepted by query_by_hash; block_hashes must "
                             "already include the intended cache salt")
    async with handle.lock:
        return q.dynamo_query_by_hash(handle.fleet, body.block_hashes, body.model_name, body.routing_group)


@router.get("/{fleet}/dynamo/workers")
async def dynamo_workers(handle: FleetDep, model_name: Annotated[str | None, Query(max_length=256)] = None,
                         routing_group: Annotated[str | None, Query(max_length=256)] = None,
                         tenant_id: Annotated[str | None, Query(max_length=256)] = None) -> list[dict]:
    """Dynamo's `/workers`: one entry per instance (`instance_id`, `status`, `model_name`,
    `block_size`, `endpoints` and `listeners` per DP rank)."""
    async with handle.lock:
        return q.dynamo_workers(handle.fleet, model_name, routing_group)


@router.get("/{fleet}/dynamo/dump", response_class=Response,
            responses={200: {"content": {"application/json": {"example": {"default:default": {
                "block_size": 16, "events": ["RouterEvent ..."]}}}}}})
async def dynamo_dump(handle: FleetDep) -> Response:
    """Dynamo's `/dump`: every engine's blocks as Dynamo's stored RouterEvents, per
    `model:routing_group`, parents first (`tokens_hash` is the index's content key of the
    block). 413 past 262,144 held blocks. Copied under the fleet's lock, written in a worker."""
    async with handle.lock:
        job = q.dump_snapshot(handle.fleet)
    return Response(await asyncio.to_thread(q.dump_bytes, job), media_type="application/json")


@router.post("/{fleet}/dynamo/register", status_code=status.HTTP_201_CREATED)
async def dynamo_register(body: DynamoRegister, fleet: FleetName, fleets: FleetsDep) -> dict:
    """Dynamo's `/register`: follow a worker's engine-side publisher as engine `{instance_id}`
    (`{instance_id}:dp{rank}` for another rank), serving `model_name`. 409: already followed."""
    if body.routing_group != q.DEFAULT_GROUP:
        raise InvalidRequest(f"routing_group {body.routing_group!r}: a fleet is one routing group "
                             f"({q.DEFAULT_GROUP!r}); make a fleet per group")
    rank = body.dp_rank or 0
    name = str(body.instance_id) if rank == 0 else f"{body.instance_id}:dp{rank}"
    await fleets.add_engine(fleet, {"name": name, "endpoint": body.endpoint,
                                    "replay_endpoint": body.replay_endpoint, "model": body.model_name,
                                    "block_size": body.block_size, "dp_rank": rank,
                                    "server": str(body.instance_id)})
    return {"status": "ok"}


@router.post("/{fleet}/dynamo/unregister")
async def dynamo_unregister(body: DynamoUnregister, fleet: FleetName, fleets: FleetsDep) -> dict:
    """Dynamo's `/unregister`: stop following an instance (one DP rank with `dp_rank`)."""
    handle = fleets.get(fleet)
    async with handle.lock:
        ids = handle.fleet.identities()
        specs = set(handle.fleet.specs)
    gone = [n for n, (w, r, m) in ids.items() if w == body.instance_id and m in (None, body.model_name)
            and (body.dp_rank is None or r == body.dp_rank)]
    if not gone or body.routing_group not in (None, q.DEFAULT_GROUP):
        raise NotFound("instance", body.instance_id)
    for name in sorted(gone, key=lambda n: n not in specs):  # the specs first: they take their ranks along
        try:
            await fleets.remove_engine(fleet, name)
        except NotFound:
            pass  # another rank of a spec removed just before
    return {"status": "ok"}


@router.get("/{fleet}/dynamo/health")
async def dynamo_health(handle: FleetDep) -> dict:
    """Dynamo's `/health`: 200 while the fleet exists."""
    return {}


@router.post("/{fleet}/llm-d/pod-scores")
async def llmd_pod_scores(body: PodScoresIn, handle: FleetDep) -> dict[str, float]:
    """llm-d's `GetPodScores` (ScoreTokens): `{pod: score}`, each engine's longest cached
    prefix of the prompt from block 0 on any tier, each block weighted by the best tier it
    holds it in (`weights`; llm-d's default gpu 1.0, cpu 0.8). Pods not holding its first
    block are left out. 422: a weight for no tier, two for one tier."""
    try:
        weights = None if body.weights is None else tiers.weights_of(body.weights)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if body.prompt is not None:
        raise InvalidRequest("prompt: kvscope has no tokenizer of the model; tokenize the prompt "
                             "and send its token ids as 'tokens' (llm-d's ScoreTokens)")
    if body.tokens is None:
        raise InvalidRequest("give the prompt's token ids as 'tokens'")
    async with handle.lock:
        return q.llmd_scores(handle.fleet, body.tokens, body.model_name, set(body.pod_identifiers), weights)
