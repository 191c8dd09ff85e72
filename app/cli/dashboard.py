"""The dashboard server of `kvscope mirror`, `kvscope recording --serve` and `kvscope fleet`:
the app holding what the command line asked for, on uvicorn."""

from __future__ import annotations

import dataclasses
import gc
import sys

import uvicorn

from ..main import create_app
from ..services import Startup
from ..settings import SettingsError, get_settings


def serve_dashboard(prog: str, args, startup: Startup, query: str) -> int:
    """Serve the dashboard on args.host/args.port holding `startup` (app/services.py `Startup`:
    the pools and fleets it shows), and print the page's address with `query` (`?pool=engine`)."""
    try:
        settings = get_settings()
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    settings = dataclasses.replace(settings, host=args.host or settings.host,
                                   port=args.port or settings.port)
    app = create_app(settings, startup)
    print(f"{prog}: dashboard at http://{settings.host}:{settings.port}/{query}", flush=True)
    gc.freeze()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                ws_per_message_deflate=False)
    return 0
