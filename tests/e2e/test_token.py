"""With KVSCOPE_TOKEN set, the page asks for the token once and keeps it in session storage."""

from __future__ import annotations

import pytest

from .conftest import serve, stop_server

pytestmark = pytest.mark.e2e

TOKEN = "e2e-secret"


def test_page_asks_for_the_token_and_then_works(browser, artifacts):
    log_path = artifacts / "e2e-token-server.log"
    proc, base = serve(log_path, {"KVSCOPE_TOKEN": TOKEN})
    context = browser.new_context(base_url=base, bypass_csp=True)
    try:
        page = context.new_page()
        page.goto("/")
        dialog = page.locator("#token-dialog")
        dialog.wait_for(state="visible", timeout=30_000)
        # asked by the first refused call: listing the pools (every /api read needs the token) or the stream
        assert page.locator("#conn").get_attribute("data-state") in ("auth", "connecting")
        page.fill("#token-dialog input[name=token]", TOKEN)
        page.click("#token-dialog button[value=ok]")
        page.wait_for_function("window.kvscope.connection === 'open' && window.kvscope.lastFrame() >= 0",
                               timeout=30_000)
        assert page.evaluate("sessionStorage.getItem('kvscope.token')") == TOKEN
        page.click("#f-allocate button[type=submit]")  # a mutating call carries the bearer token
        page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
        # a reload reuses the stored token without asking again
        page.reload()
        page.wait_for_function("window.kvscope && window.kvscope.connection === 'open'", timeout=30_000)
        assert not dialog.is_visible()
    finally:
        context.close()
        stop_server(proc)
