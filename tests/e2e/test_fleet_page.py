"""The Fleet view in Chromium: two engines (different hash seeds, the same prompts) fed through
real sockets, each engine's map painted block by block, duplicated prefixes found, the match box
answering as the REST match does, an unreachable engine shown as such; and under the real CSP."""

from __future__ import annotations

import os
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from support.kve_source import RefPrefixCache

from kvevents.codec import Removed, Stored
from kvevents.publisher import Publisher

from .conftest import ROOT
from .test_csp import wait_until

pytestmark = pytest.mark.e2e

# The fleet view's state once the page's scripts have set it up (null before: a probe right after
# a navigation or reload must not throw).
FLEET = "(window.kvscope && window.kvscope.fleet && window.kvscope.fleet())"


@pytest.fixture
def fleet(api, tmp_path):
    pubs, srcs = {}, {}
    shared = RefPrefixCache(seed=1, hash_seed=11)
    for i, name in enumerate(("e0", "e1")):
        pubs[name] = Publisher("tcp://127.0.0.1:*", bind=True, topic="kv")  # the OS picks the port
        srcs[name] = RefPrefixCache(seed=i + 1, hash_seed=11 + 100 * i)
        srcs[name].prompts = shared.prompts
    api.delete("/api/fleets/e2e")
    engines = [{"name": n, "endpoint": p.endpoint, "topic": "kv", "block_size": 4} for n, p in pubs.items()]
    engines.append({"name": "gone", "endpoint": f"ipc://{tmp_path}/nobody.sock"})
    r = api.post("/api/fleets", json={"name": "e2e", "engines": engines})
    assert r.status_code == 201, r.text

    def rows():
        return {e["name"]: e for e in api.get("/api/fleets/e2e").json()["engines"]}

    end = time.monotonic() + 30
    while any(rows()[n]["stream"]["last_seq"] is None for n in pubs):  # no replay socket here
        assert time.monotonic() < end, rows()
        for p in pubs.values():
            p.publish([])
        time.sleep(0.1)
    for _ in range(15):
        for n, p in pubs.items():
            p.publish(srcs[n].step())
    end = time.monotonic() + 30
    while any(rows()[n]["cached_blocks"] != len(srcs[n].cached) for n in pubs):
        assert time.monotonic() < end, rows()
        time.sleep(0.05)
    yield srcs
    api.delete("/api/fleets/e2e")
    for p in pubs.values():
        p.close()


def shown_match(page) -> dict:
    return {el.get_attribute("data-engine"): int(el.get_attribute("data-blocks"))
            for el in page.locator(".fleet-match-row").all()}


def wait_shown(page, want: dict, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while shown_match(page) != want:
        assert time.monotonic() < end, (shown_match(page), want)
        time.sleep(0.1)


def test_fleet_view_paints_every_engine_and_matches(page, api, fleet, artifacts):
    page.goto("/?fleet=e2e#fleet")
    want = {n: len(s.cached) for n, s in fleet.items()}
    page.wait_for_function(
        f"(() => {{ const f = {FLEET}; "
        f"return f && f.painted.e0 === {want['e0']} && f.painted.e1 === {want['e1']}; }})()", timeout=30_000)
    stats = api.get("/api/fleets/e2e").json()["stats"]
    assert stats["duplicated_blocks"] > 0
    numbers = page.locator("#fleet-numbers").inner_text().lower()
    assert "duplicated blocks" in numbers and "missed reuse" in numbers
    # every engine's canvas has painted pixels; the unreachable one says so
    for n in ("e0", "e1"):
        filled = page.evaluate(
            """(n) => { const c = document.querySelector(`.fleet-engine[data-engine="${n}"] canvas`);
                 const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                 let k = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) k++; return k; }""", n)
        assert filled >= want[n] * 16, (n, filled)
    page.wait_for_selector('.fleet-engine[data-engine="gone"] .state[data-state="unreachable"]', timeout=30_000)
    page.wait_for_selector("#fleet-prefixes .fleet-set.shared", timeout=30_000)
    # a recent stored chain from the picker
    page.wait_for_function("document.querySelectorAll('#fleet-recent option').length > 1", timeout=30_000)
    key = page.locator("#fleet-recent option").nth(1).get_attribute("value")
    page.select_option("#fleet-recent", key)
    want_chain = api.post("/api/fleets/e2e/match", json={"key": key}).json()["engines"]
    wait_shown(page, want_chain)
    # the match box
    prompt = fleet["e0"].prompts[0]
    page.fill("#fleet-tokens", ", ".join(map(str, prompt)))
    page.click("#f-fleet-match button[type=submit]")
    wait_shown(page, api.post("/api/fleets/e2e/match", json={"tokens": prompt}).json()["engines"])
    page.fill("#fleet-tokens", "1, two")
    page.click("#f-fleet-match button[type=submit]")
    page.wait_for_function("document.querySelector('#fleet-match-out').textContent.includes('not a token id')")
    page.screenshot(path=str(artifacts / "fleet-view.png"), full_page=True)
    assert page.console_log.errors == []


def test_fleet_view_runs_under_the_csp(browser, server, fleet):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=server)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto("/?fleet=e2e#fleet")
        wait_until(page, "window.kvscope.fleet().painted.e0 > 0", 30)
        wait_until(page, "document.querySelectorAll('#fleet-prefixes .swatch').length > 0", 30)
        color = page.evaluate("getComputedStyle(document.querySelector('#fleet-prefixes .swatch')).backgroundColor")
        assert color not in ("", "rgba(0, 0, 0, 0)")
        assert errors == []
    finally:
        context.close()


