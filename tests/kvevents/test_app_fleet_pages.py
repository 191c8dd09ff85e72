"""A 1,024-engine fleet's engine list over a real server (`kvscope fleet --play`, uvicorn, HTTP):
127 servers' 8 DP ranks played from a fleet recording plus 8 engines nobody answers, paged,
searched and summed up by GET /api/fleets/{fleet}; the maps of a subset from /blocks; the
bounds refused with 422 and nothing changed."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.apputil import assert_error
from support.fleet_recording import FleetPlayer, engine_name, write_dp_fleet

from kvevents.block_map import SUBSET_SET_NAMES
from kvevents.fleet_view import DEFAULT_LIMIT, FLAGS, MAX_LIMIT, MAX_NAMES, STATES, TOP
from kvevents.index import MAX_FLEET_ENGINES

SERVERS, RANKS = 127, 8
GONE = [f"gone-{i}" for i in range(MAX_FLEET_ENGINES - SERVERS * RANKS)]  # unreachable engines
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """The server, and what the test knows of its fleet: each engine's (server, model, state,
    blocks), in the fleet's order."""
    d = tmp_path_factory.mktemp("pages")
    held = write_dp_fleet(d / "dp.kvevents", SERVERS, RANKS)
    srv = FleetPlayer(d / "dp.kvevents", "big")
    try:
        # nobody listens on the GONE engines' endpoints: unreachable, each its own server
        srv.fill(held, [{"name": name, "endpoint": f"ipc://{d}/nobody-{i}.sock", **({"model": MODEL} if i % 2 else {})}
                        for i, name in enumerate(GONE)])
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            known = [{"name": n, "server": n.split(":dp")[0], "model": None, "state": "recorded",
                      "blocks": b} for n, b in held.items()]
            known += [{"name": n, "server": n, "model": MODEL if i % 2 else None,
                       "state": "unreachable", "blocks": 0} for i, n in enumerate(GONE)]
            yield c, known
    finally:
        log = srv.stop()
        assert "Traceback" not in log, log


def want_of(known, q="", state=None, groups=()):
    """The engines a query matches, from what the test knows of the fleet."""
    out = []
    for e in known:
        if groups and e["server"] not in groups:
            continue
        if state == "errors" and e["state"] != "unreachable":
            continue
        if state not in (None, "errors") and e["state"] != state:
            continue
        if q and not any(q.lower() in (v or "").lower() for v in (e["name"], e["server"], e["model"])):
            continue
        out.append(e)
    return out


def test_a_client_that_asks_nothing_gets_the_first_page_the_groups_and_the_summary(big):
    c, known = big
    r = c.get("/api/fleets/big")
    assert r.status_code == 200
    body = r.json()
    assert [e["name"] for e in body["engines"]] == [e["name"] for e in known[:DEFAULT_LIMIT]]
    assert body["engines_page"] == {"offset": 0, "limit": DEFAULT_LIMIT, "matched": MAX_FLEET_ENGINES,
                                    "total": MAX_FLEET_ENGINES}
    servers = list(dict.fromkeys(e["server"] for e in known))
    assert [g["name"] for g in body["groups"]] == servers[:DEFAULT_LIMIT]
    assert body["groups_page"]["total"] == body["groups_page"]["matched"] == len(servers) == SERVERS + len(GONE)
    g = body["groups"][3]
    assert g["engines"] == RANKS and g["dp_ranks"] == {"first": 0, "last": RANKS - 1}
    assert g["states"] == {"recorded": RANKS}
    assert g["cached_blocks"] == sum(e["blocks"] for e in known if e["server"] == g["name"])
    s = body["summary"]
    assert s["engines"] == MAX_FLEET_ENGINES and s["servers"] == len(servers)
    assert s["by_state"] == {"recorded": SERVERS * RANKS, "unreachable": len(GONE)}
    assert s["errors"] == len(GONE) and s["lagging"] == 0
    assert s["cached_blocks"] == sum(e["blocks"] for e in known)
    top = sorted(known, key=lambda e: -e["blocks"])[:TOP]  # stable: ties in the fleet's order
    assert [(t["name"], t["cached_blocks"]) for t in s["top_engines"]] == [(e["name"], e["blocks"]) for e in top]
    per = {}
    for e in known:
        per[e["server"]] = per.get(e["server"], 0) + e["blocks"]
    assert [t["name"] for t in s["top_servers"]] == sorted(per, key=lambda k: -per[k])[:TOP]
    assert s["hit_ratio"] is None  # no engine's /metrics are read here
    assert len(r.content) < 120_000, len(r.content)  # a 1,024-engine fleet's default page
    assert body["stats"]["engines"] == MAX_FLEET_ENGINES  # the fleet's figures as before


