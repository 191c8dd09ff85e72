"""The vocabulary: strategies, fits, policies, block states, event kinds, scenarios (allocator/vocab.py)."""

from __future__ import annotations

from fastapi import APIRouter

from allocator.vocab import meta

from ..schemas import MetaOut

router = APIRouter(prefix="/api/meta", tags=["meta"])


@router.get("", response_model=MetaOut, description=(
    "Every name a client may send or will see, with what it means (e.g. whether scattered free "
    "space can fail a request on a strategy). The stream's `hello` carries the same object as `meta`."))
async def get_meta() -> dict:
    return meta()
