"""A fleet's engine list as the REST API and the page read it when the fleet holds up to 1,024
engines: the server (group) an engine belongs to, each engine's health in one word, the
search, state and group filters, pages of engines and of groups, and a summary of the whole
fleet that stays small whatever its size.

**Groups.** `server_of` is the one definition of an engine's server, the group the page and the
summary show its DP ranks under (the index keeps it as `EngineInfo.server`):

- an engine spec's `server` when given (ranks given as separate endpoints, e.g. 8 endpoints of
  `server-17` each with its `dp_rank`), else the spec's own name; a further DP rank the fleet
  adds from an endpoint's batches (`<name>:dp<rank>`) is its endpoint's server;
- a pod on a listening fleet (llm-d's `kv@<pod>@<model>`): the pod, whatever its models;
- a Dynamo worker (NATS: `worker-<id>`, its ranks `worker-<id>:dp<rank>`; `/register`: its
  instance id): the worker;
- a recorded engine played back: the name before a `:dp<rank>` suffix, else the name;
- otherwise the engine itself.

Everything here is a pure function of the engine rows (`Fleet.engines()`); call it where the
fleet's changes run (the rows are read there).
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

DEFAULT_LIMIT = 64  # engines (and groups) a page holds when the client names no limit
MAX_LIMIT = 256  # ... and at most: a quarter of the largest fleet, so no answer carries every row
MAX_NAMES = 256  # engine or group names one request may list
TOP = 8  # engines and groups listed by blocks held in the summary
LAGGING_MS = 1000.0  # an engine whose batches reach the index later than this (p99) is lagging

# One word per engine: its stream's state (docs/FLEET.md, "An engine row carries"), and the two
# conditions that cut across states.
STATES = ("connecting", "connected", "live", "unreachable", "disconnected", "refused", "stopped",
          "recorded")
FLAGS = ("lagging", "errors")

_RANK = re.compile(r"^(?P<server>.+?)(?::dp\d{1,4})+$")


def server_of(name: str, server: str | None = None) -> str:
    """The server (page group) of engine `name` given the `server` its spec or source names
    (None: none named): see the module's docstring."""
    return server or name


def recorded_server(name: str) -> tuple[str, int]:
    """A recorded engine's server and DP rank, read back from the name the fleet gave it: a
    further rank `<server>:dp<rank>` (the last suffix is the rank), else rank 0 of its own."""
    m = _RANK.match(name)
    if m is None:
        return server_of(name), 0
    return m.group("server"), int(name.rsplit(":dp", 1)[1])


def state_of(row: dict) -> str:
    return (row.get("stream") or {}).get("state") or "recorded"


def is_lagging(row: dict) -> bool:
    """Batches reaching the index more than LAGGING_MS after the engine stamped them (p99 of
    the last ones; across machines this includes their clocks' offset)."""
    p99 = (row.get("stream") or {}).get("apply_lag_p99_ms")
    return p99 is not None and p99 > LAGGING_MS


def has_errors(row: dict) -> bool:
    """What the page marks an engine bad for: a dead stream, bad input, lost batches, errors."""
    s = row.get("stream") or {}
    return (state_of(row) in ("unreachable", "disconnected", "refused")
            or bool(s.get("error_count")) or bool(s.get("lost_batches"))
            or bool(row.get("malformed_events")) or bool(row.get("errors")))


@dataclass(frozen=True, slots=True)
class EngineQuery:
    """Which engines a request asks for. `q`: a case-insensitive substring of the engine's
    name, its server or its model; `state`: a word of STATES or FLAGS; `groups` / `names`:
    only those servers / engines (empty: any); then `offset` / `limit` over what matched (in
    the fleet's order), and `groups_offset` / `groups_limit` over the groups of what matched."""

    offset: int = 0
    limit: int = DEFAULT_LIMIT
    q: str = ""
    state: str | None = None
    groups: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    groups_offset: int = 0
    groups_limit: int = DEFAULT_LIMIT

    def narrows(self) -> bool:
        """Whether it names a subset (else every engine is meant)."""
        return bool(self.q or self.state or self.groups or self.names)

    def matches(self, row: dict) -> bool:
        if self.names and row["name"] not in self.names:
            return False
        if self.groups and row["server"] not in self.groups:
            return False
        if self.state is not None:
            if self.state == "lagging":
                if not is_lagging(row):
                    return False
            elif self.state == "errors":
                if not has_errors(row):
                    return False
            elif state_of(row) != self.state:
                return False
        if self.q:
            q = self.q.lower()
            return any(q in (v or "").lower() for v in (row["name"], row["server"], row.get("model")))
        return True


