"""HEAD on every GET route, as a pure-ASGI middleware: the request runs as a GET and the answer
keeps its status and headers (Content-Length included) but sends no body.

FastAPI's routes answer only the methods they name; doing it here covers every GET route,
present or future, without naming HEAD on each.
"""

from __future__ import annotations


class HeadMiddleware:
    """Runs HEAD as GET and drops the body bytes (each body message is forwarded empty)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_body)
