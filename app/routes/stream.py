"""WS /ws/pools/{pool}: hello, snapshot, then deltas, events, stats and order (docs/STREAM.md).

Host, Origin and the token are checked before this runs (app/http/security.py). Here: the client
caps (close 1013 with the reason when full) and the stall rule: a client whose socket stays
unwritable for `stall_s` is dropped (close 1008), its queue released.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import socket
import struct

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..deps import services_of
from ..http.security import CLOSE_TOKEN_MISSING, CLOSE_TOKEN_WRONG  # noqa: F401  (re-exported)
from ..stream import Client, Hub, PoolStream

router = APIRouter(tags=["stream"])

CLOSE_UNKNOWN_POOL = 4404
CLOSE_TRY_LATER = 1013  # RFC 6455 "try again later": the client caps are reached
CLOSE_TOO_SLOW = 1008  # policy violation: the client did not read for `stall_s`


_LIBC = None


def give_back_memory() -> None:
    """Return freed heap pages to the OS (glibc `malloc_trim`): a dropped client's megabytes of
    frames are free in the allocator, but RSS would otherwise keep them. No-op elsewhere."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


class Stalled(Exception):
    """The client's socket stayed unwritable for the hub's `stall_s`."""


async def _send_loop(ws: WebSocket, client: Client, stall_s: float) -> None:
    while True:
        msg = await client.get()
        if msg is None:
            await ws.close(1000)
            return
        send = ws.send_text(msg) if isinstance(msg, str) else ws.send_bytes(msg)
        try:
            await asyncio.wait_for(send, stall_s)
        except TimeoutError:
            raise Stalled from None


@router.websocket("/ws/pools/{pool}")
async def pool_stream(ws: WebSocket, pool: str) -> None:
    services = services_of(ws)
    hub: Hub = services.hub
    await ws.accept()
    handle = services.registry.find(pool)
    stream: PoolStream | None = handle.stream if handle is not None else None
    if stream is None:
        await ws.close(CLOSE_UNKNOWN_POOL, "unknown pool")
        return
    refusal = hub.refusal(stream)
    if refusal is not None:
        await ws.close(CLOSE_TRY_LATER, refusal[:120])  # a close reason is at most 123 bytes
        return
    async with handle.lock:  # a worker thread may hold the pool: the snapshot waits for it
        client = stream.join()
    sender = asyncio.create_task(_send_loop(ws, client, hub.stall_s))
    receiver = asyncio.create_task(_drain(ws))
    try:
        await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.leave(client)
        client.clear()  # release what it had queued now, not when the socket goes
        for task in (sender, receiver):
            task.cancel()
            # A send on a socket the peer already closed fails; that only ends this client.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if sender.done() and not sender.cancelled() and isinstance(sender.exception(), Stalled):
        drop(ws, hub.stall_s)


def drop(ws: WebSocket, stall_s: float) -> None:
    """End a client that stopped reading, releasing what its socket buffers hold now.

    NOTE: a close frame cannot reach a peer that does not read: the websocket library would wait
    for its close timeout (10 s, then as long again for the TCP close) with the buffer full. So
    the transport is aborted when the server exposes it (uvicorn: app/http/security.py puts it in
    the scope); otherwise the close is left to run in the background."""
    transport = ws.scope.get("kvscope.transport")
    if transport is not None and hasattr(transport, "abort"):
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a FIN queued behind megabytes the peer won't read
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        asyncio.get_running_loop().call_later(1.0, give_back_memory)
        return
    task = asyncio.get_running_loop().create_task(
        ws.close(CLOSE_TOO_SLOW, f"not reading: send buffer full for {stall_s:g} s"))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def _drain(ws: WebSocket) -> None:
    """Read (and ignore) what the client sends, so a disconnect is noticed at once."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
