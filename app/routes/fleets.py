"""Fleets: many engines mirrored at once into one prefix index; matches across them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from .. import fleet_ops
from ..deps import FleetDep, FleetName, FleetsDep
from ..fleet_params import EngineQueryDep, MapQueryDep
from ..schemas import EngineIn, FleetCreate, MatchIn

router = APIRouter(prefix="/api/fleets", tags=["fleets"])


@router.get("")
async def list_fleets(fleets: FleetsDep) -> dict:
    return await fleet_ops.listing(fleets)


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_fleet(body: FleetCreate, fleets: FleetsDep) -> dict:
    """Start following every engine; 409 for a taken fleet name or an engine name given twice,
    422 past the engine limit. Engines that cannot be reached yet show `unreachable` and are
    retried with backoff."""
    return await fleet_ops.create(fleets, body.name, [e.model_dump() for e in body.engines],
                                  listen=body.listen.model_dump() if body.listen else None,
                                  nats=body.nats.model_dump() if body.nats else None,
                                  max_engines=body.max_engines)


@router.get("/{fleet}")
async def get_fleet_state(handle: FleetDep, view: EngineQueryDep,
                          samples: Annotated[int, Query(ge=0, le=600)] = 120) -> dict:
    """A page of its engines (cached blocks, stream health and lag, block size, the engine's
    own /metrics; the first 64 unless `engines_*` ask otherwise), the page of their servers
    (`groups`), a `summary` of every engine, the fleet's figures, and the last `samples` of
    them (one a second)."""
    return await fleet_ops.state(handle, samples, view)


@router.get("/{fleet}/blocks", response_class=Response,
            responses={200: {"content": {"application/json": {}}}})
async def fleet_blocks(handle: FleetDep, only: MapQueryDep) -> Response:
    """For the page's maps: per engine (every engine, or those `engines` names or the
    `engines_*` page and search select) the colour group of each block it holds (docs/FLEET.md:
    the topmost block above it whose subtree holds at most 1/8 of the blocks; 0: the shared
    trunk above those), sorted so a group's blocks sit together, at most 65,536 per engine;
    the largest groups with the engine sets holding them; parent-hash cycles per engine.

    Under the fleet's lock only the index's arrays are copied; the layout and the JSON run in a
    worker thread, one computation per fleet at a time, shared by every client asking
    meanwhile, and kept while the index does not change."""
    return Response(await fleet_ops.maps_of(handle, only), media_type="application/json")


@router.delete("/{fleet}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_fleet(fleet: FleetName, fleets: FleetsDep) -> Response:
    await fleets.delete(fleet)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{fleet}/engines", status_code=status.HTTP_201_CREATED)
async def add_engine(body: EngineIn, fleet: FleetName, fleets: FleetsDep) -> dict:
    """Add an engine to a live fleet (409: name taken, or the fleet is full)."""
    return await fleet_ops.add_engine(fleets, fleet, body.model_dump())


@router.delete("/{fleet}/engines/{engine}", status_code=status.HTTP_204_NO_CONTENT)
async def remove_engine(fleet: FleetName, engine: Annotated[str, Path(max_length=80)],
                        fleets: FleetsDep) -> Response:
    await fleets.remove_engine(fleet, engine)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{fleet}/match")
async def match(body: MatchIn, handle: FleetDep) -> dict:
    """Each engine's longest cached prefix, in blocks, as Dynamo's `find_matches` scores it
    (0 for an engine holding none of it)."""
    return await fleet_ops.match(handle, tokens=body.tokens, key=body.key, engine=body.engine,
                                 block_hashes=body.block_hashes, lora_id=body.lora_id)
