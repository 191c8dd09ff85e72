"""Fleet operations: what the fleet routes (app/routes/fleets.py) do, each under the fleet's lock
for as long as it reads or changes the fleet, answering in the one shape its route returns.

A route parses its body (app/schemas/fleets.py), resolves the fleet (app/deps.py `FleetDep`) and
calls one function here; the fleets themselves (create, delete, engines, the sampling task) are
app/fleets.py's.
"""

from __future__ import annotations

import asyncio

from allocator.errors import InvalidRequest, NotFound
from kvevents.block_map import Maps
from kvevents.fleet_view import EngineQuery, page_names
from kvevents.index import MAX_FLEET_ENGINES

from .fleets import FleetHandle, Fleets

U64 = (1 << 64) - 1


async def listing(fleets: Fleets) -> dict:
    """Every fleet's summary, and the server's limits."""
    out = []
    for h in fleets:
        async with h.lock:
            out.append(h.fleet.summary())
    return {"fleets": out, "max_fleets": fleets.max_fleets, "max_engines": MAX_FLEET_ENGINES}


async def describe(handle: FleetHandle) -> dict:
    """The first page of its engines (cached blocks, stream health and lag, block size, its
    /metrics) and of its servers, the summary of every engine, and the fleet's figures."""
    async with handle.lock:
        return handle.fleet.describe()


async def state(handle: FleetHandle, samples: int, query: EngineQuery | None = None) -> dict:
    """`describe` with the page of engines and servers `query` asks for (default: the first
    64 of each, `kvevents.fleet_view`), and the fleet's last `samples` samples (one a second)."""
    async with handle.lock:
        out = handle.fleet.describe(query)
        out["samples"] = list(handle.fleet.samples)[-samples:] if samples else []
    return out


async def create(fleets: Fleets, name: str, engines: list[dict], listen: dict | None = None,
                 nats: dict | None = None, max_engines: int | None = None) -> dict:
    """Start the fleet (`Fleets.create`); it as `describe` shows it."""
    handle = await fleets.create(name, engines, listen=listen, nats=nats,
                                 max_engines=max_engines or MAX_FLEET_ENGINES)
    return await describe(handle)


async def add_engine(fleets: Fleets, name: str, engine: dict) -> dict:
    """Add an engine to the live fleet `name`; the fleet as `describe` shows it."""
    await fleets.add_engine(name, engine)
    return await describe(fleets.get(name))


async def match(handle: FleetHandle, tokens: list[int] | None = None, key: str | None = None,
                engine: str | None = None, block_hashes: list[int] | None = None,
                lora_id: int | None = None) -> dict:
    """Each engine's longest cached prefix, in blocks, of the prompt `tokens`, of the chain down
    to the indexed block `key` (16 hex digits), or of `engine`'s own `block_hashes` (signed or
    unsigned 64-bit). Raises InvalidRequest (no block size known for tokens), NotFound (key)."""
    async with handle.lock:
        index = handle.fleet.index
        if tokens is not None:
            if not set(handle.fleet.block_sizes().values()) - {None}:
                raise InvalidRequest("no engine's block size is known yet (none has stored a "
                                     "block, and none was given 'block_size')")
            engines = handle.fleet.match_tokens(tokens, lora_id)
        elif key is not None:
            if not index.chain_of(int(key, 16)):
                raise NotFound("block", key)
            engines = index.match_chain(int(key, 16))
        else:
            engines = index.match_engine_hashes(engine, [h & U64 for h in block_hashes])
        return {"engines": engines, "block_sizes": handle.fleet.block_sizes()}


async def maps_of(handle: FleetHandle, only: EngineQuery | None = None) -> bytes:
    """The /blocks body: every engine's maps, or (`only`) those of the engines it selects, cut
    from the same answer (`Maps.only`)."""
    maps = await block_map(handle)
    if only is None:
        return maps.body
    async with handle.lock:
        names = page_names(handle.fleet.engines(), only)
    return maps.only(names)


async def block_map(handle: FleetHandle) -> Maps:
    """The fleet's /blocks body: the kept one while the index is unchanged, else the one under
    way, else a new computation (whose snapshot is taken under the lock, on the loop; the layout
    and the JSON run in a worker thread, one computation per fleet at a time, shared by every
    client asking meanwhile)."""
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
                    return bm.maps
                job = bm.snapshot(handle.fleet.index)
                task = bm.inflight = asyncio.get_running_loop().create_task(
                    asyncio.to_thread(bm.compute, job), name=f"fleet-{handle.name}-blocks")
                task.add_done_callback(lambda _t: setattr(bm, "inflight", None))
    return await asyncio.shield(task)