def test_an_engine_that_offloaded_shows_its_cpu_tier(page, api, artifacts):
    """An engine (kvscope's publisher, vLLM's wire: BlockStored with medium) copies its chain to
    the CPU and evicts all but the first block from the GPU: its line on the page counts GPU 1,
    CPU 4, its map paints the GPU's one block, the legend says the maps are the GPU's."""
    api.delete("/api/fleets/e2e-tiers")
    pub = Publisher("tcp://127.0.0.1:*", bind=True, topic="kv")
    try:
        r = api.post("/api/fleets", json={"name": "e2e-tiers", "engines": [
            {"name": "t0", "endpoint": pub.endpoint, "topic": "kv", "block_size": 4}]})
        assert r.status_code == 201, r.text

        def row() -> dict:
            return api.get("/api/fleets/e2e-tiers").json()["engines"][0]
        end = time.monotonic() + 30
        while row()["stream"]["last_seq"] is None:
            assert time.monotonic() < end, row()
            pub.publish([])
            time.sleep(0.1)
        tokens = list(range(100, 116))
        hashes = [11, 12, 13, 14]
        pub.publish([Stored(hashes, None, tokens, 4, "GPU"), Stored(hashes, None, tokens, 4, "CPU"),
                     Removed(hashes[1:], "GPU")])
        end = time.monotonic() + 30
        while row()["tiers"] != {"gpu": 1, "cpu": 4}:
            assert time.monotonic() < end, row()
            time.sleep(0.05)
        page.goto("/?fleet=e2e-tiers#fleet")
        engine = page.locator('.fleet-engine[data-engine="t0"]')
        engine.locator('.fleet-tier[data-tier="cpu"]').wait_for(timeout=30_000)
        assert engine.locator('.fleet-tier[data-tier="cpu"]').inner_text() == "CPU 4"
        assert engine.locator('.fleet-tier[data-tier="gpu"]').inner_text() == "GPU 1"
        page.wait_for_function(f"(() => {{ const f = {FLEET}; return f && f.painted.t0 === 1; }})()",
                               timeout=30_000)
        assert "The maps are the GPU's blocks" in page.locator("#fleet-legend").inner_text()
        page.screenshot(path=str(artifacts / "fleet-tiers.png"))
        assert page.console_log.errors == []
    finally:
        api.delete("/api/fleets/e2e-tiers")
        pub.close()


