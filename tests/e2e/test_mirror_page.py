"""A mirror pool in the browser: logical slots painted as the engine reports them, the stream's
lost events and bad input raised as alerts, prefix-cache events in the log."""

from __future__ import annotations

import time

import pytest
from support.kve_source import RefPrefixCache

from kvevents.publisher import Publisher

from .conftest import make_pool, open_pool

pytestmark = pytest.mark.e2e


def test_mirror_page_shows_logical_slots_losses_and_errors(page, api, artifacts):
    pub = Publisher("tcp://127.0.0.1:*", bind=True, topic="kv")  # a port the OS picks, bound here
    src = RefPrefixCache(seed=4)
    try:
        make_pool(api, "e2e-mirror", strategy="mirror", num_blocks=64,
                  mirror={"endpoint": pub.endpoint, "topic": "kv"})
        stats = lambda: api.get("/api/pools/e2e-mirror/stats").json()["mirror"]  # noqa: E731
        end = time.monotonic() + 30
        while stats()["source"]["last_seq"] is None and time.monotonic() < end:
            pub.publish([])  # until the SUB socket is connected (no replay socket here)
            time.sleep(0.1)
        lost_before = stats()["source"]["lost_batches"]
        for _ in range(20):
            pub.publish(src.step())
        end = time.monotonic() + 30
        while stats()["cached_blocks"] != len(src.cached) and time.monotonic() < end:
            time.sleep(0.05)
        assert stats()["cached_blocks"] == len(src.cached)
        open_pool(page, "e2e-mirror")
        page.wait_for_function(f"window.kvscope.paintedCounts().occupied === {len(src.cached)}", timeout=30_000)
        assert "logical slots" in page.locator("#pool-meta").inner_text()
        # read-only: the allocator's controls are gone, the Pool tab stays
        assert not page.locator(".controls-panel [data-tab=alloc]").is_visible()
        assert not page.locator("#f-allocate").is_visible()
        assert page.locator("#b-check").is_visible() and not page.locator("#b-defrag").is_visible()
        page.wait_for_selector("#numbers .num", timeout=30_000)
        numbers = page.locator("#numbers").inner_text().lower()
        assert "cached blocks" in numbers and "logical slots" in numbers
        for _ in range(5):
            pub.publish(src.step())  # live events reach the log
        page.wait_for_selector("#log tr.ev-stored", timeout=30_000)
        page.wait_for_function("document.querySelector('#numbers').textContent.includes('prefix forest')",
                               timeout=30_000)
        # A lost range (no replay socket to fill it) and a message with the wrong frame count.
        pub._seq += 3
        pub.publish(src.step())
        pub._pub.send_multipart([b"kv", b"not-a-seq"])
        page.wait_for_selector("#alerts [data-code=mirror-lost]", timeout=30_000)
        page.wait_for_selector("#alerts [data-code=mirror-errors]", timeout=30_000)
        assert f"{lost_before + 3} event batches were lost" in page.locator("#alerts").inner_text()
        page.screenshot(path=str(artifacts / "e2e-mirror.png"))
        assert page.console_log.errors == []
    finally:
        api.delete("/api/pools/e2e-mirror")
        pub.close()
