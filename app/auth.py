"""Bearer-token auth: required on mutating calls and the websocket when `KVSCOPE_TOKEN` is set.

Mutating calls are every POST/PUT/DELETE, and the reads that change state: the entry GET
touches the entry (LRU order, hit/miss counters, TTL eviction, events), so its route adds
`Depends(check_token)`. Other GETs, /metrics and /healthz stay open.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import ApiError

MUTATING = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def token_problem(expected: str | None, authorization: str | None, query_token: str | None = None) -> int:
    """0 when allowed, else the HTTP status to refuse with (401 missing or empty, 403 wrong)."""
    if not expected:
        return 0
    given = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        given = (value.strip() or None) if scheme.lower() == "bearer" else ""
    if given is None and query_token is not None:
        given = query_token
    if given is None:
        return 401
    return 0 if hmac.compare_digest(given.encode(), expected.encode()) else 403


async def require_token(request: Request) -> None:
    """Router dependency: lets reads through, checks the token on POST/PUT/DELETE."""
    if request.method in MUTATING:
        await check_token(request)


async def check_token(request: Request) -> None:
    """Refuse the request unless it carries the token (when one is set). Raises ApiError 401/403."""
    status = token_problem(request.app.state.settings.token, request.headers.get("authorization"))
    if status == 401:
        raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
    if status == 403:
        raise ApiError(403, "forbidden", "wrong bearer token")
