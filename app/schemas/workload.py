"""Workloads: start a scenario or a trace on a pool."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.spec import MAX_SEED, MAX_SPEED, MAX_TRACE_LIMIT

from .common import ScenarioName, Strict, WorkloadKind


class WorkloadIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"kind": "scenario", "name": "fragmentation", "seed": 0, "speed": 1.0},
        {"kind": "trace", "limit": 500, "speed": 1.0}]})

    kind: WorkloadKind
    name: ScenarioName | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    speed: Annotated[float, Field(gt=0, le=MAX_SPEED, allow_inf_nan=False)] = 1.0
    limit: Annotated[int, Field(gt=0, le=MAX_TRACE_LIMIT)] | None = None

    @model_validator(mode="after")
    def _named(self) -> WorkloadIn:
        if self.kind == "scenario" and self.name is None:
            raise ValueError("a scenario needs 'name'")
        return self


class WorkloadOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"workload": {"name": "fragmentation", "kind": "scenario", "state": "running", "done": 0, "total": 400}}]})

    workload: dict
