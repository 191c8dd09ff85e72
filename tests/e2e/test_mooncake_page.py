"""The Mooncake replay started from the page's Workload tab on a prefix-caching pool."""

from __future__ import annotations

import pytest

from .conftest import make_pool, open_pool

pytestmark = pytest.mark.e2e


def test_mooncake_replay_starts_from_the_form_and_fills_the_prefix_cache(page, api):
    make_pool(api, "e2e-mooncake", strategy="paged", num_blocks=16_384, block_bytes=16,
              tokens_per_block=16, prefix_caching={"policy": "lru"})
    open_pool(page, "e2e-mooncake")
    page.click(".controls-panel [data-tab=workload]")
    page.select_option("#f-workload [name=kind]", "mooncake")
    assert page.is_visible("#f-workload [name=limit]")
    assert not page.is_visible("#f-workload [name=name]")  # the scenario list is for scenarios
    page.fill("#f-workload [name=limit]", "30")
    page.fill("#f-workload [name=speed]", "20")  # the slider's top: 20x real time
    page.click("#f-workload button[type=submit]")
    page.wait_for_selector("#control-status[data-kind=ok]", timeout=30_000)
    assert "started Mooncake replay of 30 requests" in page.locator("#control-status").inner_text()
    page.wait_for_function(
        "(() => { const s = window.kvscope.stats(); return s && s.prefix && s.prefix.hits > 0; })()",
        timeout=30_000)
    api.delete("/api/pools/e2e-mooncake/workload")
    assert api.get("/api/pools/e2e-mooncake/check").json()["ok"]
    assert page.console_log.errors == []
