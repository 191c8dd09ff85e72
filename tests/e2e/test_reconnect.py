"""The page reconnects by itself when its server restarts."""

from __future__ import annotations

import pytest

from .conftest import serve, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.e2e


def test_page_reconnects_after_a_server_restart(browser, artifacts):
    log_path = artifacts / "e2e-restart-server.log"
    proc, base = serve(log_path)
    context = browser.new_context(base_url=base, bypass_csp=True)
    try:
        page = context.new_page()
        page.goto("/")
        page.wait_for_function("window.kvscope && window.kvscope.connection === 'open'", timeout=30_000)
        stop_server(proc)
        page.wait_for_function("window.kvscope.connection !== 'open'", timeout=30_000)
        assert page.locator("#conn").get_attribute("data-state") in ("reconnecting", "missing")
        # the restart takes the same port (what the page reconnects to), free since the stop
        proc = start_server(int(base.rsplit(':', 1)[1]), log_path)
        wait_healthy(base, proc, log_path)
        page.wait_for_function("window.kvscope.connection === 'open' && window.kvscope.lastFrame() >= 0",
                               timeout=30_000)
        assert page.locator("#conn").get_attribute("data-state") == "open"
        # another server process (a new instance id): the page says its history was reset
        assert page.locator("#control-status").text_content() == "server restarted, history reset"
    finally:
        context.close()
        stop_server(proc)
