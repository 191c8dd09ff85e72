"""Charts rebuilt from the history, in a real browser: scrubbing a live pool back draws the
history up to that moment (and Live brings the live samples back); a recording uploaded through
the Pool tab's file input opens as its pool, with its map and its charts over the whole of it.
What the charts hold is compared with GET .../history/series."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from allocator import create_pool
from allocator.history.recording import Recorder

from .conftest import (
    BYPASS_CSP,
    make_pool,
    open_pool,
    serve,
    stop_server,
)

pytestmark = pytest.mark.e2e

BLOCK = 4096


def series_utilization(api, pool: str, first: int, last: int) -> tuple[list, list]:
    """(times, utilizations) of the points with a time, as the page asks for them (300 points)."""
    cols = api.get(f"/api/pools/{pool}/history/series",
                   params={"from_seq": first, "to_seq": last, "points": 300}).json()["columns"]
    keep = [i for i, ts in enumerate(cols["ts"]) if ts is not None]
    return [cols["ts"][i] for i in keep], [cols["utilization"][i] for i in keep]


def charts(page) -> dict:
    return page.evaluate("window.kvscope.charts()")


def test_scrubbing_back_charts_the_history_up_to_that_moment(page, api):
    name = "e2e-charts"
    make_pool(api, name, strategy="contiguous", num_blocks=64, block_bytes=BLOCK)
    ids = []
    for i in range(10):
        ids.append(api.post(f"/api/pools/{name}/allocations", json={"bytes": (i % 3 + 1) * BLOCK}).json()["id"])
        time.sleep(0.02)  # distinct event times: points apart on the time axis
    for aid in ids[::2]:
        api.delete(f"/api/pools/{name}/allocations/{aid}")
    last = api.get(f"/api/pools/{name}/history").json()["last_seq"]
    open_pool(page, name)
    page.wait_for_function(f"window.kvscope.timeline() && window.kvscope.timeline().last === {last}", timeout=30_000)
    assert charts(page)["source"] == "live"
    page.evaluate("(() => { const r = document.querySelector('#tl-range'); "
                  "r.value = '7'; r.dispatchEvent(new Event('input')); })()")
    times, utils = series_utilization(api, name, 0, 7)
    assert len(times) == 7  # events 1..7 (event 0 is the keyframe the history starts at, untimed)
    page.wait_for_function(f"(() => {{ const c = window.kvscope.charts(); "
                           f"return c.source === 'past' && c.last === {times[-1]!r}; }})()",
                           timeout=30_000)
    shown = charts(page)
    assert shown["points"] == 7 and shown["first"] == times[0]
    assert shown["utilizations"] == utils  # the past points themselves, not the live samples
    assert shown["utilization"] == api.get(f"/api/pools/{name}/stats", params={"at_seq": 7}).json()["utilization"]
    # further back: the charts follow the chosen moment
    page.evaluate("(() => { const r = document.querySelector('#tl-range'); "
                  "r.value = '3'; r.dispatchEvent(new Event('input')); })()")
    times3, utils3 = series_utilization(api, name, 0, 3)
    page.wait_for_function(f"window.kvscope.charts().last === {times3[-1]!r}", timeout=30_000)
    assert charts(page)["utilizations"] == utils3
    page.click("#tl-live")
    page.wait_for_function("window.kvscope.charts().source === 'live'", timeout=30_000)
    assert page.console_log.errors == []


def make_recording(path) -> dict:
    """A recording made here (no server): a paged pool filled and half emptied, events apart in time."""
    pool = create_pool("paged", num_blocks=48, block_bytes=BLOCK, device="cpu", name="made-here",
                       history=True)
    rec = Recorder(pool, path)
    ids = []
    for i in range(12):
        ids.append(pool.allocate((i % 3 + 1) * BLOCK))
        time.sleep(0.01)
    for aid in ids[1::2]:
        pool.free(aid)
        time.sleep(0.01)
    rec.stop()
    return pool.stats()


def test_upload_a_recording_through_the_file_input_and_see_its_map_and_charts(browser, tmp_path):
    stats = make_recording(tmp_path / "incident.kvrec")
    log_path = tmp_path / "server.log"
    proc, base = serve(log_path, {"KVSCOPE_RECORDINGS_DIR": str(tmp_path / "recs")})
    try:
        with httpx.Client(base_url=base, timeout=10) as api:
            context = browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=base,
                                          bypass_csp=BYPASS_CSP)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            try:
                open_pool(page, "default")
                page.click(".controls-panel [data-tab=pool]")
                page.set_input_files("#recording-file", str(tmp_path / "incident.kvrec"))
                page.wait_for_function("window.kvscope.pool.startsWith('rec-upload-')"
                                       " && window.kvscope.connection === 'open'",
                                       timeout=30_000)
                pool = page.evaluate("window.kvscope.pool")
                assert "opened as pool " + pool in page.locator("#control-status").inner_text()
                stored = list((tmp_path / "recs").glob("upload-*.kvrec"))
                assert [p.read_bytes() for p in stored] == [(tmp_path / "incident.kvrec").read_bytes()]
                # the map is the recording's last moment
                runs = api.get(f"/api/pools/{pool}/blockmap?format=json").json()["runs"]
                live = sorted({r[2] for r in runs if r[2] >= 0})
                assert len(live) == stats["allocation_count"] == 6
                page.wait_for_function("JSON.stringify(window.kvscope.owners()) === "
                                       f"{json.dumps(live, separators=(',', ':'))!r}",
                                       timeout=30_000)
                # the charts are the recording's whole span, not samples taken since it opened
                info = api.get(f"/api/pools/{pool}/history").json()
                times, utils = series_utilization(api, pool, info["first_seq"], info["last_seq"])
                assert len(times) == 18
                page.wait_for_function("window.kvscope.charts().source === 'past'"
                                       f" && window.kvscope.charts().points === {len(times)}",
                                       timeout=30_000)
                shown = charts(page)
                assert shown["utilizations"] == utils and shown["first"] == times[0] and shown["last"] == times[-1]
                assert max(utils) > shown["utilization"] == stats["utilization"]  # it held more before the frees
                # scrubbing a recording keeps its whole span charted (the moment is marked)
                page.evaluate("(() => { const r = document.querySelector('#tl-range'); "
                              "r.value = '4'; r.dispatchEvent(new Event('input')); })()")
                page.wait_for_function("window.kvscope.timeline().shown === 4", timeout=30_000)
                assert charts(page)["points"] == len(times) and page.evaluate("window.kvscope.chartMark()") == times[3]
                # a file that is not a recording: the page says what it is, and stays where it was
                (tmp_path / "notes.kvrec").write_text("just some notes")
                page.set_input_files("#recording-file", str(tmp_path / "notes.kvrec"))
                page.wait_for_function("document.querySelector('#control-status').textContent.includes('422')",
                                       timeout=30_000)
                assert "not a kvscope recording" in page.locator("#control-status").inner_text()
                assert page.evaluate("window.kvscope.pool") == pool
                assert errors == []
            finally:
                context.close()
    finally:
        stop_server(proc)
