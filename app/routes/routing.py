"""The routing lab: start a run of routing policies over N replicas on the bundled trace, watch
its progress and figures, stop it (app/routing_jobs.py; the model: workloads/routing/)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response, status

from ..routing_jobs import RoutingRuns
from ..schemas import ROUTING_RUN_ID_PATTERN, RoutingIn, RoutingOut

router = APIRouter(prefix="/api/routing", tags=["routing"])
RunId = Annotated[str, Path(pattern=ROUTING_RUN_ID_PATTERN, description="run id", examples=["r1"])]


def _runs(request: Request) -> RoutingRuns:
    return request.app.state.routing_runs


@router.post("", response_model=RoutingOut, status_code=status.HTTP_202_ACCEPTED, description=(
    "`action: start` routes the first `limit` requests of the bundled Mooncake trace through "
    "`replicas` replicas of `capacity_tokens` each, policy after policy, in `sequence` or "
    "`serving` mode (docs/ROUTING.md); 409 while a run is going. `action: stop` with `id` stops "
    "that run (200)."))
async def start_or_stop(body: RoutingIn, request: Request, response: Response) -> dict:
    runs = _runs(request)
    if body.action == "stop":
        run = runs.get(body.id)
        run.stop()
        response.status_code = status.HTTP_200_OK
        return {"routing": run.view()}
    spec = body.model_dump(exclude={"action", "id"})
    return {"routing": runs.start(spec).view()}


@router.get("/{run_id}", response_model=RoutingOut, description=(
    "A run's state (running, finished, stopped, failed), progress in requests routed over all its "
    "policies, and one result row per finished policy (the rows of `kvscope route`)."))
async def progress(run_id: RunId, request: Request) -> dict:
    return {"routing": _runs(request).get(run_id).view()}
