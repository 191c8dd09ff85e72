"""The dashboard in a real browser against a real server: what a user sees matches the pool."""

from __future__ import annotations

import pytest

from .conftest import make_pool, open_pool

pytestmark = pytest.mark.e2e

BLOCK = 4096


def painted_matches_stats(page, api, pool: str, timeout_ms: int = 30_000) -> dict:
    """Wait until the painted occupied cells equal the server's used blocks; return both."""
    used = api.get(f"/api/pools/{pool}/stats").json()["used_blocks"]
    page.wait_for_function(f"window.kvscope.paintedCounts().occupied === {used}", timeout=timeout_ms)
    return {"used": used, "painted": page.evaluate("window.kvscope.paintedCounts()")}


def test_page_loads_without_console_errors(page, artifacts):
    page.goto("/")
    page.wait_for_function("window.kvscope && window.kvscope.connection === 'open' && window.kvscope.lastFrame() >= 0",
                           timeout=30_000)
    page.wait_for_function("window.kvscope.stats() !== null", timeout=30_000)
    assert page.locator("#conn").get_attribute("data-state") == "open"
    page.wait_for_selector("#numbers .num", timeout=30_000)
    assert page.locator("#numbers .num").count() >= 7
    assert page.locator("#charts .uplot").count() == 3
    page.screenshot(path=str(artifacts / "e2e-default.png"))
    assert page.console_log.errors == []


def test_painted_cells_match_the_pools_used_blocks(page, api, artifacts):
    make_pool(api, "e2e-paint", strategy="paged", num_blocks=1000, block_bytes=BLOCK)
    ops = [{"op": "allocate", "bytes": BLOCK * (1 + i % 7)} for i in range(40)]
    r = api.post("/api/pools/e2e-paint/ops", json={"ops": ops})
    assert r.status_code == 200, r.text
    open_pool(page, "e2e-paint")
    got = painted_matches_stats(page, api, "e2e-paint")
    assert got["used"] == sum(1 + i % 7 for i in range(40))
    assert got["painted"]["free"] == 1000 - got["used"]
    # frees after load arrive as deltas and are repainted
    ids = [res["id"] for res in r.json()["results"]][::2]
    api.post("/api/pools/e2e-paint/ops", json={"ops": [{"op": "free", "id": i} for i in ids]})
    painted_matches_stats(page, api, "e2e-paint")
    assert page.console_log.errors == []


def test_allocations_from_the_ui_and_from_rest_both_appear(page, api, artifacts):
    make_pool(api, "e2e-alloc", strategy="paged", num_blocks=512, block_bytes=BLOCK)
    open_pool(page, "e2e-alloc")
    page.fill("#f-allocate [name=size]", "40 KiB")
    page.click("#f-allocate button[type=submit]")
    page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
    ui_id = int(page.locator("#my-allocs li").first.get_attribute("data-id"))
    rest = api.post("/api/pools/e2e-alloc/allocations", json={"bytes": 3 * BLOCK})
    assert rest.status_code == 201, rest.text
    rest_id = rest.json()["id"]
    page.wait_for_function(
        f"(() => {{ const o = window.kvscope.owners(); return o.includes({ui_id}) && o.includes({rest_id}); }})()",
        timeout=30_000,
    )
    got = painted_matches_stats(page, api, "e2e-alloc")
    assert got["used"] == 10 + 3
    # hover the first block: the tooltip names its owner
    box = page.locator("#heatmap canvas").bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + 2)
    page.wait_for_selector(".hm-tip:not([hidden])", timeout=30_000)
    page.wait_for_function("document.querySelector('.hm-tip').textContent.includes('of 40.0 KiB')"
                           " || document.querySelector('.hm-tip').textContent.includes('12.0 KiB')", timeout=30_000)
    page.wait_for_function("document.querySelector('#numbers').textContent.includes('13 / 512 blocks')", timeout=30_000)
    page.screenshot(path=str(artifacts / "e2e-alloc.png"))
    assert page.console_log.errors == []


def test_filling_the_cache_past_capacity_logs_evictions(page, api, artifacts):
    make_pool(api, "e2e-cache", strategy="paged", num_blocks=256, block_bytes=BLOCK,
              cache={"capacity_bytes": 16 * BLOCK, "policy": "lru"})
    open_pool(page, "e2e-cache")
    page.click(".controls-panel [data-tab=cache]")
    page.fill("#f-put [name=key]", "first")
    page.fill("#f-put [name=size]", "8 KiB")
    page.click("#f-put button[type=submit]")
    page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
    for i in range(12):  # 12 x 2 blocks into a 16-block cache
        r = api.put(f"/api/pools/e2e-cache/entries/k{i}", json={"bytes": 2 * BLOCK})
        assert r.status_code in (200, 201), r.text
    # 16 blocks hold 8 entries of 2: at least 5 of the 13 entries must have gone, "first" first
    page.wait_for_function("document.querySelectorAll('#log tr.ev-evict').length >= 5", timeout=30_000)
    oldest = page.locator("#log tr.ev-evict").last.inner_text()
    assert "first" in oldest and "capacity" in oldest and "lru" in oldest
    # the filter hides evictions when unticked
    page.uncheck("#event-filters input[value=evict]")
    page.wait_for_function("document.querySelectorAll('#log tr.ev-evict').length === 0", timeout=30_000)
    page.check("#event-filters input[value=evict]")
    page.click(".seg [data-mode=heat]")
    page.wait_for_timeout(1300)  # one `order` message
    page.screenshot(path=str(artifacts / "e2e-cache-heat.png"))
    assert page.console_log.errors == []


