"""Prefix caching in a real browser: the Sharing mode colours blocks by reference count, the
tooltip names a block's refcount, hash, depth and holders, the log shows stored blocks, and the
prefix-chat scenario runs live with its hit ratio on the page."""

from __future__ import annotations

import pytest

from .conftest import make_pool, open_pool

pytestmark = pytest.mark.e2e

SPEC = dict(strategy="paged", num_blocks=256, block_bytes=1024, tokens_per_block=16,
            prefix_caching={"policy": "lru"})


def test_sharing_mode_and_block_tooltip_follow_reference_counts(page, api):
    make_pool(api, "e2e-px", **SPEC)
    base = "/api/pools/e2e-px/sequences"
    system = list(range(32))  # two full blocks shared by every sequence
    seqs = [api.post(base, json={"tokens": system + [100 + i] * 20}).json() for i in range(3)]
    shared, private = seqs[0]["blocks"][0], seqs[0]["blocks"][2]
    lone = api.post(base, json={"tokens": list(range(500, 516))}).json()
    api.delete(f"{base}/{lone['id']}")  # one idle cached block
    open_pool(page, "e2e-px")
    page.click("#heatmap [data-mode=share]")
    try:
        page.wait_for_function("window.kvscope.stats() && window.kvscope.stats().prefix.blocks.shared === 2",
                               timeout=30_000)
    except Exception:
        raise AssertionError(page.evaluate("JSON.stringify(window.kvscope.stats())")) from None
    page.wait_for_function(
        f"window.kvscope.blockColor({shared}) !== window.kvscope.blockColor({private})", timeout=30_000)
    colors = page.evaluate(f"[{shared}, {private}, {lone['blocks'][0]}].map(window.kvscope.blockColor)")
    assert len(set(colors)) == 3  # held by 3, held by 1, idle cached: three colours
    # hover the shared block: the tooltip comes from GET .../prefix-cache/blocks/{b}
    box = page.locator("#heatmap canvas").bounding_box()
    grid = page.evaluate("window.kvscope.paintedCounts()")
    col, row = shared % grid["cols"], shared // grid["cols"]
    page.mouse.move(box["x"] + (col + 0.5) * grid["cellCss"], box["y"] + (row + 0.5) * grid["cellCss"])
    tip = page.locator("#heatmap .hm-tip")
    tip.filter(has_text="refcount").wait_for(timeout=30_000)
    text = tip.inner_text()
    assert "refcount 3" in text and "held by 3 sequences" in text and "depth 0" in text
    assert "shared" in text.lower()
    # the log shows blocks stored from now on (its filter is on by default)
    api.post(base, json={"tokens": list(range(900, 948))})
    page.wait_for_selector("#log tr.ev-stored", timeout=30_000)
    assert "3 blocks" in page.locator("#log tr.ev-stored").first.inner_text()
    assert page.console_log.errors == []


def test_prefix_chat_runs_live_and_the_page_shows_its_hit_ratio(page, api):
    make_pool(api, "e2e-pxchat", **SPEC)
    open_pool(page, "e2e-pxchat")
    page.click(".controls-panel [data-tab=workload]")
    page.select_option("#f-workload [name=kind]", "scenario")
    page.select_option("#f-workload [name=name]", "prefix-chat")
    page.fill("#f-workload [name=speed]", "50")
    page.click("#f-workload button[type=submit]")
    try:
        page.wait_for_function(
            "(() => { const s = window.kvscope.stats(); "
            "return s && s.prefix && s.prefix.queries > 2000 && s.prefix.hits > 0; })()",
            timeout=30_000)
    except Exception:  # say where it stopped: the workload's own state, the page's view of it
        workload = api.get("/api/pools/e2e-pxchat/workload")
        seen = page.evaluate("JSON.stringify({connection: window.kvscope.connection, "
                             "prefix: (window.kvscope.stats() || {}).prefix || null})")
        raise AssertionError(f"workload: {workload.status_code} {workload.text[:400]}; page: {seen[:400]}; "
                             f"console: {page.console_log.errors[:3]}") from None
    hit = page.evaluate("window.kvscope.stats().prefix.hit_ratio")
    assert hit > 0.3
    page.wait_for_function(
        "/hit rate\\s+\\d+\\.\\d%[\\s\\S]*prompt tokens cached/i.test(document.querySelector('#numbers').innerText)",
        timeout=30_000)
    api.delete("/api/pools/e2e-pxchat/workload")
    assert api.get("/api/pools/e2e-pxchat/check").json()["ok"]
    assert page.console_log.errors == []


def test_compare_view_runs_prefix_chat_with_prefix_caching_on_and_off(page, api):
    page.goto("/#compare")
    page.select_option("#f-compare [name=name]", "prefix-chat")
    page.fill("#f-compare [name=num_blocks]", "256")
    page.fill("#f-compare [name=block_bytes]", "1 KiB")
    page.fill("#f-compare [name=speed]", "50")
    page.click("#f-compare button[type=submit]")
    page.wait_for_selector("#compare-status[data-kind=ok]", timeout=10_000)
    page.wait_for_function(
        "(() => { const s = window.kvscope.compare(); return s.length === 2 && s.every(p => p.stats)"
        " && s[0].stats.prefix && s[0].stats.prefix.hits > 0; })()", timeout=30_000)
    summary = {p["pool"]: p for p in page.evaluate("window.kvscope.compare()")}
    assert list(summary) == ["cmp-prefix-on", "cmp-prefix-off"]
    assert summary["cmp-prefix-on"]["stats"]["prefix"]["hit_ratio"] > 0
    assert "prefix" not in summary["cmp-prefix-off"]["stats"]
    page.wait_for_function(
        "document.querySelectorAll('.compare-pane .prefix-hit').length === 2", timeout=5_000)
    texts = page.locator(".compare-pane .prefix-hit").all_inner_texts()
    assert texts[0].endswith("%") and "off" in texts[1]
    page.click("#b-compare-stop")
    page.wait_for_function("document.querySelector('#compare-status').textContent === 'stop: done'",
                           timeout=10_000)
    assert page.console_log.errors == []


def test_compare_stop_after_the_workloads_ended_answers_without_errors(page, api):
    """Stop clicked after both workloads finished (what a loaded machine makes of the test
    above): the page says done, and the browser logs no failed request."""
    page.goto("/#compare")
    page.select_option("#f-compare [name=name]", "prefix-chat")
    page.fill("#f-compare [name=num_blocks]", "256")
    page.fill("#f-compare [name=block_bytes]", "1 KiB")
    page.fill("#f-compare [name=speed]", "1000")
    page.click("#f-compare button[type=submit]")
    page.wait_for_function(
        "(() => { const s = window.kvscope.compare(); return s.length === 2"
        " && s.every(p => p.workload && p.workload.state === 'finished'); })()", timeout=60_000)
    page.click("#b-compare-stop")
    page.wait_for_function("document.querySelector('#compare-status').textContent === 'stop: done'",
                           timeout=10_000)
    assert [api.get(f"/api/pools/{p}/workload").json()["workload"]["state"]
            for p in ("cmp-prefix-on", "cmp-prefix-off")] == ["finished", "finished"]
    assert page.console_log.errors == []
