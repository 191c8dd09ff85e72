"""Against a real `kvscope serve` (uvicorn): malformed HTTP gets the JSON error shape, a request
head that never completes is cut off, a stalled stream client is dropped and its slot freed,
and listening beyond loopback generates a token."""

from __future__ import annotations

import base64
import json
import os
import socket
import time

import httpx
import pytest
from support.apputil import Server
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect


def raw_exchange(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
    return out


def body_of(response: bytes) -> dict:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"application/json" in head, head
    return json.loads(body)


@pytest.fixture(scope="module")
def hardened():
    # the stall limit leaves a loaded machine time to see the stalled client holding its slot
    srv = Server(env={"KVSCOPE_HEAD_TIMEOUT_MS": "800", "KVSCOPE_STREAM_STALL_MS": "5000",
                      "KVSCOPE_MAX_STREAM_CLIENTS_PER_POOL": "1"})
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
])
def test_malformed_http_gets_the_json_error_shape(hardened, request_bytes):
    response = raw_exchange(hardened.port, request_bytes)
    assert response.startswith(b"HTTP/1.1 400"), response[:200]
    error = body_of(response)["error"]
    assert error["code"] == "bad_request" and "malformed HTTP request" in error["message"]


def test_oversized_headers_are_refused_in_the_json_shape(hardened):
    big = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    response = raw_exchange(hardened.port, big)
    assert response.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), response[:200]
    assert body_of(response)["error"]["code"] in ("headers_too_large", "bad_request")
    with socket.create_connection(("127.0.0.1", hardened.port), timeout=5) as s:  # arriving in pieces
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
        try:
            for _ in range(40):
                s.sendall(b"a" * 1000)
                time.sleep(0.002)
            s.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the rest was sent: its answer is in the receive buffer
        response = s.recv(65536)
    assert response.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), response[:200]


def test_a_request_head_that_never_completes_is_cut_off(hardened):
    with socket.create_connection(("127.0.0.1", hardened.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
        started = time.monotonic()
        assert s.recv(100) == b"", "the server closed the connection"
        assert time.monotonic() - started < 9, "closed by the head timeout, not by the test's own"
    # a complete request on a fresh connection is answered as usual
    assert httpx.get(hardened.url + "/healthz").status_code == 200


def ws_handshake(port: int, path: str) -> socket.socket:
    """A websocket client that completes the handshake and then never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    # Read the 101 answer and the first bytes of the hello frame, no more: the hello is sent
    # only once the server has counted this client, so its slot is taken from here on.
    s.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got or got.endswith(b"\r\n\r\n"):
        chunk = s.recv(64)
        assert chunk, f"the server closed the handshake: {got!r}"
        got += chunk
    assert got.startswith(b"HTTP/1.1 101"), got
    return s


def test_a_stalled_stream_client_is_dropped_and_frees_its_slot(hardened):
    # a 2M-block pool: its snapshot (~10 MB) is more than the socket buffers hold
    r = httpx.post(hardened.url + "/api/pools", json={"name": "big", "num_blocks": 1 << 21, "block_bytes": 16})
    assert r.status_code == 201, r.text
    stalled = ws_handshake(hardened.port, "/ws/pools/big")
    try:
        # the one slot of this pool is taken: a second client is told to come back later
        assert close_code(f"{hardened.ws_url}/ws/pools/big") == 1013
        # once the stalled one has been dropped (5 s unwritable), the slot is free again
        deadline = time.monotonic() + 60
        while True:
            first = first_message(f"{hardened.ws_url}/ws/pools/big")
            if first is not None:
                assert json.loads(first)["type"] == "hello"
                break
            assert time.monotonic() < deadline, "the stalled client still holds its slot"
            time.sleep(0.5)
        # and its socket was reset, not left holding megabytes in the server's buffers
        stalled.settimeout(10)
        with pytest.raises(ConnectionResetError):
            while stalled.recv(1 << 20):
                pass
    finally:
        stalled.close()
        httpx.delete(hardened.url + "/api/pools/big")


def first_message(url: str) -> str | bytes | None:
    """The first message a websocket at `url` sends; None if it is refused (closed with 1013,
    or the connection dropped while the server was busy) so that the caller tries again."""
    try:
        with connect(url, open_timeout=10, max_size=None) as ws:
            return ws.recv(timeout=10)
    except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError):
        return None


def close_code(url: str) -> int | None:
    """The close code a websocket at `url` ends with before sending anything; None if it sends."""
    with connect(url, open_timeout=10) as ws:
        try:
            ws.recv(timeout=30)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    return None


def test_listening_beyond_loopback_generates_a_token():
    srv = Server(env={"KVSCOPE_TOKEN": ""}, args=("--host", "0.0.0.0"))
    try:
        assert httpx.get(srv.url + "/healthz").status_code == 200
        assert httpx.get(srv.url + "/api/pools").status_code == 401
        assert close_code(f"{srv.ws_url}/ws/pools/default") == 4401
    finally:
        log = srv.stop()
    lines = [x for x in log.splitlines() if "?token=" in x]
    assert lines, log
    token = lines[0].rsplit("?token=", 1)[1].strip()
    assert len(token) >= 24