def test_fragmentation_scenario_raises_the_oom_banner_and_defragment_clears_it(page, api, artifacts):
    make_pool(api, "e2e-frag", strategy="contiguous", num_blocks=512, block_bytes=BLOCK, fit="first")
    open_pool(page, "e2e-frag")
    page.click(".controls-panel [data-tab=workload]")
    page.select_option("#f-workload [name=kind]", "scenario")
    page.select_option("#f-workload [name=name]", "fragmentation")
    page.fill("#f-workload [name=speed]", "20")
    page.click("#f-workload button[type=submit]")
    banner = page.locator("#alerts .alert[data-code=oom-fragmentation]")
    banner.wait_for(timeout=30_000)
    assert "OOM with memory free" in banner.inner_text()
    page.locator("#log tr.ev-oom").first.wait_for(timeout=30_000)
    page.screenshot(path=str(artifacts / "e2e-frag-oom.png"))
    api.delete("/api/pools/e2e-frag/workload")
    page.click(".controls-panel [data-tab=pool]")
    page.click("#b-defrag")
    banner.wait_for(state="detached", timeout=30_000)
    page.locator("#log tr.ev-defragment").first.wait_for(timeout=30_000)
    assert page.console_log.errors == []


def test_compare_view_runs_the_same_scenario_on_each_pool(page, api, artifacts):
    page.goto("/#compare")
    page.fill("#f-compare [name=num_blocks]", "512")
    page.fill("#f-compare [name=speed]", "10")
    page.click("#f-compare button[type=submit]")
    page.wait_for_selector("#compare-status[data-kind=ok]", timeout=30_000)
    page.wait_for_function(
        "(() => { const s = window.kvscope.compare(); "
        "return s.length === 2 && s.every(p => p.connection === 'open' && p.stats && p.workload); })()",
        timeout=30_000,
    )
    # same scenario, same seed: the contiguous arena fails with memory free, the paged pool never does
    page.wait_for_function(
        "window.kvscope.compare().every(p => p.stats && p.workload && p.workload.state !== 'running')",
        timeout=30_000,
    )
    # the stats message after the failed request may come a tick after the workload's end
    page.wait_for_function(
        "window.kvscope.compare().some(p => p.pool === 'cmp-contiguous' && p.stats.ooms.fragmentation >= 1)",
        timeout=30_000,
    )
    summary = {p["pool"]: p for p in page.evaluate("window.kvscope.compare()")}
    assert list(summary) == ["cmp-paged", "cmp-contiguous"]
    for p in summary.values():
        assert p["painted"]["total"] == 512
    assert summary["cmp-contiguous"]["stats"]["ooms"]["fragmentation"] >= 1
    assert summary["cmp-paged"]["stats"]["ooms"]["fragmentation"] == 0
    page.wait_for_selector(".compare-pane[data-pool=cmp-contiguous] .alert[data-code=oom-fragmentation]",
                           timeout=30_000)
    page.screenshot(path=str(artifacts / "e2e-compare.png"))
    assert page.console_log.errors == []


def test_compare_view_runs_the_chat_scenario_on_pools_with_a_cache(page, api, artifacts):
    page.goto("/#compare")
    page.select_option("#f-compare [name=name]", "chat")
    page.fill("#f-compare [name=num_blocks]", "256")
    page.fill("#f-compare [name=speed]", "10")
    page.click("#f-compare button[type=submit]")
    page.wait_for_selector("#compare-status[data-kind]:not([data-kind=info])", timeout=30_000)
    status = page.locator("#compare-status")
    assert status.get_attribute("data-kind") == "ok", status.inner_text()
    page.wait_for_function(
        "(() => { const s = window.kvscope.compare(); return s.length === 2 "
        "&& s.every(p => p.connection === 'open' && p.stats && p.stats.cache && p.workload); })()",
        timeout=30_000,
    )
    for name in ("cmp-paged", "cmp-contiguous"):
        cache = api.get(f"/api/pools/{name}").json()["stats"]["cache"]
        assert cache["policy"] == "lru" and cache["capacity_bytes"] == 256 * 16 * 1024, cache
    page.click("#b-compare-stop")
    page.wait_for_selector("#compare-status:has-text('stop: done')", timeout=30_000)
    assert page.console_log.errors == []