@settings(max_examples=20)
@given(q=st.sampled_from(["", "server-1", "SERVER-12", ":dp3", "dp7", "gone", "llama", "zzz", "-4"]),
       state=st.sampled_from([None, "recorded", "unreachable", "errors", "live"]),
       limit=st.integers(24, MAX_LIMIT), groups_limit=st.integers(1, 40))
def test_pages_put_together_are_the_filtered_list_and_its_groups(big, q, state, limit, groups_limit):
    c, known = big
    want = want_of(known, q, state)
    params = {"engines_q": q, "engines_limit": limit, "groups_limit": groups_limit, "samples": 0}
    if state:
        params["engines_state"] = state
    got, groups, offset = [], [], 0
    while True:
        body = c.get("/api/fleets/big", params={**params, "engines_offset": offset,
                                                "groups_offset": min(offset, MAX_FLEET_ENGINES)}).json()
        assert body["engines_page"]["matched"] == len(want)
        assert len(body["engines"]) <= limit and len(body["groups"]) <= groups_limit
        got += [e["name"] for e in body["engines"]]
        offset += limit
        if offset >= len(want):
            break
    assert got == [e["name"] for e in want]
    assert body["summary"]["engines"] == MAX_FLEET_ENGINES  # the summary is the whole fleet's
    servers = list(dict.fromkeys(e["server"] for e in want))
    offset = 0
    while offset < len(servers):
        body = c.get("/api/fleets/big", params={**params, "engines_limit": 0, "groups_offset": offset}).json()
        assert body["engines"] == [] and body["groups_page"]["matched"] == len(servers)
        groups += body["groups"]
        offset += groups_limit
    assert [g["name"] for g in groups] == servers
    for g in groups:
        assert g["engines"] == sum(e["server"] == g["name"] for e in want)


def test_a_group_s_ranks_and_only_their_maps(big):
    c, known = big
    group = "server-42"
    body = c.get("/api/fleets/big", params={"engines_group": group, "engines_limit": MAX_LIMIT}).json()
    assert [e["name"] for e in body["engines"]] == [engine_name(42, r) for r in range(RANKS)]
    assert [e["dp_rank"] for e in body["engines"]] == list(range(RANKS))
    full = c.get("/api/fleets/big/blocks")
    assert full.status_code == 200
    every = full.json()["engines"]
    assert len(every) == MAX_FLEET_ENGINES  # no parameter: every engine's map, as before
    sub = c.get("/api/fleets/big/blocks", params={"engines_group": group})
    maps = sub.json()
    assert list(maps["engines"]) == [engine_name(42, r) for r in range(RANKS)]
    assert all(maps["engines"][n] == every[n] for n in maps["engines"])
    assert maps["parent_cycles"] == {n: 0 for n in maps["engines"]}
    whole = full.json()
    assert {k: v for k, v in maps.items() if k not in ("engines", "parent_cycles", "prefixes")} == \
        {k: v for k, v in whole.items() if k not in ("engines", "parent_cycles", "prefixes")}
    # the largest groups as in the whole answer, each set naming at most SUBSET_SET_NAMES engines
    assert len(maps["prefixes"]) == len(whole["prefixes"])
    for p, q in zip(maps["prefixes"], whole["prefixes"]):
        assert [s["blocks"] for s in p["sets"]] == [s["blocks"] for s in q["sets"]]
        for s, t in zip(p["sets"], q["sets"]):
            assert s["engines"] == t["engines"][:SUBSET_SET_NAMES]
            assert s["more_engines"] == len(t["engines"]) - len(s["engines"])
    assert len(sub.content) * 10 < len(full.content), (len(sub.content), len(full.content))
    # by name (repeated; unknown names left out, a name twice once) and by the page's own params
    named = c.get("/api/fleets/big/blocks", params=[("engines", "server-7:dp2"), ("engines", "nope"),
                                                     ("engines", "server-7:dp2"), ("engines", "server-0")])
    assert list(named.json()["engines"]) == ["server-0", "server-7:dp2"]  # the fleet's order
    page = {"engines_q": "dp5", "engines_offset": 10, "engines_limit": 20}
    rows = c.get("/api/fleets/big", params=page).json()["engines"]
    assert list(c.get("/api/fleets/big/blocks", params=page).json()["engines"]) == [e["name"] for e in rows]
    assert len(rows) == 20 and all(e["name"].endswith(":dp5") for e in rows)
    unreachable = c.get("/api/fleets/big/blocks", params={"engines_state": "unreachable"}).json()
    assert list(unreachable["engines"]) == GONE and all(m["blocks"] == 0 for m in unreachable["engines"].values())
    json.loads(c.get("/api/fleets/big/blocks", params={"engines": "nope"}).content)  # no map: still JSON


