"""The Routing view: a run started from the page routes the trace behind the ticked policies,
shows its progress and the same figures as the REST API; Stop ends a run. A live run links to
its fleet and switches its policy from the page."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_routing_view_runs_policies_and_shows_the_rest_figures(page, api, artifacts):
    page.goto("/#routing")
    page.wait_for_function("window.kvscope && window.kvscope.routing", timeout=30_000)
    assert page.is_visible("#f-routing") and not page.is_visible("#view-dashboard")
    # the defaults tick a baseline and the three engines' routers; keep two of them
    ticked = page.eval_on_selector_all("#f-routing input[name=policy]:checked", "els => els.map(e => e.value)")
    assert ticked == ["round_robin", "sglang_cache_aware", "dynamo_kv", "llmd_precise"]
    page.uncheck("#f-routing input[value=sglang_cache_aware]")
    page.uncheck("#f-routing input[value=llmd_precise]")
    page.fill("#f-routing [name=replicas]", "2")
    page.fill("#f-routing [name=capacity]", "200,000")
    page.fill("#f-routing [name=limit]", "300")
    page.click("#f-routing button[type=submit]")
    page.wait_for_function("(() => { const r = window.kvscope.routing(); return r.state === 'finished'; })()",
                           timeout=60_000)
    shown = page.evaluate("window.kvscope.routing()")
    run = api.get(f"/api/routing/{shown['id']}").json()["routing"]
    assert run["replicas"] == 2 and run["capacity_tokens"] == 200_000 and run["limit"] == 300
    assert shown["table"]["headers"][:4] == ["Policy", "Hit ratio", "Of pooled bound", "Imbalance"]
    cells = [row[:4] for row in shown["table"]["rows"]]
    assert cells == [[r["policy"], f"{100 * r['hit_ratio']:.1f}%", f"{100 * r['of_pooled_bound']:.0f}%",
                      f"{r['imbalance']:.2f}"] for r in run["results"]]
    assert [c[0] for c in cells] == ["round_robin", "dynamo_kv"]
    # the bounds line above the table: both limits of the run's N and C, as REST gives them
    b = run["bounds"]
    line = page.locator("#routing-bounds").inner_text()
    assert line == shown["bounds"] and page.is_visible("#routing-bounds")
    assert line.startswith("No routing of these requests over 2 replicas of 200,000 tokens can hit more than "
                           f"{100 * b['pooled_bound_hit_ratio']:.1f}% (pooled bound")
    assert f"or {100 * b['infinite_bound_hit_ratio']:.1f}% (infinite cache)" in line
    page.screenshot(path=str(artifacts / "e2e-routing-bounds.png"), full_page=True)
    assert page.locator("#routing-results tbody tr").count() == 2
    assert "finished" in page.locator("#routing-progress span").inner_text()
    latest = page.locator("#routing-decisions li").first.inner_text()
    assert latest.startswith("request 299 → replica ") and "lowest cost" in latest
    assert latest == shown["decisions"][0]

    # a long serving run, stopped from the page
    page.check("#f-routing input[value=llmd_precise]")
    page.fill("#f-routing [name=limit]", "12031")
    page.select_option("#f-routing [name=mode]", "serving")
    page.click("#f-routing button[type=submit]")
    page.wait_for_function("window.kvscope.routing().state === 'running' && window.kvscope.routing().done > 0",
                           timeout=60_000)
    page.click("#b-routing-stop")
    page.wait_for_function("window.kvscope.routing().state === 'stopped'", timeout=60_000)
    assert "stopped" in page.locator("#routing-progress span").inner_text()
    assert page.console_log.errors == []


def test_a_live_run_from_the_page_links_its_fleet_and_switches_policy(page, api):
    page.goto("/#routing")
    page.wait_for_function("window.kvscope && window.kvscope.routing", timeout=30_000)
    assert page.is_hidden("#routing-live")
    page.select_option("#f-routing [name=mode]", "live")
    page.fill("#f-routing [name=replicas]", "2")
    page.fill("#f-routing [name=capacity]", "200,000")
    page.fill("#f-routing [name=limit]", "3000")
    page.fill("#f-routing [name=speed]", "20")
    page.click("#f-routing button[type=submit]")  # the first ticked policy: round_robin
    page.wait_for_function("(() => { const r = window.kvscope.routing(); "
                           "return r.state === 'running' && r.decisions.length > 0; })()", timeout=60_000)
    shown = page.evaluate("window.kvscope.routing()")
    rid = shown["id"]
    assert shown["mode"] == "live" and shown["policy"] == "round_robin"
    assert shown["fleet"] == f"/?fleet=route-{rid}#fleet"
    assert page.get_attribute("#routing-fleet-link", "href") == shown["fleet"]
    assert [e["name"] for e in api.get(f"/api/fleets/route-{rid}").json()["engines"]] == ["r0", "r1"]
    assert shown["table"]["headers"][0] == "Replica" and len(shown["table"]["rows"]) == 2
    assert "[round_robin]: next in turn" in shown["decisions"][0]

    page.select_option("#routing-switch", "longest_prefix")
    page.click("#b-routing-switch")
    page.wait_for_function("(() => { const r = window.kvscope.routing(); return r.policy === 'longest_prefix' "
                           "&& r.decisions.length > 0 && r.decisions[0].includes('[longest_prefix]'); })()",
                           timeout=60_000)
    run = api.get(f"/api/routing/{rid}").json()["routing"]
    assert run["policy"] == "longest_prefix" and run["switches"][0]["policy"] == "longest_prefix"
    assert page.locator("#routing-decisions li").first.inner_text().startswith("request ")

    # the link opens the run's fleet in the Fleet view
    page.click("#routing-fleet-link")  # a navigation: the new document's scripts load later
    page.wait_for_url(f"**/?fleet=route-{rid}#fleet")
    page.wait_for_function(f"(() => {{ const k = window.kvscope, f = k && k.fleet && k.fleet(); "
                           f"return f && f.fleet === 'route-{rid}' && f.engines.length === 2; }})()",
                           timeout=60_000)
    r = api.post("/api/routing", json={"action": "stop", "id": rid})
    assert r.status_code == 200 and r.json()["routing"]["state"] == "stopped", r.text
    assert not [p for p in api.get("/api/pools").json()["pools"] if p["name"].startswith("route-")]
    assert api.get("/api/fleets").json()["fleets"] == []
    assert page.console_log.errors == []


def test_a_live_comparison_from_the_page_shows_two_columns_each_linking_its_fleet(page, api):
    page.goto("/#routing")
    page.wait_for_function("window.kvscope && window.kvscope.routing", timeout=30_000)
    assert page.is_hidden("#routing-sides")
    page.select_option("#f-routing [name=mode]", "live")
    page.fill("#f-routing [name=replicas]", "2")
    page.fill("#f-routing [name=capacity]", "200,000")
    page.fill("#f-routing [name=limit]", "3000")
    page.fill("#f-routing [name=speed]", "20")
    page.check("#f-routing [name=compare]")  # the first two ticked: round_robin, sglang_cache_aware
    page.click("#f-routing button[type=submit]")
    page.wait_for_function("(() => { const r = window.kvscope.routing(); return r.state === 'running' "
                           "&& r.sides.length === 2 && r.sides.every(s => s.decisions.length > 0); })()",
                           timeout=60_000)
    shown = page.evaluate("window.kvscope.routing()")
    rid = shown["id"]
    assert [c["title"] for c in shown["sides"]] == ["a: round_robin", "b: sglang_cache_aware"]
    assert [c["fleet"] for c in shown["sides"]] == [f"/?fleet=route-{rid}-{s}#fleet" for s in "ab"]
    # two columns side by side, each with its replicas, its decisions and a link to its own fleet
    assert page.is_visible("#routing-sides") and page.is_hidden("#routing-results")
    assert page.is_hidden("#routing-live")  # no switching in a comparison
    cols = page.locator("#routing-sides .routing-side")
    assert cols.count() == 2
    boxes = [cols.nth(i).bounding_box() for i in range(2)]
    assert boxes[1]["x"] > boxes[0]["x"] + boxes[0]["width"] / 2 and abs(boxes[1]["y"] - boxes[0]["y"]) < 2
    for i, side in enumerate("ab"):
        col = cols.nth(i)
        assert col.locator("a.side-fleet").get_attribute("href") == f"/?fleet=route-{rid}-{side}#fleet"
        assert col.locator("tbody tr").count() == 2
        assert col.locator("ol.decisions li").count() > 0
    assert "[sglang_cache_aware]" in cols.nth(1).locator("ol.decisions li").first.inner_text()
    assert " vs " in page.locator("#routing-progress span").inner_text()
    fleets = sorted(f["name"] for f in api.get("/api/fleets").json()["fleets"])
    assert fleets == [f"route-{rid}-a", f"route-{rid}-b"]

    # side b's link opens its fleet in the Fleet view
    cols.nth(1).locator("a.side-fleet").click()  # a navigation, as above
    page.wait_for_url(f"**/?fleet=route-{rid}-b#fleet")
    page.wait_for_function(f"(() => {{ const k = window.kvscope, f = k && k.fleet && k.fleet(); "
                           f"return f && f.fleet === 'route-{rid}-b' && f.engines.length === 2; }})()",
                           timeout=60_000)
    r = api.post("/api/routing", json={"action": "stop", "id": rid})
    assert r.status_code == 200 and r.json()["routing"]["state"] == "stopped", r.text
    assert not [p for p in api.get("/api/pools").json()["pools"] if p["name"].startswith("route-")]
    assert api.get("/api/fleets").json()["fleets"] == []
    assert page.console_log.errors == []


def test_the_decision_explorer_filters_pages_and_opens_a_decision(page, api, artifacts):
    page.goto("/#routing")
    page.wait_for_function("window.kvscope && window.kvscope.routing", timeout=30_000)
    for name in ("round_robin", "sglang_cache_aware", "dynamo_kv", "llmd_precise"):
        page.uncheck(f"#f-routing input[value={name}]")
    page.check("#f-routing input[value=sglang_cache_aware]")
    page.fill("#f-routing [name=replicas]", "3")
    page.fill("#f-routing [name=capacity]", "300,000")
    page.fill("#f-routing [name=limit]", "400")
    page.select_option("#f-routing [name=mode]", "sequence")
    page.click("#f-routing button[type=submit]")
    page.wait_for_function("window.kvscope.routing().state === 'finished'", timeout=60_000)
    rid = page.evaluate("window.kvscope.routing().id")
    assert page.is_visible("#routing-explorer")
    assert page.eval_on_selector_all("#decisions-policy option", "els => els.map(e => e.value)") == \
        ["sglang_cache_aware"]
    # the first page: 50 of 400, as REST pages them
    page.click("#f-decisions button[type=submit]")
    page.wait_for_function("document.querySelector('#decisions-where').textContent.includes('of 400')",
                           timeout=30_000)
    assert page.locator("#decisions-where").inner_text() == "1–50 of 400 decisions"
    assert page.locator("#decisions-table tbody tr").count() == 50
    page.click("#b-decisions-next")
    page.wait_for_function("document.querySelector('#decisions-where').textContent.startsWith('51–')",
                           timeout=30_000)
    first = page.locator("#decisions-table tbody tr").first.locator("td").first.inner_text()
    assert first == "50"
    # filtered by a rule and a replica: the count is the server's
    rest = api.get(f"/api/routing/{rid}/decisions", params={"rule": "match", "replica": 1}).json()
    page.select_option("#decisions-rule", "match")
    page.fill("#decisions-replica", "1")
    page.click("#f-decisions button[type=submit]")
    page.wait_for_function(
        f"document.querySelector('#decisions-where').textContent.endsWith('of {rest['total']} decisions')",
        timeout=30_000)
    rows = page.locator("#decisions-table tbody tr")
    assert rows.count() == min(50, rest["total"]) > 0
    for i in range(min(5, rows.count())):
        cells = rows.nth(i).locator("td")
        assert cells.nth(1).inner_text() == "1" and cells.nth(2).inner_text() == "match"
    # one request opened: its candidates, the chosen one marked, as REST has them
    rows.first.click()
    assert page.is_visible("#decision-detail")
    want = rest["decisions"][0]
    assert page.locator("#decision-title").inner_text() == \
        f"request {want['request']} → replica 1 (sglang_cache_aware: match)"
    cand = page.locator("#decision-candidates tbody tr")
    assert cand.count() == 3
    assert [cand.nth(r).locator("td").nth(1).inner_text() for r in range(3)] == \
        [str(c["matched_blocks"]) for c in want["candidates"]]
    assert cand.nth(1).locator("td").nth(4).inner_text() == "chosen"
    page.screenshot(path=str(artifacts / "e2e-routing-decisions.png"), full_page=True)
    # a bad filter says so, and asks nothing
    page.fill("#decisions-replica", "-2")
    page.click("#f-decisions button[type=submit]")
    assert "replica must be a whole number" in page.locator("#decisions-where").inner_text()
    assert page.console_log.errors == []


def test_a_router_run_from_the_page_goes_through_the_real_router_and_links_its_fleet(page, api, artifacts):
    page.goto("/#routing")
    page.wait_for_function("window.kvscope && window.kvscope.routing", timeout=30_000)
    page.select_option("#f-routing [name=mode]", "router")
    page.select_option("#f-routing [name=router]", "sglang")
    page.fill("#f-routing [name=replicas]", "2")
    page.fill("#f-routing [name=capacity]", "300,000")
    page.fill("#f-routing [name=limit]", "200")
    page.fill("#f-routing [name=speed]", "20")
    page.click("#f-routing button[type=submit]")
    page.wait_for_function("window.kvscope.routing().state === 'finished'", timeout=120_000)
    shown = page.evaluate("window.kvscope.routing()")
    rid = shown["id"]
    run = api.get(f"/api/routing/{rid}").json()["routing"]
    assert run["mode"] == "router" and run["router"] == "sglang"
    row = run["results"][0]
    assert shown["table"]["headers"][:3] == ["Router", "Hit ratio (decisions)", "Engines' counters"]
    assert shown["table"]["rows"][0][:3] == ["router:sglang", f"{100 * row['hit_ratio']:.1f}%",
                                             f"{100 * row['engine_hit_ratio']:.1f}%"]
    assert shown["fleet"] == f"/?fleet=route-{rid}#fleet"
    assert page.is_visible("#routing-fleet-link") and page.is_hidden("#routing-switch-box")
    # the runs list names it, and the explorer pages its decisions, recorded at the engines
    page.wait_for_function(f"document.querySelector('#routing-runs').innerText.includes('{rid}: router "
                           "sglang (finished)')", timeout=30_000)
    page.click("#f-decisions button[type=submit]")
    page.wait_for_function("window.kvscope.routing().explorer.rows > 0", timeout=30_000)
    where = page.locator("#decisions-where").inner_text()
    assert where.endswith("of 200 decisions"), where
    page.locator("#decisions-table tbody tr").first.click()
    assert page.is_visible("#decision-fleet")
    page.screenshot(path=str(artifacts / "e2e-routing-router.png"), full_page=True)
    assert api.delete(f"/api/routing/{rid}").status_code == 204
    assert api.get("/api/fleets").json()["fleets"] == []
    assert page.console_log.errors == []