def test_compare_view_refuses_a_bad_form_before_touching_any_pool(page, api, artifacts):
    make_pool(api, "cmp-paged", strategy="paged", num_blocks=64, block_bytes=BLOCK)
    page.goto("/#compare")
    page.fill("#f-compare [name=num_blocks]", "0")
    page.click("#f-compare button[type=submit]")
    page.wait_for_selector("#compare-status[data-kind=err]", timeout=30_000)
    assert "not a block count" in page.locator("#compare-status").inner_text()
    # the pool of an earlier run is still there, untouched
    assert api.get("/api/pools/cmp-paged").json()["config"]["num_blocks"] == 64
    assert page.console_log.errors == []


def block_center(page, i: int) -> tuple[float, float]:
    """Page coordinates of the middle of block i's cell on the dashboard map."""
    box = page.locator("#heatmap canvas").bounding_box()
    painted = page.evaluate("window.kvscope.paintedCounts()")
    cell = box["width"] / painted["cols"]
    return box["x"] + (i % painted["cols"] + 0.5) * cell, box["y"] + (i // painted["cols"] + 0.5) * cell


def test_hovering_free_and_just_freed_blocks_logs_no_errors(page, api, artifacts):
    make_pool(api, "e2e-hover", strategy="paged", num_blocks=256, block_bytes=BLOCK)
    r = api.post("/api/pools/e2e-hover/ops", json={"ops": [{"op": "allocate", "bytes": 4 * BLOCK} for _ in range(8)]})
    assert r.status_code == 200, r.text
    ids = [res["id"] for res in r.json()["results"]]
    open_pool(page, "e2e-hover")
    painted_matches_stats(page, api, "e2e-hover")
    tip = page.locator("#heatmap .hm-tip")
    # a used block: the look-up answers, then the tooltip is cached
    page.mouse.move(*block_center(page, 1))
    page.wait_for_function("document.querySelector('#heatmap .hm-tip').textContent.includes('blocks')", timeout=30_000)
    # free it while the pointer rests on it, then wiggle: the cell is free now, nothing is fetched
    api.delete(f"/api/pools/e2e-hover/allocations/{ids[0]}")
    painted_matches_stats(page, api, "e2e-hover")
    x, y = block_center(page, 1)
    page.mouse.move(x + 1, y)
    page.wait_for_function("document.querySelector('#heatmap .hm-tip').textContent.includes('free')", timeout=30_000)
    # every other freed allocation, and the never-used tail, hovered one after another
    for aid in ids[1::2]:
        api.delete(f"/api/pools/e2e-hover/allocations/{aid}")
    painted_matches_stats(page, api, "e2e-hover")
    for i in list(range(4, 32, 3)) + [100, 200, 255]:
        page.mouse.move(*block_center(page, i))
        page.wait_for_timeout(160)  # past the look-up debounce
    assert "loading" not in tip.inner_text()
    page.wait_for_timeout(300)
    assert page.console_log.errors == []


def settled(page, want: str) -> None:
    """Wait for the control status line to say `want` (ok / err); fail with what it says if it
    says the other, or nothing, within 30 s."""
    status = page.locator("#control-status")
    try:
        page.wait_for_function(
            f"document.querySelector('#control-status').dataset.kind === {want!r}", timeout=30_000)
    except Exception:
        raise AssertionError(f"status {status.get_attribute('data-kind')!r}: {status.inner_text()!r}") from None


def test_evict_button_evicts_the_entry_with_reason_manual(page, api, artifacts):
    make_pool(api, "e2e-evict", strategy="paged", num_blocks=256, block_bytes=BLOCK,
              cache={"capacity_bytes": 64 * BLOCK, "policy": "lru"})
    assert api.put("/api/pools/e2e-evict/entries/victim", json={"bytes": 2 * BLOCK}).status_code in (200, 201)
    assert api.put("/api/pools/e2e-evict/entries/stays",
                   json={"bytes": BLOCK, "pinned": True}).status_code in (200, 201)
    open_pool(page, "e2e-evict")
    page.click(".controls-panel [data-tab=cache]")
    page.fill("#f-put [name=key]", "victim")
    page.click("#b-evict")
    settled(page, "ok")
    row = page.locator("#log tr.ev-evict").first
    row.wait_for(timeout=30_000)
    assert "victim" in row.inner_text() and "manual" in row.inner_text()
    assert api.get("/api/pools/e2e-evict/entries").json()["total"] == 1
    # a pinned entry refuses, and the status line says why
    page.fill("#f-put [name=key]", "stays")
    page.click("#b-evict")
    settled(page, "err")
    assert "pinned" in page.locator("#control-status").inner_text()
    # the refusal is an expected 409: the only console error allowed is its network line
    assert all("409" in e for e in page.console_log.errors), page.console_log.errors
