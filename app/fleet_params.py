"""The query parameters that page and search a fleet's engine list (GET /api/fleets/{fleet} and
its /blocks), as FastAPI dependencies giving a `kvevents.fleet_view.EngineQuery`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Depends, Query
from pydantic import StringConstraints

from kvevents.fleet_view import DEFAULT_LIMIT, FLAGS, MAX_LIMIT, MAX_NAMES, STATES, EngineQuery
from kvevents.index import MAX_FLEET_ENGINES

Name = Annotated[str, StringConstraints(min_length=1, max_length=80)]
State = Literal[STATES + FLAGS]

Offset = Annotated[int, Query(ge=0, le=MAX_FLEET_ENGINES, description=(
    "the first matched engine of the page (0-based, in the fleet's order)"))]
GroupsOffset = Annotated[int, Query(ge=0, le=MAX_FLEET_ENGINES, description=(
    "the first server of the page of `groups` (0-based, first-seen order)"))]
Search = Annotated[str, Query(max_length=80, description=(
    "only engines whose name, server or model holds this (case-insensitive)"))]
StateQ = Annotated[State | None, Query(description=(
    "only engines in this stream state, `lagging` (batches reach the index over 1 s after the "
    "engine sent them, p99) or `errors` (a dead stream, bad input, lost batches, errors)"))]
Groups = Annotated[list[Name], Query(max_length=MAX_NAMES, description=(
    f"only the engines of these servers (repeat the parameter; at most {MAX_NAMES})"))]


def engine_query(
    engines_offset: Offset = 0,
    engines_limit: Annotated[int, Query(ge=0, le=MAX_LIMIT, description=(
        f"engines a page holds (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}; 0: the summary "
        "and groups alone); page on with engines_offset"))] = DEFAULT_LIMIT,
    engines_q: Search = "",
    engines_state: StateQ = None,
    engines_group: Groups = [],  # noqa: B006 (FastAPI copies defaults)
    groups_offset: GroupsOffset = 0,
    groups_limit: Annotated[int, Query(ge=0, le=MAX_LIMIT, description=(
        f"servers the page of `groups` holds (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})"))]
        = DEFAULT_LIMIT,
) -> EngineQuery:
    return EngineQuery(offset=engines_offset, limit=engines_limit, q=engines_q,
                       state=engines_state, groups=tuple(engines_group),
                       groups_offset=groups_offset, groups_limit=groups_limit)


def map_query(
    engines: Annotated[list[Name], Query(max_length=MAX_NAMES, description=(
        f"only these engines' maps (repeat the parameter; at most {MAX_NAMES})"))] = [],  # noqa: B006
    engines_offset: Offset = 0,
    engines_limit: Annotated[int | None, Query(ge=0, le=MAX_LIMIT, description=(
        f"only the maps of this page of the matched engines (at most {MAX_LIMIT}; default: "
        "every matched engine's)"))] = None,
    engines_q: Search = "",
    engines_state: StateQ = None,
    engines_group: Groups = [],  # noqa: B006
) -> EngineQuery | None:
    """None when nothing narrows the maps (every engine's, as without parameters)."""
    if not (engines or engines_q or engines_state or engines_group) and engines_limit is None \
            and not engines_offset:
        return None
    return EngineQuery(offset=engines_offset,
                       limit=MAX_FLEET_ENGINES if engines_limit is None else engines_limit,
                       q=engines_q, state=engines_state, groups=tuple(engines_group),
                       names=tuple(engines))


EngineQueryDep = Annotated[EngineQuery, Depends(engine_query)]
MapQueryDep = Annotated[EngineQuery | None, Depends(map_query)]
