"""The engine list's pages, groups and summary (kvevents/fleet_view.py) as properties over
random rows, a recorded engine's server read back from its name, and the maps of a subset cut
from a real layout (`Maps.only`) equal to the whole answer's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents.block_map import BlockMap
from kvevents.codec import Stored
from kvevents.fleet_view import (
    FLAGS,
    STATES,
    EngineQuery,
    groups_of,
    matching,
    page_names,
    recorded_server,
    summary_of,
    view_of,
)
from kvevents.index import FleetIndex, engine_color_lists

SERVERS = ["s0", "s1", "pod-a", "worker-7"]


@st.composite
def fleets(draw):
    """Engine rows as Fleet.engines() gives them (the fields the view reads)."""
    rows, seen = [], set()
    for _ in range(draw(st.integers(0, 40))):
        server = draw(st.sampled_from(SERVERS))
        rank = draw(st.integers(0, 9))
        name = server if rank == 0 else f"{server}:dp{rank}"
        if name in seen:
            continue
        seen.add(name)
        stream = {"state": draw(st.sampled_from(STATES)),
                  "apply_lag_p99_ms": draw(st.one_of(st.none(), st.floats(0, 5000))),
                  "error_count": draw(st.integers(0, 2)), "lost_batches": 0}
        queries = draw(st.one_of(st.none(), st.integers(0, 1000)))
        rows.append({"name": name, "server": server, "dp_rank": rank,
                     "model": draw(st.sampled_from([None, "llama", "Qwen"])),
                     "cached_blocks": draw(st.integers(0, 500)), "stream": stream, "errors": [],
                     "malformed_events": 0,
                     "metrics": None if queries is None else {
                         "prefix_cache_queries": queries, "prefix_cache_hits": queries // 3,
                         "kv_usage": 0.5}})
    return rows


queries = st.builds(EngineQuery, q=st.sampled_from(["", "s1", "DP3", "pod", "llama", "nothing"]),
                    state=st.one_of(st.none(), st.sampled_from(STATES + FLAGS)),
                    groups=st.sampled_from([(), ("s0",), ("s1", "pod-a")]),
                    names=st.sampled_from([(), ("s0", "s1:dp2")]))


@settings(max_examples=200)
@given(rows=fleets(), query=queries, limit=st.integers(1, 9))
def test_pages_put_together_are_what_matched_and_the_groups_partition_it(rows, query, limit):
    hit = matching(rows, query)
    got, offset = [], 0
    while True:
        page = view_of(rows, EngineQuery(offset=offset, limit=limit, q=query.q, state=query.state,
                                         groups=query.groups, names=query.names,
                                         groups_offset=offset, groups_limit=limit))
        assert page["engines_page"] == {"offset": offset, "limit": limit, "matched": len(hit), "total": len(rows)}
        assert len(page["engines"]) == min(limit, max(0, len(hit) - offset))
        got += page["engines"]
        offset += limit
        if offset >= len(hit):
            break
    assert got == hit
    for r in hit:  # each one matched for what the query says
        if query.q:
            assert any(query.q.lower() in (v or "").lower() for v in (r["name"], r["server"], r["model"]))
        if query.groups:
            assert r["server"] in query.groups
        if query.state in STATES:
            assert r["stream"]["state"] == query.state
    groups = groups_of(hit)
    assert [g["name"] for g in groups] == list(dict.fromkeys(r["server"] for r in hit))
    assert sum(g["engines"] for g in groups) == len(hit)
    for g in groups:
        mine = [r for r in hit if r["server"] == g["name"]]
        assert g["cached_blocks"] == sum(r["cached_blocks"] for r in mine)
        assert g["states"] == {s: sum(r["stream"]["state"] == s for r in mine) for s in g["states"]}
        assert (g["dp_ranks"]["first"], g["dp_ranks"]["last"]) == (min(r["dp_rank"] for r in mine),
                                                                    max(r["dp_rank"] for r in mine))
    assert page_names(rows, EngineQuery(limit=limit, q=query.q, state=query.state)) == \
        [r["name"] for r in matching(rows, EngineQuery(q=query.q, state=query.state))][:limit]


@settings(max_examples=200)
@given(rows=fleets())
def test_the_summary_counts_every_engine(rows):
    s = summary_of(rows)
    assert s["engines"] == len(rows) and sum(s["by_state"].values()) == len(rows)
    assert s["servers"] == len({r["server"] for r in rows})
    assert s["cached_blocks"] == sum(r["cached_blocks"] for r in rows)
    assert s["lagging"] == sum((r["stream"]["apply_lag_p99_ms"] or 0) > s["lagging_ms"] for r in rows)
    top = sorted(rows, key=lambda r: -r["cached_blocks"])[:8]
    assert [t["name"] for t in s["top_engines"]] == [r["name"] for r in top]
    read = [r["metrics"] for r in rows if r["metrics"]]
    q = sum(m["prefix_cache_queries"] for m in read)
    assert s["hit_ratio"] == (round(sum(m["prefix_cache_hits"] for m in read) / q, 4) if q else None)
    assert len(json.dumps(s)) < 2500  # small whatever the fleet


@given(server=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,20}", fullmatch=True), rank=st.integers(0, 1023))
def test_a_recorded_engine_s_server_and_rank_come_back_from_its_name(server, rank):
    name = server if rank == 0 else f"{server}:dp{rank}"
    assert recorded_server(name) == (server, rank)


@settings(max_examples=40)
@given(held=st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=12), min_size=1, max_size=12),
       pick=st.lists(st.integers(0, 14), max_size=8))
def test_the_maps_of_a_subset_are_the_whole_answer_s(held, pick):
    index = FleetIndex()
    names = [f"e{i}" if i % 3 else f"e{i // 3}:dp{i}" for i in range(len(held))]
    for e, (name, chain) in enumerate(zip(names, held)):
        index.add(name)
        if chain:
            index.apply(e, [Stored([e * 100 + k + 1 for k in range(len(chain))], None,
                                   [t for c in chain for t in (c, c)], 2)])
    bm = BlockMap()
    maps = bm.compute(bm.snapshot(index))
    whole = json.loads(maps.body)
    want = [names[i] for i in pick if i < len(names)]
    sub = json.loads(maps.only(want))
    assert list(sub["engines"]) == list(dict.fromkeys(want))
    assert all(sub["engines"][n] == whole["engines"][n] for n in sub["engines"])
    assert sub["parent_cycles"] == {n: whole["parent_cycles"][n] for n in sub["engines"]}
    for k in ("version", "max_group_blocks", "shared_blocks", "cycles"):
        assert sub[k] == whole[k]
    assert [[(s["blocks"], len(s["engines"]) + s["more_engines"]) for s in p["sets"]] for p in sub["prefixes"]] == \
        [[(s["blocks"], len(s["engines"])) for s in p["sets"]] for p in whole["prefixes"]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, (1 << 24) - 1), max_size=40), min_size=1, max_size=6),
       st.integers(0, 50), st.data())
def test_the_compiled_colour_lists_are_each_engines_colours_sorted_and_cut(per_engine, limit, data):
    """`engine_color_lists` against numpy: engine e's colours gathered through `positions`,
    sorted, the first `limit` written as a JSON list, with the count of all of them."""
    colors = np.array([c for cs in per_engine for c in cs] or [0], dtype=np.int64)
    perm = np.array(data.draw(st.permutations(range(colors.size))), dtype=np.int64)
    shuffled = np.empty_like(colors)
    shuffled[perm] = colors  # colour i of the flat list sits at perm[i]
    positions = perm[:sum(map(len, per_engine))].astype(np.int32)
    by_engine = np.zeros(len(per_engine) + 1, dtype=np.int64)
    by_engine[1:] = np.cumsum([len(cs) for cs in per_engine])
    eids = data.draw(st.lists(st.integers(0, len(per_engine) - 1), max_size=8))
    got = engine_color_lists(shuffled, positions, by_engine, eids, limit)
    assert [(n, json.loads(b)) for n, b in got] == \
        [(len(per_engine[e]), sorted(per_engine[e])[:limit]) for e in eids]
    with pytest.raises(ValueError):
        engine_color_lists(shuffled, positions, by_engine, [len(per_engine)], limit)
