"""The dashboard and /docs under the server's real Content-Security-Policy (no inline scripts or
styles, no eval): they load, draw and act without a single CSP violation. Also: a server
without pools shows 'no pools' and the create form."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e


def wait_until(page, expression: str, timeout_s: float = 10.0):
    """Poll `expression` with page.evaluate (wait_for_function would need eval, which the CSP refuses)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = page.evaluate(expression)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.1)


@pytest.fixture
def strict_page(browser, server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=server)
    page = context.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: messages.append(str(e)))
    page.csp_errors = messages  # type: ignore[attr-defined]
    yield page
    context.close()


def test_the_dashboard_runs_under_the_csp(strict_page, api):
    page = strict_page
    response = page.goto("/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    wait_until(page, "window.kvscope && window.kvscope.connection === 'open' && window.kvscope.lastFrame() >= 0")
    page.click("#f-allocate button[type=submit]")
    page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
    # swatches get their colour through the CSSOM, not a style attribute
    colour = page.evaluate("getComputedStyle(document.querySelector('#heatmap .sw[data-color]')).backgroundColor")
    assert colour not in ("", "rgba(0, 0, 0, 0)"), colour
    page.click("[data-view=compare]")
    page.click("[data-view=dashboard]")
    assert not page.csp_errors, page.csp_errors


def test_docs_render_under_the_csp(strict_page):
    page = strict_page
    page.goto("/docs")
    page.wait_for_selector(".swagger-ui .info", timeout=30_000)
    assert page.locator(".opblock").count() > 10
    assert not [m for m in page.csp_errors if "Content Security Policy" in m], page.csp_errors


def test_a_server_without_pools_shows_no_pools_and_the_create_form(strict_page, api):
    pools = [p["name"] for p in api.get("/api/pools").json()["pools"]]
    saved = {name: api.get(f"/api/pools/{name}").json()["config"] for name in pools}
    for name in pools:
        assert api.delete(f"/api/pools/{name}").status_code == 204
    try:
        page = strict_page
        page.goto("/")
        wait_until(page, "document.querySelector('#pool-meta').textContent.includes('no pools')")
        assert page.locator("#f-create").is_visible()
        assert page.locator("#conn").get_attribute("data-state") == "closed"
    finally:
        for name, config in saved.items():
            spec = {k: config[k] for k in ("strategy", "num_blocks", "block_bytes") if k in config}
            api.post("/api/pools", json={"name": name, **spec})