BOUNDS = [
    ({"engines_limit": MAX_LIMIT + 1}, "engines_limit", f"less than or equal to {MAX_LIMIT}"),
    ({"engines_limit": -1}, "engines_limit", "greater than or equal to 0"),
    ({"engines_offset": -1}, "engines_offset", "greater than or equal to 0"),
    ({"engines_offset": MAX_FLEET_ENGINES + 1}, "engines_offset", f"less than or equal to {MAX_FLEET_ENGINES}"),
    ({"groups_limit": MAX_LIMIT + 1}, "groups_limit", f"less than or equal to {MAX_LIMIT}"),
    ({"engines_limit": "ten"}, "engines_limit", "integer"),
    ({"engines_state": "sleepy"}, "engines_state", "'unreachable'"),
    ({"engines_q": "x" * 81}, "engines_q", "at most 80 characters"),
    ([("engines_group", f"s{i}") for i in range(MAX_NAMES + 1)], "engines_group", f"at most {MAX_NAMES}"),
]


@pytest.mark.parametrize("route,params,field,says", [
    (route, *case) for route in ("", "/blocks") for case in BOUNDS
    if not (route and case[1] == "groups_limit")])  # /blocks pages engines only
def test_out_of_bounds_paging_is_refused_and_changes_nothing(big, route, params, field, says):
    c, _known = big
    before = c.get("/api/fleets/big", params={"engines_limit": 0, "samples": 0}).json()["summary"]
    e = assert_error(c.get(f"/api/fleets/big{route}", params=params), 422, "invalid_request")
    assert e["message"].startswith(field), e["message"]
    assert says in e["message"], e["message"]
    assert c.get("/api/fleets/big", params={"engines_limit": 0, "samples": 0}).json()["summary"] == before


def test_too_many_names_for_maps_are_refused(big):
    c, _known = big
    e = assert_error(c.get("/api/fleets/big/blocks", params=[("engines", f"e{i}") for i in range(MAX_NAMES + 1)]),
                     422, "invalid_request")
    assert e["message"].startswith("engines") and str(MAX_NAMES) in e["message"], e["message"]


def test_every_state_word_filters_and_a_page_past_the_end_is_empty(big):
    c, known = big
    for state in STATES + FLAGS:
        body = c.get("/api/fleets/big", params={"engines_state": state, "engines_limit": MAX_LIMIT}).json()
        want = want_of(known, state=state) if state != "lagging" else []  # played batches: no lag
        assert body["engines_page"]["matched"] == len(want), state
        assert [e["name"] for e in body["engines"]] == [e["name"] for e in want][:MAX_LIMIT]
    body = c.get("/api/fleets/big", params={"engines_offset": MAX_FLEET_ENGINES}).json()
    assert body["engines"] == [] and body["engines_page"]["matched"] == MAX_FLEET_ENGINES


def test_a_small_fleet_shows_every_engine_without_parameters(big, tmp_path):
    c, _known = big
    names = [f"small-{i}" for i in range(5)]
    r = c.post("/api/fleets", json={"name": "small", "engines": [
        {"name": n, "endpoint": f"ipc://{tmp_path}/{n}.sock", "server": "box" if i < 3 else None}
        for i, n in enumerate(names)]})
    assert r.status_code == 201, r.text
    try:
        assert [e["name"] for e in r.json()["engines"]] == names
        body = c.get("/api/fleets/small").json()
        assert [e["name"] for e in body["engines"]] == names
        assert [(g["name"], g["engines"]) for g in body["groups"]] == [("box", 3), ("small-3", 1), ("small-4", 1)]
        assert body["engines_page"]["matched"] == body["summary"]["engines"] == 5
    finally:
        assert c.delete("/api/fleets/small").status_code == 204
