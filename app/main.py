"""Builds the app: settings, registry, stream hub, middleware, error handlers and routers."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from allocator.history.recording import RecordedPool

from . import __version__
from .errors import InternalErrorMiddleware, install_error_handlers
from .fleets import Fleets
from .head import HeadMiddleware
from .housekeeping import Housekeeper
from .instance import Instance
from .limits import BodyLimitMiddleware
from .metrics import LatencyMiddleware, Metrics
from .openapi import install_openapi
from .pages import mount_static
from .pages import router as pages_router
from .recordings import Recordings, pool_name_for
from .registry import Registry
from .routes import (
    allocations,
    entries,
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
from .routing_jobs import RoutingRuns
from .security import SecurityMiddleware
from .settings import Settings, get_settings
from .stream import Hub

API_ROUTERS = (pools.router, allocations.router, entries.router, ops.router, workload.router, meta.router,
               sequences.router, history.router, recordings.router, prefix.router, routing.router,
               fleets.router)


def default_pool_spec(settings: Settings) -> dict:
    from allocator import resolve_device

    device = str(resolve_device(settings.device))
    blocks = settings.default_pool_blocks(device)
    return {"name": "default", "strategy": "paged", "num_blocks": blocks,
            "block_bytes": settings.default_block_bytes, "device": settings.device,
            "cache": {"capacity_bytes": blocks * settings.default_block_bytes, "policy": "lru"}}


@asynccontextmanager
async def lifespan(app: FastAPI):
    registry: Registry = app.state.registry
    hub: Hub = app.state.hub
    startup = getattr(app.state, "startup_pools", None)  # set by `kvscope mirror | recording`
    if startup is not None:
        from .mirrors import start_pool

        for spec, options in startup:
            await start_pool(registry, hub, spec, **options)
    elif "default" not in registry:
        hub.attach(registry.create(default_pool_spec(app.state.settings)))
    for path in app.state.settings.open_recordings:  # kvscope open FILE
        pool = RecordedPool(path, pool_name_for(Path(path).stem))
        hub.attach(registry.adopt(pool.name, pool))
    for name, engines, options in getattr(app.state, "startup_fleets", ()):  # serve --fleet
        await app.state.fleets.create(name, engines, **options)
    app.state.housekeeper.start()
    yield
    await app.state.fleets.close_all()
    app.state.recordings.stop_all()
    app.state.routing_runs.stop_all()
    await app.state.housekeeper.stop()
    for handle in registry:
        await hub.detach(handle, reason="server shutting down")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="kvscope",
        version=__version__,
        description="A live KV-cache allocator lab: real pools, an eviction cache, a block-map stream.",
        lifespan=lifespan,
        docs_url=None,  # served by app/pages.py from the vendored Swagger UI, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.instance = Instance.new()
    app.state.registry = Registry(settings)
    app.state.hub = Hub(settings.stream_interval_s, app.state.instance, settings)
    app.state.recordings = Recordings(settings.recordings_dir, app.state.registry, settings.max_blocks)
    app.state.housekeeper = Housekeeper(app.state.registry)
    app.state.routing_runs = RoutingRuns()
    app.state.fleets = Fleets()
    app.state.fleets.nats_auth = settings.nats_auth
    app.state.metrics = Metrics(app.state.registry, app.state.fleets)
    install_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router)  # the token: app/security.py, for every route at once
    app.include_router(stream.router)
    app.include_router(pages_router)
    mount_static(app)

    @app.get("/healthz", tags=["ops"], description=(
        "Liveness, and which server process answers: `instance_id` changes when the server "
        "restarts (pools, history and workloads are in memory only and start afresh)."))
    async def healthz(request: Request) -> dict:
        return {"ok": True, **request.app.state.instance.describe()}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    install_openapi(app)
    # Added innermost first: InternalError (outermost) -> Security -> Latency -> BodyLimit ->
    # Head -> InternalError -> the app. The inner one answers a route's unexpected exception
    # as every other answer is (security headers, latency by status, HEAD without a body);
    # the outer one, an exception of a middleware itself.
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body=settings.max_body,
                       wider={recordings.UPLOAD_PATH: settings.max_upload})
    app.add_middleware(LatencyMiddleware, metrics=app.state.metrics)
    app.add_middleware(SecurityMiddleware, settings=settings)
    app.add_middleware(InternalErrorMiddleware)
    return app