def test_fleet_view_opens_the_fleet_named_in_the_address(page, api, tmp_path):
    """`/?fleet=NAME#fleet` (the link `kvscope demo` prints) opens that fleet even when it is not
    the first; choosing another in the picker puts it in the address, so a reload keeps it."""
    names = ("e2e-url-first", "e2e-url-second")
    for n in names:
        api.delete(f"/api/fleets/{n}")
        r = api.post("/api/fleets", json={"name": n, "engines": [
            {"name": f"{n}-engine", "endpoint": f"ipc://{tmp_path}/{n}.sock"}]})
        assert r.status_code == 201, r.text
    try:
        listed = [f["name"] for f in api.get("/api/fleets").json()["fleets"]]
        assert listed.index(names[0]) < listed.index(names[1])
        page.goto(f"/?fleet={names[1]}#fleet")
        page.wait_for_function(
            f"({FLEET} || {{engines: []}}).engines.join() === '{names[1]}-engine'", timeout=30_000)
        assert page.locator("#fleet-select").input_value() == names[1]
        assert page.locator("#view-fleet").is_visible()
        page.select_option("#fleet-select", names[0])
        page.wait_for_function(
            f"({FLEET} || {{engines: []}}).engines.join() === '{names[0]}-engine'", timeout=30_000)
        url = urlsplit(page.url)
        assert parse_qs(url.query)["fleet"] == [names[0]] and url.fragment == "fleet", page.url
        page.reload()
        page.wait_for_function(
            f"({FLEET} || {{engines: []}}).engines.join() === '{names[0]}-engine'", timeout=30_000)
        assert page.locator("#fleet-select").input_value() == names[0]
        assert page.console_log.errors == []
    finally:
        for n in names:
            api.delete(f"/api/fleets/{n}")


def test_a_live_routing_run_s_fleet_shows_its_requests_apart(page, api, artifacts):
    """On the bundled Mooncake trace every request starts with the same block: the maps colour
    the subtrees below that shared trunk, so each engine's map shows many colours."""
    r = api.post("/api/routing", json={"mode": "live", "replicas": 2, "capacity_tokens": 400_000,
                                       "policy": "round_robin", "limit": 400, "speed": 1e5})
    assert r.status_code == 202, r.text
    rid, fleet = r.json()["routing"]["id"], r.json()["routing"]["fleet"]
    try:
        end = time.monotonic() + 120
        while api.get(f"/api/routing/{rid}").json()["routing"]["state"] != "finished":
            assert time.monotonic() < end, api.get(f"/api/routing/{rid}").json()["routing"]["state"]
            time.sleep(0.2)
        want = {p: api.get(f"/api/pools/route-{rid}-{p}/stats").json()["prefix"]["cached_hashes"]
                for p in ("r0", "r1")}

        def held() -> dict:
            return {e["name"]: e["cached_blocks"] for e in api.get(f"/api/fleets/{fleet}").json()["engines"]}

        while held() != want:  # the fleet has mirrored every block of both pools
            assert time.monotonic() < end, (held(), want)
            time.sleep(0.2)
        blocks = api.get(f"/api/fleets/{fleet}/blocks").json()
        roots = {p["key"] for p in blocks["prefixes"]}
        assert blocks["shared_blocks"] >= 1  # the trunk every request shares
        for name in ("r0", "r1"):
            colors = set(blocks["engines"][name]["colors"])
            assert len(colors - {0}) > 1, (name, colors)
        assert blocks["prefixes"] and all(len(p["sets"]) >= 1 for p in blocks["prefixes"])
        assert len(roots) == len(blocks["prefixes"])

        page.goto(f"/?fleet={fleet}#fleet")
        page.wait_for_function(
            f"(() => {{ const f = {FLEET}; return f && f.painted.r0 > 0 && f.painted.r1 > 0; }})()",
            timeout=30_000)
        shown = page.evaluate(FLEET)
        assert shown["colors"]["r0"] > 1 and shown["colors"]["r1"] > 1, shown["colors"]
        for name in ("r0", "r1"):  # distinct colours of the painted cells on the canvas itself
            painted = page.evaluate(
                """(n) => { const c = document.querySelector(`.fleet-engine[data-engine="${n}"] canvas`);
                     const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                     const s = new Set(); for (let i = 0; i < d.length; i += 4) """
                """if (d[i + 3]) s.add(d[i] << 16 | d[i + 1] << 8 | d[i + 2]);
                     return s.size; }""", name)
            assert painted > 2, (name, painted)
        legend = page.locator("#fleet-legend").inner_text()
        assert "subtree" in legend and "shared trunk" in legend, legend
        assert "cannot be seen" not in page.locator("#fleet-engines").inner_text()
        page.screenshot(path=str(artifacts / "fleet-routing-live.png"))
        if os.environ.get("KVSCOPE_UPDATE_SCREENSHOTS"):  # the README's picture of this view
            page.screenshot(path=str(ROOT / "docs" / "screenshots" / "fleet-routing-live.png"))
        assert page.console_log.errors == []
    finally:
        api.post("/api/routing", json={"action": "stop", "id": rid})
