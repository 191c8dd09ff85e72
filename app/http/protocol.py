"""uvicorn's h11 HTTP protocol with two additions for a server exposed to slow or hostile peers:

- a request-head timeout: a connection that has not sent a complete request head within
  HEAD_TIMEOUT_S of opening (or of its previous answer) is closed, so a handshake that never
  completes, or headers trickled a byte at a time, cannot hold a socket for ever (uvicorn's
  keep-alive timer is cancelled by any byte received);
- malformed HTTP (a bad request line, headers over the size cap) answered with the one JSON
  error shape (app/http/errors.py) instead of uvicorn's plain text.

Passed to uvicorn as `http=KVScopeH11Protocol` by app/cli/serve.py.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body

HEAD_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024  # request line + headers (uvicorn's h11_max_incomplete_event_size)


class KVScopeH11Protocol(H11Protocol):
    """H11Protocol plus the head timeout and JSON 400 (module docstring). The timer is armed
    when the connection opens and after each answer; it closes the connection only if h11
    is still waiting for a request head (`their_state` IDLE) when it fires."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(
            "bad_request", f"malformed HTTP request: {msg.rstrip('.')} (request line and headers "
            f"must be valid HTTP/1.1, at most {MAX_HEAD_BYTES} bytes)", {})).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        try:
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # h11 cannot answer in its state: just close
            pass
        self.transport.close()


# How `kvscope serve` runs uvicorn (app/cli/serve.py), beside host, port and log level.
SERVER_OPTIONS = dict(
    ws_per_message_deflate=False,
    http=KVScopeH11Protocol,  # request-head timeout, JSON answer to malformed HTTP
    h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    timeout_keep_alive=5,
    ws_max_size=64 * 1024,  # clients send nothing the server reads
    ws_ping_interval=20.0, ws_ping_timeout=20.0,
)
