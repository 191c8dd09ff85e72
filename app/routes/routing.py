"""The routing lab: start a run of routing policies over N replicas on the bundled trace, watch
its progress and figures, stop it (app/routing_jobs.py; the model: workloads/routing/)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response, status

from allocator.errors import Conflict, InvalidRequest
from workloads.routing.decisions import RULES

from ..deps import RoutingRunsDep, ServicesDep
from ..routing_jobs import LiveRun
from ..schemas import (
    ROUTING_RUN_ID_PATTERN,
    DecisionsOut,
    RoutingIn,
    RoutingListOut,
    RoutingOut,
    RoutingPolicyIn,
)

router = APIRouter(prefix="/api/routing", tags=["routing"])
RunId = Annotated[str, Path(pattern=ROUTING_RUN_ID_PATTERN, description="run id", examples=["r1"])]


@router.post("", response_model=RoutingOut, status_code=status.HTTP_202_ACCEPTED, description=(
    "`action: start` routes the first `limit` requests of the bundled Mooncake trace through "
    "`replicas` replicas of `capacity_tokens` each, policy after policy, in `sequence` or "
    "`serving` mode (docs/ROUTING.md); 409 while a run is going. Mode `live` feeds the trace at "
    "`speed` times its timestamps through `policy` to `replicas` real prefix-caching pools "
    "(`route-<id>-r<i>`), each publishing its KV events, followed by the fleet `route-<id>`; "
    "with `compare` (two policies) instead, each request goes to two such sides, "
    "`route-<id>-a` and `route-<id>-b`, one per policy. "
    "Mode `router` replays the trace as real HTTP requests through a real router (`router`: "
    "sglang, vllm or vllm-kv, from kvscope[routers]) in front of `replicas` simulated engines "
    "of the server, followed by the fleet `route-<id>`; its decisions are recorded at the "
    "engines. "
    "`action: stop` with `id` stops that run (200); a live run's pools and fleet go with it."))
async def start_or_stop(body: RoutingIn, services: ServicesDep, response: Response) -> dict:
    runs = services.routing_runs
    if body.action == "stop":
        run = runs.get(body.id)
        await run.release(services)
        response.status_code = status.HTTP_200_OK
        return {"routing": run.view()}
    spec = body.model_dump(exclude={"action", "id"})
    if body.mode == "router":
        return {"routing": (await runs.start_router(spec, services)).view()}
    if body.mode == "live":
        spec["policy"] = None if body.compare else body.policy or body.policies[0]
        spec["speed"] = body.speed or 1.0
        return {"routing": (await runs.start_live(spec, services)).view()}
    return {"routing": runs.start(spec).view()}


@router.get("", response_model=RoutingListOut, description=(
    "The runs the server keeps (the last few finished ones, and any that is going or holds "
    "pools or a fleet), oldest first, each as `GET /api/routing/{id}` shows it."))
async def list_runs(runs: RoutingRunsDep) -> dict:
    return {"runs": [run.view() for run in runs.list()]}


@router.get("/{run_id}", response_model=RoutingOut, description=(
    "A run's state (running, finished, stopped, failed), progress in requests routed over all its "
    "policies, and one result row per finished policy (the rows of `kvscope route`)."))
async def progress(run_id: RunId, runs: RoutingRunsDep) -> dict:
    return {"routing": runs.get(run_id).view()}


MAX_PAGE = 1000


@router.get("/{run_id}/decisions", response_model=DecisionsOut, description=(
    "Every decision of a run, one record per routed request: the replica chosen, the `rule` "
    "that decided, each replica's cached leading blocks, load and score then, and the tokens "
    "captured and available (docs/ROUTING.md#decisions). `policy` picks the policy's log (default "
    "the first; a compare run's sides also by `a` / `b`); `rule`, `replica` and `request` filter; "
    f"`offset` / `limit` page (at most {MAX_PAGE}). `logs` summarises each log: decisions by rule "
    "and by replica, captured and available tokens."))
async def decisions(run_id: RunId, runs: RoutingRunsDep,
                    policy: Annotated[str | None, Query(max_length=64)] = None,
                    rule: Literal[RULES] | None = None,  # type: ignore[valid-type]
                    replica: Annotated[int | None, Query(ge=0, le=1 << 20)] = None,
                    request_index: Annotated[int | None, Query(alias="request", ge=0)] = None,
                    offset: Annotated[int, Query(ge=0)] = 0,
                    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> dict:
    run = runs.get(run_id)
    logs = run.decision_logs()
    if not logs:
        return {"run": run_id, "policy": policy, "total": 0, "offset": offset, "limit": limit,
                "decisions": [], "logs": []}
    key = policy if policy is not None else next(iter(logs))
    if key not in logs:
        raise InvalidRequest(f"policy {policy!r} is not one of run {run_id!r}'s: choose from "
                             f"{', '.join(logs)}")
    log = logs[key]
    items, total = log.page(offset, limit, rule=rule, replica=replica, request=request_index)
    seen, summaries = set(), []
    for one in logs.values():
        if id(one) not in seen:
            seen.add(id(one))
            summaries.append(one.summary())
    return {"run": run_id, "policy": log.policy, "total": total, "offset": offset, "limit": limit,
            "decisions": items, "logs": summaries}


@router.post("/{run_id}/policy", response_model=RoutingOut, description=(
    "Switch a running live run's policy: the requests from the next one on are routed by a fresh "
    "`policy` (its decisions name it). 409 for a run that is not live, compares two policies, or "
    "is no longer running."))
async def switch_policy(run_id: RunId, body: RoutingPolicyIn, runs: RoutingRunsDep) -> dict:
    run = runs.get(run_id)
    if not isinstance(run, LiveRun):
        raise Conflict(f"routing run {run_id!r} is not live; only a live run's policy can be switched")
    if run.state != "running":
        raise Conflict(f"routing run {run_id!r} is {run.state}; start a new one")
    run.switch(body.policy)
    return {"routing": run.view()}


@router.delete("/{run_id}", status_code=status.HTTP_204_NO_CONTENT, description=(
    "Stop the run if it is going, remove a live run's pools and fleet, and forget it."))
async def delete_run(run_id: RunId, services: ServicesDep) -> Response:
    await services.routing_runs.delete(run_id, services)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
