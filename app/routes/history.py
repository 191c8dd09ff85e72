"""History: a pool's past (info, events, map and stats at a seq) and its exports."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from starlette.concurrency import run_in_threadpool

from allocator import EVENT_FIELDS, STATE_NAMES
from allocator.errors import Conflict, InvalidRequest, KVScopeError
from allocator.history import HistoryView, map_runs
from allocator.history.exports import events_csv, memory_snapshot
from allocator.history.recording import RecordedPool
from allocator.history.series import DEFAULT_POINTS, MAX_POINTS, history_series

from ..deps import PoolDep
from ..http.auth import check_token

router = APIRouter(prefix="/api/pools", tags=["history"])

AtSeq = Annotated[int | None, Query(ge=0, le=1 << 62, description=(
    "an event seq: answer as the pool was right after that event (404 when outside the history)"))]


def history_view(handle) -> HistoryView:
    """A frozen snapshot of the pool's history (taken on the event loop: cheap, consistent).
    Raises Conflict when the pool keeps none."""
    history = handle.pool.history
    if history is None:
        raise Conflict(f"pool {handle.name!r} keeps no history (the server keeps none with "
                       "KVSCOPE_HISTORY_BYTES=0; a pool made from Python, none unless asked)")
    return history.view()


async def replayed(handle, fn, *args):
    """`fn(*args)` off the event loop. On a recorded pool, whatever the file's data breaks
    there (a file damaged past what the checks on opening it catch) is a 422 naming the
    recording, never a 500; on a live pool an exception stays what it is."""
    try:
        return await run_in_threadpool(fn, *args)
    except KVScopeError:
        raise
    except Exception as exc:
        if not isinstance(handle.pool, RecordedPool):
            raise
        raise handle.pool.damaged(exc) from None


def map_at(view: HistoryView, at_seq: int) -> dict:
    rep = view.replay_to(at_seq)
    return {"num_blocks": int(rep.owner.size), "states": {str(k): v for k, v in STATE_NAMES.items()},
            "runs": map_runs(rep.owner, rep.state), "at_seq": at_seq}


async def blockmap_at(handle, at_seq: int) -> dict:
    """The block map as the live route answered right after event `at_seq`."""
    view = history_view(handle)
    view.check_seq(at_seq)
    return await replayed(handle, map_at, view, at_seq)


async def stats_at(handle, at_seq: int) -> dict:
    """The pool's stats right after event `at_seq` (without the cache's own figures)."""
    view = history_view(handle)
    view.check_seq(at_seq)
    return await replayed(handle, view.stats_at, at_seq)


def history_info(handle) -> dict:
    view = history_view(handle)
    info = {"first_seq": view.first_seq, "last_seq": view.last_seq, "dropped_events": view.dropped_events,
            "keyframes": len(view.keyframes)}
    history = handle.pool.history
    info.update(bytes=history.nbytes, max_bytes=history.max_bytes)
    return info


@router.get("/{pool}/history", summary="What of the pool's past can be rebuilt")
async def get_history(handle: PoolDep) -> dict:
    """`first_seq`..`last_seq`: the event seqs whose map and stats can be asked for with
    `at_seq`. `dropped_events` > 0 when the oldest events went to keep the history within its
    memory budget (`max_bytes`)."""
    return history_info(handle)


@router.get("/{pool}/history/series", summary="The charts' figures sampled over a stretch of the history")
async def get_history_series(
    handle: PoolDep,
    from_seq: Annotated[int | None, Query(ge=0, le=1 << 62,
                                          description="first event seq (default: the oldest kept)")] = None,
    to_seq: Annotated[int | None, Query(ge=0, le=1 << 62, description="last event seq (default: the newest)")] = None,
    points: Annotated[int, Query(ge=1, le=MAX_POINTS,
                                 description=f"at most this many points, 1..{MAX_POINTS}")] = DEFAULT_POINTS,
) -> dict:
    """At up to `points` evenly spaced event seqs of from_seq..to_seq (both ends included): the
    seq and time of the event, utilization, internal and external fragmentation, requested and
    allocated bytes, used and free blocks, the largest free extent, live allocations, the OOM
    totals, and the evictions, hits and misses since the previous point, as `columns` (one list
    per figure). The page's charts draw an opened recording, or a live pool's past, from it.
    Replayed once off the event loop, rolling forward from one point to the next. A seq outside
    the history is 404; from_seq after to_seq 422."""
    view = history_view(handle)
    first = view.first_seq if from_seq is None else from_seq
    last = view.last_seq if to_seq is None else to_seq
    view.check_seq(first)
    view.check_seq(last)
    if first > last:
        raise InvalidRequest(f"from_seq {first} is after to_seq {last}: give from_seq <= to_seq")
    return await replayed(handle, history_series, view, first, last, points)


@router.get("/{pool}/history/events", summary="Events of the whole kept history")
async def history_events(
    handle: PoolDep,
    after: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    kinds: Annotated[str | None, Query(description="comma-separated event kinds, e.g. oom,evict,defragment")] = None,
) -> dict:
    """Like `/events`, but beyond the live ring: every kept event after `after` (the page's
    timeline reads its markers here)."""
    wanted = None
    if kinds:
        wanted = {k.strip() for k in kinds.split(",") if k.strip()}
        unknown = sorted(wanted - set(EVENT_FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown event kinds {unknown}; choose from {sorted(EVENT_FIELDS)}")
    view = history_view(handle)
    events = await replayed(handle, view.events, after, limit, wanted)
    return {"events": events, "first_seq": view.first_seq, "last_seq": view.last_seq}


@router.get("/{pool}/export", summary="The history as a PyTorch memory snapshot or CSV",
            dependencies=[Depends(check_token)],
            responses={200: {"content": {"application/octet-stream": {}, "text/csv": {}}}})
async def export(
    handle: PoolDep,
    format: Annotated[Literal["memory_viz", "csv"], Query(description="memory_viz or csv")] = "csv",
) -> Response:
    """`memory_viz`: a pickle (protocol 4) shaped like `torch.cuda.memory._snapshot()` (one
    segment for the pool, `alloc` / `free_completed` traces) that `python -m
    torch.cuda._memory_viz trace_plot FILE -o out.html` renders. `csv`: one row per event."""
    view = history_view(handle)
    name = handle.name
    if format == "csv":
        body = await replayed(handle, events_csv, view)
        return Response(body, media_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="{name}-events.csv"'})
    body = await replayed(handle, memory_snapshot, view, name)
    return Response(body, media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{name}-snapshot.pickle"'})
