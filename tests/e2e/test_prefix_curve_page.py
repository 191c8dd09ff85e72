"""The bundled trace's capacity curve beside the live charts: one line per policy on a log
capacity axis, the maximum dashed, the shown prefix-caching pool marked at its capacity with its
live hit ratio; no curve for a pool without prefix caching."""

from __future__ import annotations

import pytest

from .conftest import make_pool, open_pool

pytestmark = pytest.mark.e2e


def test_curve_shows_beside_the_live_hit_ratio_with_the_pool_on_it(page, api):
    curve = api.get("/api/prefix/curve").json()
    make_pool(api, "e2e-curve", strategy="paged", num_blocks=16_384, block_bytes=16,
              tokens_per_block=16, prefix_caching={"policy": "lru"})
    open_pool(page, "e2e-curve")
    page.wait_for_function("window.kvscope.prefixCurve() !== null", timeout=10_000)
    assert page.is_visible("#prefix-curve canvas")
    drawn = page.evaluate("window.kvscope.prefixCurve()")
    labels = [s["label"] for s in drawn["series"]]
    assert labels == [*curve["policies"], "max (∞ capacity)", "this pool"]
    per_policy = {s["label"]: s for s in drawn["series"]}
    for policy in curve["policies"]:
        assert per_policy[policy]["points"] == len(curve["capacities_tokens"]), policy
        assert not per_policy[policy]["dashed"]
    assert per_policy["max (∞ capacity)"]["dashed"]
    assert drawn["logX"]
    capacity = 16_384 * 16
    assert drawn["here"]["capacity"] == capacity and capacity in drawn["xs"]
    assert drawn["xs"] == sorted(drawn["xs"])
    # the legend on the page names every line
    legend = page.locator("#prefix-curve .u-legend").inner_text()
    assert all(p in legend for p in curve["policies"])
    # the live hit ratio becomes the pool's point once the replay hits the cache
    page.click(".controls-panel [data-tab=workload]")
    page.select_option("#f-workload [name=kind]", "mooncake")
    page.fill("#f-workload [name=limit]", "30")
    page.fill("#f-workload [name=speed]", "20")
    page.click("#f-workload button[type=submit]")
    page.wait_for_function(
        "(() => { const c = window.kvscope.prefixCurve(); return c && c.here.hitRatio > 0"
        " && c.series[c.series.length - 1].points === 1; })()", timeout=30_000)
    live = page.evaluate("window.kvscope.stats().prefix")
    here = page.evaluate("window.kvscope.prefixCurve().here")
    assert here["hitRatio"] == pytest.approx(live["hits"] / live["queries"], abs=0.05)
    title = page.locator("#prefix-curve .chart-title").inner_text()
    assert "262k tokens" in title and "%" in title
    api.delete("/api/pools/e2e-curve/workload")
    # a pool without prefix caching: no curve
    make_pool(api, "e2e-nocurve", strategy="paged", num_blocks=64, block_bytes=16)
    open_pool(page, "e2e-nocurve")
    page.wait_for_function("window.kvscope.pool === 'e2e-nocurve' && window.kvscope.prefixCurve() === null",
                           timeout=10_000)
    assert not page.is_visible("#prefix-curve")
    assert page.console_log.errors == []
