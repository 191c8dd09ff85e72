"""Body-size cap as a pure-ASGI middleware: a request body above `max_body` bytes gets 413
(above a route's own cap for the few paths in `wider`: the recording upload)."""

from __future__ import annotations

import json

from .errors import ApiError, error_body


class BodyLimitMiddleware:
    """Refuses by Content-Length up front; counts streamed (chunked) bodies as they arrive."""

    def __init__(self, app, max_body: int, wider: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_body = max_body
        self.wider = wider or {}  # exact path -> its cap

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.wider.get(scope.get("path", ""), self.max_body)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _too_large(send, declared, limit)
                    return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, "too_large", f"request body exceeds {limit} bytes",
                                   {"max_bytes": limit})
            return message

        await self.app(scope, counted, send)


async def _too_large(send, declared: int, limit: int) -> None:
    body = json.dumps(error_body("too_large", f"request body of {declared} bytes exceeds {limit} bytes",
                                 {"max_bytes": limit, "declared_bytes": declared})).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
