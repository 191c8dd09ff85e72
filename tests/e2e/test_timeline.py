"""Time travel in a real browser: scrub the timeline, step event by event, play, back to live,
and open a recording from the Pool tab. What the page shows is compared with REST `at_seq`."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import (
    BYPASS_CSP,
    make_pool,
    open_pool,
    serve,
    stop_server,
)

pytestmark = pytest.mark.e2e

BLOCK = 4096


def owners_at(api, pool: str, seq: int) -> list[int]:
    runs = api.get(f"/api/pools/{pool}/blockmap", params={"format": "json", "at_seq": seq}).json()["runs"]
    return sorted({r[2] for r in runs if r[2] >= 0})


def shown(page) -> dict:
    return page.evaluate("window.kvscope.timeline()")


def wait_shown(page, seq: int) -> None:
    page.wait_for_function(f"(() => {{ const t = window.kvscope.timeline(); "
                           f"return t && t.mode === 'past' && t.shown === {seq}; }})()",
                           timeout=30_000)


def test_scrub_step_and_back_to_live(page, api):
    name = "e2e-tl"
    make_pool(api, name, strategy="contiguous", num_blocks=64, block_bytes=BLOCK)
    ids = [api.post(f"/api/pools/{name}/allocations", json={"bytes": (i % 4 + 1) * BLOCK}).json()["id"]
           for i in range(8)]
    for aid in ids[::2]:
        api.delete(f"/api/pools/{name}/allocations/{aid}")
    api.post(f"/api/pools/{name}/allocations", json={"bytes": 60 * BLOCK})  # an OOM marker
    last = api.get(f"/api/pools/{name}/history").json()["last_seq"]
    assert last == 13
    open_pool(page, name)
    page.wait_for_function(f"window.kvscope.timeline() && window.kvscope.timeline().last === {last}", timeout=30_000)
    page.wait_for_function("window.kvscope.timeline().markers === 1", timeout=30_000)  # the OOM
    assert page.locator(".tl-mark.tl-oom").count() == 1
    # drag to event 5: five allocations were live then
    page.evaluate("(() => { const r = document.querySelector('#tl-range'); "
                  "r.value = '5'; r.dispatchEvent(new Event('input')); })()")
    wait_shown(page, 5)
    assert page.evaluate("window.kvscope.owners()") == owners_at(api, name, 5) == ids[:5]
    stats5 = api.get(f"/api/pools/{name}/stats", params={"at_seq": 5}).json()
    assert page.evaluate("window.kvscope.shownStats().used_blocks") == stats5["used_blocks"]
    # the charts mark the moment: the time of event 5
    ts5 = api.get(f"/api/pools/{name}/history/events", params={"after": 4, "limit": 1}).json()["events"][0]["ts"]
    assert page.evaluate("window.kvscope.chartMark()") == ts5
    assert "event 5 of 0..13" in page.locator("#tl-label").inner_text()
    # step forward one event at a time, then back
    for seq in (6, 7, 8, 9):
        page.click("#tl-fwd")
        wait_shown(page, seq)
        assert page.evaluate("window.kvscope.owners()") == owners_at(api, name, seq)
    page.click("#tl-back")
    wait_shown(page, 8)
    assert page.evaluate("window.kvscope.owners()") == owners_at(api, name, 8)
    # a click on a marker goes to its moment
    page.click(".tl-mark.tl-oom")
    wait_shown(page, 13)
    # play from here to the end, then live again in one click
    page.click("#tl-back")
    wait_shown(page, 12)
    page.click("#tl-play")
    wait_shown(page, 13)
    page.click("#tl-live")
    page.wait_for_function("window.kvscope.timeline().mode === 'live'", timeout=30_000)
    assert page.evaluate("window.kvscope.chartMark()") is None
    live = sorted({r[2] for r in api.get(f"/api/pools/{name}/blockmap?format=json").json()["runs"] if r[2] >= 0})
    page.wait_for_function(f"JSON.stringify(window.kvscope.owners()) === {json.dumps(live, separators=(',', ':'))!r}",
                           timeout=30_000)
    assert page.console_log.errors == []


def test_scrub_a_prefix_caching_pool_shows_shared_and_cached_blocks_as_they_were(page, api):
    name = "e2e-tl-pfx"
    make_pool(api, name, num_blocks=32, block_bytes=BLOCK, tokens_per_block=4, prefix_caching={"policy": "lru"})
    system = list(range(100, 108))  # two full blocks every prompt shares
    a = api.post(f"/api/pools/{name}/sequences", json={"tokens": system + [1, 2]}).json()
    b = api.post(f"/api/pools/{name}/sequences", json={"tokens": system + [3]}).json()
    both = api.get(f"/api/pools/{name}/history").json()["last_seq"]  # a and b share two blocks
    api.delete(f"/api/pools/{name}/sequences/{a['id']}")
    api.delete(f"/api/pools/{name}/sequences/{b['id']}")  # the shared blocks idle, cached
    last = api.get(f"/api/pools/{name}/history").json()["last_seq"]
    open_pool(page, name)
    page.wait_for_function(f"window.kvscope.timeline() && window.kvscope.timeline().last === {last}", timeout=30_000)
    page.evaluate(f"(() => {{ const r = document.querySelector('#tl-range'); "
                  f"r.value = '{both}'; r.dispatchEvent(new Event('input')); }})()")
    wait_shown(page, both)
    assert page.evaluate("window.kvscope.owners()") == owners_at(api, name, both) == [a["id"], b["id"]]
    past = api.get(f"/api/pools/{name}/stats", params={"at_seq": both}).json()
    assert past["blocks_by_state"]["shared"] == 2 and past["blocks_by_state"]["cached"] == 0
    shown_stats = page.evaluate("window.kvscope.shownStats()")
    assert (shown_stats["blocks_by_state"] == past["blocks_by_state"]
            and shown_stats["used_blocks"] == past["used_blocks"])
    assert "not kept for past moments" in page.locator("#numbers").inner_text()
    page.click("#tl-live")
    page.wait_for_function("window.kvscope.timeline().mode === 'live'", timeout=30_000)
    live = page.evaluate("window.kvscope.stats()")
    assert live["blocks_by_state"]["cached"] == 2 and live["blocks_by_state"]["shared"] == 0


def test_open_a_recording_from_the_pool_tab_and_scrub_it(browser, tmp_path):
    log_path = tmp_path / "server.log"
    proc, base = serve(log_path, {"KVSCOPE_RECORDINGS_DIR": str(tmp_path / "recs")})
    try:
        with httpx.Client(base_url=base, timeout=10) as api:
            make_pool(api, "src", strategy="paged", num_blocks=32, block_bytes=BLOCK)
            assert api.post("/api/pools/src/recording", json={"name": "demo"}).status_code == 201
            for i in range(6):
                api.post("/api/pools/src/allocations", json={"bytes": (i + 1) * BLOCK})
            info = api.delete("/api/pools/src/recording").json()
            assert info["events"] == 6
            context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=base,
                                          bypass_csp=BYPASS_CSP)
            page = context.new_page()
            try:
                open_pool(page, "src")
                page.click(".controls-panel [data-tab=pool]")
                page.click("#b-recordings")
                page.click("#recording-list [data-open=demo]")
                page.wait_for_function("window.kvscope.pool === 'rec-demo' && window.kvscope.connection === 'open'",
                                       timeout=30_000)
                page.wait_for_function("window.kvscope.timeline() && window.kvscope.timeline().last === 6",
                                       timeout=30_000)
                page.evaluate("(() => { const r = document.querySelector('#tl-range'); "
                              "r.value = '3'; r.dispatchEvent(new Event('input')); })()")
                wait_shown(page, 3)
                assert page.evaluate("window.kvscope.owners()") == owners_at(api, "rec-demo", 3) == [1, 2, 3]
                page.click("#tl-live")
                page.wait_for_function("window.kvscope.owners().length === 6", timeout=30_000)
            finally:
                context.close()
    finally:
        stop_server(proc)


def test_the_pool_tab_lists_a_bad_recording_file_with_why_and_shows_file_text_as_text(browser, tmp_path):
    """Files put in the recordings directory by hand: one that is not a recording is listed with
    the server's reason; the pool name a recording's file claims is shown as text, never markup."""
    import sqlite3

    from allocator import create_pool
    from allocator.history.recording import Recorder

    recs = tmp_path / "recs"
    recs.mkdir()
    (recs / "bad.kvrec").write_text('{"not": "a recording"}')
    named = create_pool("paged", num_blocks=8, block_bytes=BLOCK, device="cpu", history=True)
    Recorder(named, recs / "named.kvrec").stop()
    db = sqlite3.connect(recs / "named.kvrec")
    db.execute("UPDATE meta SET value = ? WHERE key = 'pool'", (json.dumps('<img src=x onerror="window.__xss=1">'),))
    db.commit()
    db.close()
    log_path = tmp_path / "server.log"
    proc, base = serve(log_path, {"KVSCOPE_RECORDINGS_DIR": str(recs)})
    try:
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=base, bypass_csp=BYPASS_CSP)
        page = context.new_page()
        try:
            open_pool(page, "default")
            page.click(".controls-panel [data-tab=pool]")
            page.click("#b-recordings")
            page.wait_for_selector("#recording-list li[data-name=named]", timeout=30_000)
            bad = page.inner_text("#recording-list li[data-name=bad]")
            assert "not openable: recording 'bad' is not a kvscope recording: JSON or other text" in bad, bad
            assert '<img src=x onerror="window.__xss=1">' in page.inner_text("#recording-list li[data-name=named]")
            assert page.locator("#recording-list img").count() == 0
            assert page.evaluate("window.__xss") is None
        finally:
            context.close()
    finally:
        stop_server(proc)
