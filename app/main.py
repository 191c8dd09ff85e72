"""Builds the app: settings, registry, stream hub, middleware, error handlers and routers."""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from allocator import resolve_device
from allocator.history.recording import RecordedPool

from . import __version__
from .http.errors import InternalErrorMiddleware, install_error_handlers
from .http.head import HeadMiddleware
from .http.limits import BodyLimitMiddleware
from .http.openapi import install_openapi
from .http.security import SecurityMiddleware
from .metrics import LatencyMiddleware
from .mirrors import start_pool
from .pages import mount_static
from .pages import router as pages_router
from .recordings import pool_name_for
from .routes import (
    allocations,
    entries,
    fleet_query,
    fleets,
    history,
    meta,
    ops,
    pools,
    prefix,
    recordings,
    routing,
    sequences,
    stream,
    workload,
)
from .services import Services, Startup
from .settings import Settings, get_settings

API_ROUTERS = (pools.router, allocations.router, entries.router, ops.router, workload.router, meta.router,
               sequences.router, history.router, recordings.router, prefix.router, routing.router,
               fleets.router, fleet_query.router)


def default_pool_spec(settings: Settings) -> dict:
    device = str(resolve_device(settings.device))
    blocks = settings.default_pool_blocks(device)
    return {"name": "default", "strategy": "paged", "num_blocks": blocks,
            "block_bytes": settings.default_block_bytes, "device": settings.device,
            "cache": {"capacity_bytes": blocks * settings.default_block_bytes, "policy": "lru"}}


@asynccontextmanager
async def lifespan(app: FastAPI):
    services: Services = app.state.services
    registry, hub, startup = services.registry, services.hub, services.startup
    if startup.pools is not None:  # `kvscope mirror | recording`, `serve --publish`
        for spec, options in startup.pools:
            await start_pool(registry, hub, spec, **options)
    elif "default" not in registry:
        hub.attach(registry.create(default_pool_spec(services.settings)))
    for path in services.settings.open_recordings:  # kvscope open FILE
        pool = RecordedPool(path, pool_name_for(Path(path).stem))
        hub.attach(registry.adopt(pool.name, pool))
    for name, engines, options in startup.fleets:  # serve --fleet, kvscope fleet, the demo
        await services.fleets.create(name, engines, **options)
    for session, spec, fleet, load in startup.router_runs:  # the demo's router run
        services.routing_runs.adopt(session, spec, fleet=fleet, load=load)
    services.housekeeper.start()
    # What start-up built (modules, the app, the pools' objects) lives as long as the server:
    # kept out of the collector's full passes, which otherwise walk it all again and again
    # (a pause that delays every engine's batches and every request behind it).
    gc.freeze()
    yield
    await services.fleets.close_all()
    services.recordings.stop_all()
    services.routing_runs.stop_all()
    await services.housekeeper.stop()
    for handle in registry:
        await hub.detach(handle, reason="server shutting down")


def create_app(settings: Settings | None = None, startup: Startup | None = None) -> FastAPI:
    """The server: its services built from `settings` (default: the environment's), holding
    what `startup` names once it starts (default: the default pool)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="kvscope",
        version=__version__,
        description="A live KV-cache allocator lab: real pools, an eviction cache, a block-map stream.",
        lifespan=lifespan,
        docs_url=None,  # served by app/pages.py from the vendored Swagger UI, not a CDN
        redoc_url=None,
    )
    services = app.state.services = Services.build(settings, startup)
    install_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router)  # the token: app/http/security.py, for every route at once
    app.include_router(stream.router)
    app.include_router(pages_router)
    mount_static(app)

    @app.get("/healthz", tags=["ops"], description=(
        "Liveness, and which server process answers: `instance_id` changes when the server "
        "restarts (pools, history and workloads are in memory only and start afresh)."))
    async def healthz() -> dict:
        return {"ok": True, **services.instance.describe()}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    install_openapi(app, token_required=bool(settings.token))
    # Added innermost first: InternalError (outermost) -> Security -> Latency -> BodyLimit ->
    # Head -> InternalError -> the app. The inner one answers a route's unexpected exception
    # as every other answer is (security headers, latency by status, HEAD without a body);
    # the outer one, an exception of a middleware itself.
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body=settings.max_body,
                       wider={recordings.UPLOAD_PATH: settings.max_upload})
    app.add_middleware(LatencyMiddleware, metrics=services.metrics)
    app.add_middleware(SecurityMiddleware, settings=settings)
    app.add_middleware(InternalErrorMiddleware)
    return app
