"""The control forms in a real browser: they act on the shown pool only, and never send a request
they can tell is wrong."""

from __future__ import annotations

import httpx
import pytest

from .conftest import make_pool, open_pool, serve, stop_server

pytestmark = pytest.mark.e2e

BLOCK = 4096


def record_requests(page, *fragments: str) -> list[str]:
    """`METHOD url` of every request the page makes whose URL contains one of `fragments`."""
    seen: list[str] = []

    def note(r) -> None:
        if any(f in r.url for f in fragments):
            seen.append(f"{r.method} {r.url}")

    page.on("request", note)
    return seen


def status_after(page, selector: str, kind: str) -> str:
    """Click `selector` on a cleared status line; return the line once it has `kind`."""
    page.evaluate("document.querySelector('#control-status').removeAttribute('data-kind')")
    page.click(selector)
    page.wait_for_selector(f"#control-status[data-kind={kind}]", timeout=30_000)
    return page.locator("#control-status").inner_text()


def test_switching_pools_forgets_the_allocations_made_on_the_old_one(page, api):
    make_pool(api, "e2e-sw-a", strategy="paged", num_blocks=128, block_bytes=BLOCK)
    make_pool(api, "e2e-sw-b", strategy="paged", num_blocks=128, block_bytes=BLOCK)
    open_pool(page, "e2e-sw-a")
    page.fill("#f-allocate [name=size]", "8 KiB")
    page.click("#f-allocate button[type=submit]")
    page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
    aid = page.locator("#my-allocs li").first.get_attribute("data-id")
    assert page.input_value("#f-extend [name=id]") == aid
    page.select_option("#pool-select", "e2e-sw-b")
    page.wait_for_function("window.kvscope.pool === 'e2e-sw-b' && window.kvscope.connection === 'open'", timeout=30_000)
    assert page.locator("#my-allocs li").count() == 0
    assert page.input_value("#f-extend [name=id]") == ""
    frees = record_requests(page, "/allocations/")
    assert "type the id" in status_after(page, "#b-free", "err")
    assert frees == []
    assert api.get(f"/api/pools/e2e-sw-a/allocations/{aid}").status_code == 200
    assert page.console_log.errors == []


def test_empty_key_or_id_is_refused_without_a_request(page, api):
    make_pool(api, "e2e-empty", strategy="paged", num_blocks=128, block_bytes=BLOCK,
              cache={"capacity_bytes": 32 * BLOCK, "policy": "lru"})
    open_pool(page, "e2e-empty")
    # Only the requests these controls would make: the page's own background reads of the
    # pool (stats, history range) may still be in flight from opening it.
    sent = record_requests(page, "/api/pools/e2e-empty/entries", "/api/pools/e2e-empty/allocations")
    page.click(".controls-panel [data-tab=cache]")
    page.fill("#f-put [name=key]", "  ")
    for button, verb in (("#b-get", "get"), ("#b-del", "delete"), ("#b-evict", "evict")):
        assert f"type the key of the entry to {verb}" in status_after(page, button, "err")
    page.click(".controls-panel [data-tab=alloc]")
    page.fill("#f-extend [name=id]", "")
    assert "type the id of the allocation to free" in status_after(page, "#b-free", "err")
    assert "type the id of the allocation to extend" in status_after(page, "#f-extend button[type=submit]", "err")
    page.fill("#f-extend [name=id]", "abc")
    assert "not an allocation id" in status_after(page, "#b-free", "err")
    assert sent == []
    assert page.console_log.errors == []


def test_create_pool_name_follows_the_servers_pattern(page, api):
    page.goto("/")
    page.click(".controls-panel [data-tab=pool]")
    mismatch = "el => el.validity.patternMismatch || el.validity.valueMissing"
    name = page.locator("#f-create [name=name]")
    for bad in ("Lab", "a.b", "-lab", "_lab", "x" * 65, ""):
        name.fill(bad)
        assert name.evaluate(mismatch), bad
    for good in ("lab", "lab-1_x", "0", "x" * 64):
        name.fill(good)
        assert not name.evaluate(mismatch), good
    # the browser and the server agree
    assert api.post("/api/pools", json={"name": "Lab", "num_blocks": 8, "block_bytes": BLOCK}).status_code == 422


def test_deleting_the_shown_pool_moves_to_the_first_pool_left_then_to_none(browser, artifacts):
    log_path = artifacts / "e2e-delete-server.log"
    proc, base = serve(log_path)
    context = browser.new_context(base_url=base, bypass_csp=True)
    try:
        r = httpx.post(f"{base}/api/pools", json={"name": "other", "num_blocks": 64, "block_bytes": BLOCK})
        assert r.status_code == 201, r.text
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: d.accept())
        open_pool(page, "default")
        page.click(".controls-panel [data-tab=pool]")
        page.click("#b-delete-pool")
        page.wait_for_function("window.kvscope.pool === 'other' && window.kvscope.connection === 'open'",
                               timeout=30_000)
        assert page.eval_on_selector_all("#pool-select option", "os => os.map(o => o.value)") == ["other"]
        assert "pool=other" in page.url
        page.click("#b-delete-pool")
        page.wait_for_function("document.querySelector('#pool-meta').textContent.includes('no pools')", timeout=30_000)
        page.wait_for_timeout(1_000)  # long enough for a retry of a dead pool's stream
        assert page.evaluate("window.kvscope.connection") == "closed"
        assert page.locator("#conn").get_attribute("data-state") == "closed"
        assert page.locator("#pool-select option").count() == 0
        assert "pool=" not in page.url
        assert errors == []
    finally:
        context.close()
        stop_server(proc)


def test_a_failed_workload_shows_failed_in_red_with_its_error(page, api):
    """A workload that raises is reported `failed` with its `error` (GET .../workload and the stream's
    `progress`); a real one is hard to make fail, so the stream's message is injected into the live socket."""
    make_pool(api, "e2e-fail", strategy="paged", num_blocks=128, block_bytes=BLOCK)
    routes = []

    def relay(ws):
        ws.connect_to_server()  # everything else passes through untouched
        routes.append(ws)

    page.route_web_socket("**/ws/pools/e2e-fail*", relay)
    open_pool(page, "e2e-fail")
    page.click(".controls-panel [data-tab=workload]")
    routes[-1].send(
        '{"type": "progress", "workload": {"name": "chat", "kind": "scenario", "state": "failed",'
        ' "done": 120, "total": 400, "error": "allocation 7 not found"}}'
    )
    page.wait_for_selector("#progress[data-state=failed]", timeout=30_000)
    line = page.locator("#progress span")
    assert line.inner_text() == "chat · failed at 120/400: allocation 7 not found"
    assert "finished" not in line.inner_text()
    assert line.evaluate("el => getComputedStyle(el).color") == "rgb(239, 83, 80)"  # --bad
    assert page.console_log.errors == []
