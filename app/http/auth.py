"""Bearer-token auth: when `KVSCOPE_TOKEN` is set (or generated, app/cli/serve.py), every request to
`/api/...` and `/ws/...` needs it; only the pages, `/healthz`, `/metrics` and the static files
stay open (`PUBLIC_PATHS`). Checked by app/http/security.py for every route, so a new route is gated
unless it is added here on purpose (tests/app/test_api_auth.py enumerates the router).

REST and websocket compare the token the same way (`token_problem`): surrounding whitespace is
ignored, an empty value counts as missing (401 / close 4401), anything else that differs is
wrong (403 / close 4403), compared in constant time on the UTF-8 bytes.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from ..deps import services_of
from .errors import ApiError

MUTATING = frozenset({"POST", "PUT", "DELETE", "PATCH"})

# Paths answered without the token: they reveal no keys, no stored bytes, no allocations.
PUBLIC_PATHS = frozenset({"/", "/docs", "/openapi.json", "/healthz", "/metrics"})
PUBLIC_PREFIXES = ("/static/",)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def presented_token(authorization: str | None, query_token: str | None = None) -> str | None:
    """The token a request presents: the Authorization header's Bearer value, else `?token=`.
    None when neither carries one (an empty value is none); "" for another auth scheme."""
    if authorization and authorization.strip():
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return ""
        return value.strip() or None
    if query_token is not None:
        return query_token.strip() or None
    return None


def token_problem(expected: str | None, authorization: str | None, query_token: str | None = None) -> int:
    """0 when allowed, else the HTTP status to refuse with (401 missing or empty, 403 wrong)."""
    if not expected:
        return 0
    given = presented_token(authorization, query_token)
    if given is None:
        return 401
    return 0 if hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode()) else 403


def token_error(status: int) -> ApiError:
    if status == 401:
        return ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
    return ApiError(403, "forbidden", "wrong bearer token")


async def check_token(request: Request) -> None:
    """Refuse the request unless it carries the token (when one is set). Raises ApiError 401/403."""
    status = token_problem(services_of(request).settings.token, request.headers.get("authorization"))
    if status:
        raise token_error(status)
