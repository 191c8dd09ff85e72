"""The prefix-cache capacity curve of the bundled trace (workloads/prefix_curve_data.py)."""

from __future__ import annotations

from fastapi import APIRouter

from workloads.prefix_curve_data import CurveDataError, load_bundled_curve

from ..http.errors import ApiError
from ..schemas import PrefixCurveOut

router = APIRouter(prefix="/api/prefix", tags=["prefix"])


@router.get("/curve", response_model=PrefixCurveOut, description=(
    "Hit ratio vs cache capacity on the bundled Mooncake trace, one line per eviction policy plus "
    "Bélády's MIN (`belady`) and the infinite-capacity maximum, as measured by "
    "`python -m bench.bench_mooncake` on the allocator's prefix cache (see docs/report/prefix_report.md). "
    "Shipped with the package: answering reads a small file once."))
def curve() -> dict:  # sync: FastAPI runs it in a worker thread, the one read never blocks the loop
    try:
        return load_bundled_curve()
    except CurveDataError as exc:
        raise ApiError(503, "unavailable", str(exc)) from exc
