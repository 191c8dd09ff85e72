"""The dashboard page (`GET /`), the API docs page (`GET /docs`) and their static files.

Swagger UI is served from `static/vendor/swagger-ui/` (swagger-ui-dist 5, Apache-2.0), never from
a CDN: the docs must work on an air-gapped cluster like the dashboard does.
"""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from workloads.routing import policy_names

from . import __version__
from .deps import services_of
from .http.errors import ApiError
from .stream import META, PROTOCOL_VERSION

# The policies the Routing view ticks at first: a baseline and the three engines' routers.
ROUTING_DEFAULTS = ("round_robin", "sglang_cache_aware", "dynamo_kv", "llmd_precise")



def web_root() -> Path:
    """Where templates/ and static/ are: inside the installed package (a wheel carries them as
    app/web/, see setup.py), else at the root of the checkout this package runs from."""
    packaged = Path(__file__).resolve().parent / "web"
    if (packaged / "templates" / "index.html").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent


TEMPLATES_DIR = web_root() / "templates"
STATIC_DIR = web_root() / "static"

SWAGGER_UI = "/static/vendor/swagger-ui"
# An empty icon: the browser asks for nothing, here or elsewhere.
NO_FAVICON = "data:,"

router = APIRouter(tags=["pages"], include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))


@router.get("/", response_class=HTMLResponse)
async def index(request: Request) -> HTMLResponse:
    if not (TEMPLATES_DIR / "index.html").is_file():
        raise ApiError(404, "not_found", "the dashboard page is not installed")
    return templates.TemplateResponse(request, "index.html", {
        "protocol": PROTOCOL_VERSION,
        "token_required": bool(services_of(request).settings.token),
        "version": __version__,
        "meta": META,
        "routing_policies": policy_names(),
        "routing_defaults": ROUTING_DEFAULTS,
    })


@router.get("/docs", response_class=HTMLResponse)
async def docs(request: Request) -> HTMLResponse:
    """Swagger UI, started by static/js/docs.js: no inline script, as the CSP requires."""
    title = html.escape(f"{request.app.title} - API")
    openapi_url = html.escape(request.app.openapi_url or "/openapi.json")
    return HTMLResponse(f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title}</title>
  <link rel="icon" href="{NO_FAVICON}">
  <link rel="stylesheet" href="{SWAGGER_UI}/swagger-ui.css">
</head>
<body data-openapi="{openapi_url}">
  <div id="swagger-ui"></div>
  <script src="{SWAGGER_UI}/swagger-ui-bundle.js"></script>
  <script type="module" src="/static/js/docs.js"></script>
</body>
</html>
""")


def mount_static(app) -> None:
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
