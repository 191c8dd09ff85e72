"""The Fleet view of a 1,024-engine fleet in Chromium: 127 servers' 8 DP ranks played into a real
`kvscope fleet --play` server, and 8 engines nobody answers. The page shows the summary and the
servers one row each, paged; a search narrows the list to one server, opening it draws its
ranks' maps and only theirs; a state filter lists the unreachable engines; and every answer the
page fetches stays small."""

from __future__ import annotations

import json
import os
import re

import pytest
from support.fleet_recording import FleetPlayer, blocks_of, engine_name, write_dp_fleet

from kvevents.index import MAX_FLEET_ENGINES

from .conftest import BYPASS_CSP, ROOT, ConsoleLog

pytestmark = pytest.mark.e2e

SERVERS, RANKS = 127, 8
GONE = [f"gone-{i}" for i in range(MAX_FLEET_ENGINES - SERVERS * RANKS)]
FLEET = "(window.kvscope && window.kvscope.fleet && window.kvscope.fleet())"
MAX_ANSWER = 100_000  # bytes: any answer the page fetches (the whole fleet's rows are ~0.8 MB)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet-large")
    held = write_dp_fleet(d / "dp.kvevents", SERVERS, RANKS)
    srv = FleetPlayer(d / "dp.kvevents", "big")
    try:
        srv.fill(held, [{"name": name, "endpoint": f"ipc://{d}/nobody-{i}.sock"} for i, name in enumerate(GONE)])
        yield srv, held
    finally:
        log = srv.stop()
        assert "Traceback" not in log, log


@pytest.fixture
def page(browser, big):
    srv, _held = big
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=srv.url, bypass_csp=BYPASS_CSP)
    pg = context.new_page()
    console = ConsoleLog()
    console.attach(pg)
    pg.console_log = console  # type: ignore[attr-defined]
    answers: list[tuple[str, int]] = []  # (url, bytes) of every fleet answer the page fetched

    def seen(response) -> None:
        if "/api/fleets/big" in response.url:
            answers.append((response.url, int(response.headers.get("content-length", "-1"))))
    pg.on("response", seen)
    pg.answers = answers  # type: ignore[attr-defined]
    yield pg
    context.close()


def wait_for(page, js: str, timeout_s: float = 30) -> None:
    page.wait_for_function(f"(() => {{ const f = {FLEET}; return f && ({js}); }})()", timeout=timeout_s * 1000)


def shown(page) -> dict:
    return page.evaluate(FLEET)


def test_a_1024_engine_fleet_shows_its_summary_and_servers_and_draws_only_the_opened_maps(page, big, artifacts):
    _srv, held = big
    page.goto("/?fleet=big#fleet")
    wait_for(page, "f.large && f.groups.length === 20")
    f = shown(page)
    assert f["groups"] == [f"server-{s}" for s in range(20)] and f["painted"] == {} and f["engines"] == []
    summary = page.locator("#fleet-summary").inner_text()
    assert re.search(r"ENGINES\s*1,024\s*on 135 servers", summary, re.I), summary
    assert "1,016 recorded" in summary and "8 unreachable" in summary and "8 with errors" in summary, summary
    assert f"{sum(held.values()):,}" in summary
    assert page.locator("#fleet-page-of").inner_text() == "servers 1–20 of 135"
    assert page.locator(".fleet-group").count() == 20 and page.locator("canvas.fleet-map").count() == 0
    row = page.locator('.fleet-group[data-group="server-3"] .fleet-group-head').inner_text()
    assert "8 ranks · dp 0–7" in row and "8 recorded" in row, row
    assert f"{sum(blocks_of(3, r) for r in range(RANKS))} blocks" in row, row

    page.click("#fleet-next")
    wait_for(page, "f.groups[0] === 'server-20'")
    assert page.locator("#fleet-page-of").inner_text() == "servers 21–40 of 135"
    page.click("#fleet-prev")
    wait_for(page, "f.groups[0] === 'server-0'")

    # a search narrows the list to one server; opening it draws its 8 ranks' maps, no other
    page.fill("#fleet-search", "server-42")
    wait_for(page, "f.groups.join() === 'server-42'")
    assert page.locator("#fleet-page-of").inner_text() == "servers 1–1 of 1 matching (135 in all)"
    page.click('.fleet-group[data-group="server-42"] .fleet-group-head')
    ranks = [engine_name(42, r) for r in range(RANKS)]
    want = {n: held[n] for n in ranks}
    wait_for(page, f"JSON.stringify(f.painted) === {json.dumps(json.dumps(want, separators=(',', ':')))}")
    assert page.locator("canvas.fleet-map").count() == RANKS
    assert [int(x) for x in page.locator('.fleet-group[data-group="server-42"] .fleet-group-head meter')
            .evaluate_all("ms => ms.map(m => m.value)")] == [sum(want.values())]
    for n in (ranks[0], ranks[-1]):  # the canvas itself has a square painted per block
        filled = page.evaluate(
            """(n) => { const c = document.querySelector(`.fleet-engine[data-engine="${n}"] canvas`);
                 const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                 let k = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) k++; return k; }""", n)
        assert filled >= held[n] * 16, (n, filled)
    # closing it draws none again
    page.click('.fleet-group[data-group="server-42"] .fleet-group-head')
    wait_for(page, "Object.keys(f.painted).length === 0 && f.open.length === 0")

    # the state filter: the unreachable engines, each its own server
    page.fill("#fleet-search", "")
    page.select_option("#fleet-state", "unreachable")
    wait_for(page, f"f.groups.join() === {','.join(GONE)!r}")
    page.select_option("#fleet-state", "")

    # the view for the docs: servers matching "server-4", server-42 opened
    page.fill("#fleet-search", "server-4")
    wait_for(page, "f.groups.length === 11 && f.groups[0] === 'server-4'")
    page.click('.fleet-group[data-group="server-42"] .fleet-group-head')
    wait_for(page, f"Object.keys(f.painted).length === {RANKS}")
    page.wait_for_selector("#fleet-prefixes li", timeout=30_000)
    page.screenshot(path=str(artifacts / "fleet-many-engines.png"))
    if os.environ.get("KVSCOPE_UPDATE_SCREENSHOTS"):  # docs/FLEET.md's picture of this view
        page.screenshot(path=str(ROOT / "docs" / "screenshots" / "fleet-many-engines.png"))

    # every answer the page fetched stayed small; it never asked for every engine's map
    answers = page.answers
    assert answers and all(0 < size < MAX_ANSWER for _url, size in answers), \
        max(answers, key=lambda a: a[1])
    maps = [url for url, _ in answers if "/blocks" in url]
    assert maps and all("?" in url for url in maps), maps
    assert page.console_log.errors == []
