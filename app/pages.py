"""The dashboard page (`GET /`) and its static files."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from . import __version__
from .errors import ApiError
from .stream import PROTOCOL_VERSION

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = ROOT / "static"

router = APIRouter(tags=["pages"], include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))


@router.get("/", response_class=HTMLResponse)
async def index(request: Request) -> HTMLResponse:
    if not (TEMPLATES_DIR / "index.html").is_file():
        raise ApiError(404, "not_found", "the dashboard page is not installed")
    return templates.TemplateResponse(request, "index.html", {
        "protocol": PROTOCOL_VERSION,
        "token_required": bool(request.app.state.settings.token),
        "version": __version__,
    })


def mount_static(app) -> None:
    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
