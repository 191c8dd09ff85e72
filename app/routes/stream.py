"""WS /ws/pools/{pool}: hello, snapshot, then deltas, events, stats and order (docs/STREAM.md)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..auth import token_problem
from ..stream import Client, PoolStream

router = APIRouter(tags=["stream"])

CLOSE_TOKEN_MISSING = 4401
CLOSE_TOKEN_WRONG = 4403
CLOSE_UNKNOWN_POOL = 4404


async def _send_loop(ws: WebSocket, client: Client) -> None:
    while True:
        msg = await client.get()
        if msg is None:
            await ws.close(1000)
            return
        if isinstance(msg, str):
            await ws.send_text(msg)
        else:
            await ws.send_bytes(msg)


@router.websocket("/ws/pools/{pool}")
async def pool_stream(ws: WebSocket, pool: str) -> None:
    settings = ws.app.state.settings
    await ws.accept()
    problem = token_problem(settings.token, ws.headers.get("authorization"), ws.query_params.get("token"))
    if problem:
        await ws.close(CLOSE_TOKEN_MISSING if problem == 401 else CLOSE_TOKEN_WRONG,
                       "token required" if problem == 401 else "wrong token")
        return
    handle = ws.app.state.registry.find(pool)
    stream: PoolStream | None = handle.stream if handle is not None else None
    if stream is None:
        await ws.close(CLOSE_UNKNOWN_POOL, "unknown pool")
        return
    client = stream.join()
    sender = asyncio.create_task(_send_loop(ws, client))
    receiver = asyncio.create_task(_drain(ws))
    try:
        await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.leave(client)
        for task in (sender, receiver):
            task.cancel()
            # A send on a socket the peer already closed fails; that only ends this client.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _drain(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends, so a disconnect is noticed at once."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