def matching(rows: list[dict], query: EngineQuery) -> list[dict]:
    return [r for r in rows if query.matches(r)]


def page_names(rows: list[dict], query: EngineQuery) -> list[str]:
    """The names of the engines `query` asks for: its page of what matched."""
    hit = matching(rows, query)
    return [r["name"] for r in hit[query.offset:query.offset + query.limit]]


def groups_of(rows: list[dict]) -> list[dict]:
    """One entry per server (first-seen order) over `rows`: its engines, DP ranks, engines by
    state, lagging and erring engines, blocks held, models."""
    out: dict[str, dict] = {}
    for r in rows:
        g = out.get(r["server"])
        if g is None:
            g = out[r["server"]] = {"name": r["server"], "engines": 0, "dp_ranks": [],
                                    "states": {}, "lagging": 0, "errors": 0, "cached_blocks": 0,
                                    "models": []}
        g["engines"] += 1
        g["dp_ranks"].append(r["dp_rank"])
        st = state_of(r)
        g["states"][st] = g["states"].get(st, 0) + 1
        g["lagging"] += is_lagging(r)
        g["errors"] += has_errors(r)
        g["cached_blocks"] += r.get("cached_blocks") or 0
        if r.get("model") and r["model"] not in g["models"]:
            g["models"].append(r["model"])
    for g in out.values():
        ranks = sorted(g["dp_ranks"])
        # a server's ranks as a range when they are one (0..7), else listed (at most 16)
        g["dp_ranks"] = ({"first": ranks[0], "last": ranks[-1]} if ranks == list(range(ranks[0], ranks[-1] + 1))
                         else {"first": ranks[0], "last": ranks[-1], "some": ranks[:16]})
    return list(out.values())


def summary_of(rows: list[dict]) -> dict:
    """The whole fleet's engine figures, small whatever its size: engines and servers, engines
    by state, lagging and erring, blocks held (their sum over engines: a block held twice counts
    twice), the TOP engines and servers by blocks, and the engines' own prefix-cache hit ratio
    (their hits over their queries, from the engines whose /metrics are read)."""
    by_state: dict[str, int] = {}
    hits = queries = 0
    usage: list[float] = []
    for r in rows:
        st = state_of(r)
        by_state[st] = by_state.get(st, 0) + 1
        m = r.get("metrics") or {}
        if m.get("prefix_cache_queries") is not None:
            queries += m["prefix_cache_queries"]
            hits += m.get("prefix_cache_hits") or 0
        if m.get("kv_usage") is not None:
            usage.append(m["kv_usage"])
    groups = groups_of(rows)

    def top(items, key):
        return heapq.nlargest(TOP, items, key=key)

    return {
        "engines": len(rows), "servers": len(groups), "by_state": by_state,
        "lagging": sum(map(is_lagging, rows)), "errors": sum(map(has_errors, rows)),
        "cached_blocks": sum(r.get("cached_blocks") or 0 for r in rows),
        "top_engines": [{"name": r["name"], "server": r["server"], "cached_blocks": r.get("cached_blocks") or 0}
                        for r in top(rows, lambda r: r.get("cached_blocks") or 0)],
        "top_servers": [{"name": g["name"], "engines": g["engines"], "cached_blocks": g["cached_blocks"]}
                        for g in top(groups, lambda g: g["cached_blocks"])],
        "prefix_cache_queries": queries if queries else None,
        "prefix_cache_hits": hits if queries else None,
        "hit_ratio": round(hits / queries, 4) if queries else None,
        "engines_with_metrics": len(usage),
        "kv_usage_mean": round(sum(usage) / len(usage), 4) if usage else None,
        "lagging_ms": LAGGING_MS,
    }


def view_of(rows: list[dict], query: EngineQuery) -> dict:
    """What GET /api/fleets/{fleet} adds to the fleet's figures: `engines`, the page of the
    engines `query` matches; `engines_page` (`offset`, `limit`, `matched`, `total`);
    `groups`, the page of the servers of what matched (`groups_page` likewise, `total`: every
    server of the fleet); `summary` (`summary_of`) of the whole fleet."""
    hit = matching(rows, query)
    groups = groups_of(hit)
    summary = summary_of(rows)
    return {
        "engines": hit[query.offset:query.offset + query.limit],
        "engines_page": {"offset": query.offset, "limit": query.limit, "matched": len(hit),
                         "total": len(rows)},
        "groups": groups[query.groups_offset:query.groups_offset + query.groups_limit],
        "groups_page": {"offset": query.groups_offset, "limit": query.groups_limit,
                        "matched": len(groups), "total": summary["servers"]},
        "summary": summary,
    }
