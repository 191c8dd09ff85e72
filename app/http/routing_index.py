"""Every route of an app with its full path, for the checks that must cover all of them
(media types in app/http/security.py, `Allow` on 405 in app/http/errors.py, the auth test).

FastAPI >= 0.160 keeps an included router as one entry of `app.routes`; its routes with their
prefixes come from `fastapi.routing._iter_included_route_candidates` (private, so guarded:
without it the plain list is used, which is what older FastAPI versions hold).
"""

from __future__ import annotations

from starlette.routing import BaseRoute

try:
    from fastapi.routing import _iter_included_route_candidates
except ImportError:  # pragma: no cover - older FastAPI: app.routes is already flat
    _iter_included_route_candidates = None


def flat_routes(app) -> list[BaseRoute]:
    routes = app.router.routes
    if _iter_included_route_candidates is None:
        return list(routes)
    return list(_iter_included_route_candidates(routes))
