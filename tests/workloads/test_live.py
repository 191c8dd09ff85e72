import pytest

from allocator import InvalidRequest, KVCache, create_pool
from workloads.live import MAX_OPS_PER_ADVANCE, build_live_workload


def make_pool(strategy="paged", cache=True, blocks=1024):
    pool = create_pool(strategy, num_blocks=blocks, block_bytes=4096, device="cpu")
    if cache:
        KVCache(pool, pool.capacity_bytes // 2)
    return pool


def run_to_end(wl, dt=0.05, limit=20_000):
    for _ in range(limit):
        if not wl.advance(dt):
            return True
    return False


@pytest.mark.parametrize("strategy", ["paged", "contiguous", "tiered"])
@pytest.mark.parametrize("spec", [
    {"kind": "scenario", "name": "fragmentation", "seed": 0, "speed": 4.0},
    {"kind": "scenario", "name": "chat", "seed": 0, "speed": 4.0},
    {"kind": "scenario", "name": "burst", "seed": 0, "speed": 4.0},
    {"kind": "trace", "limit": 60, "speed": 20.0},
])
def test_live_workloads_run_to_the_end_and_leave_no_raw_allocations(strategy, spec):
    pool = make_pool(strategy)
    wl = build_live_workload(pool, spec)
    first = wl.progress()
    assert first["state"] == "running" and first["done"] == 0 and first["total"] > 0
    assert run_to_end(wl)
    p = wl.progress()
    assert p["state"] == "finished" and p["done"] == p["total"] > 0
    assert p["kind"] == spec["kind"]
    assert wl.advance(0.05) is False
    cached = sum(1 for _ in pool.cache.entries()) if pool.cache else 0
    assert len(pool) == cached  # only cache entries (chat) remain
    assert pool.check() == [] and pool.cache.check() == []
    kinds = [e["state"] for e in pool.events.after(0, kinds={"workload"})]
    assert kinds[0] == "running" and kinds[-1] == "finished"


def test_scenario_speed_one_runs_tens_of_ops_per_second():
    pool = make_pool()
    wl = build_live_workload(pool, {"kind": "scenario", "name": "chat", "seed": 0, "speed": 1.0})
    for _ in range(20 * 5):  # five wall seconds at 20 Hz
        wl.advance(0.05)
    assert 20 * 5 <= wl.progress()["done"] <= 200 * 5


def test_advance_is_bounded_per_call():
    pool = make_pool(blocks=4096)
    wl = build_live_workload(pool, {"kind": "scenario", "name": "burst", "seed": 0, "speed": 1000.0})
    wl.advance(100.0)
    assert wl.progress()["done"] <= MAX_OPS_PER_ADVANCE
    tr = build_live_workload(make_pool(blocks=4096), {"kind": "trace", "limit": 2000, "speed": 1000.0})
    tr.advance(1000.0)
    c = tr.pool.stats()["counters"]
    assert 0 < c["allocations"] + c["frees"] + c["extends"] <= MAX_OPS_PER_ADVANCE + 1


def test_stop_frees_what_the_workload_holds():
    pool = make_pool(cache=False)
    wl = build_live_workload(pool, {"kind": "trace", "limit": 200, "speed": 5.0})
    for _ in range(200):
        wl.advance(0.1)
        if pool.used_blocks > 20:
            break
    assert pool.used_blocks > 20
    wl.stop()
    assert pool.used_blocks == 0 and pool.check() == []
    assert wl.progress()["state"] == "stopped"
    assert wl.advance(0.1) is False
    wl.stop()  # idempotent


def test_trace_survives_a_pool_reset_under_it():
    pool = make_pool(cache=False)
    wl = build_live_workload(pool, {"kind": "trace", "limit": 100, "speed": 10.0})
    for _ in range(20):
        wl.advance(0.5)
    pool.reset()
    assert run_to_end(wl)
    assert pool.used_blocks == 0 and pool.check() == []


@pytest.mark.parametrize("spec, message", [
    ({"kind": "scenario", "name": "nope"}, "unknown scenario"),
    ({"kind": "movie"}, "unknown workload kind"),
    ({"kind": "scenario", "name": "burst", "speed": 0}, "speed"),
    ({"kind": "scenario", "name": "burst", "speed": float("nan")}, "speed"),
    ({"kind": "scenario", "name": "burst", "seed": -1}, "seed"),
    ({"kind": "scenario", "name": "burst", "seed": "x"}, "seed"),
    ({"kind": "trace", "limit": 0}, "limit"),
    ({"kind": "trace", "limit": 10, "color": "red"}, "unknown workload field"),
    ("trace", "must be an object"),
])
def test_bad_specs_raise_invalid_request(spec, message):
    with pytest.raises(InvalidRequest, match=message):
        build_live_workload(make_pool(), spec)


def test_chat_without_a_cache_is_rejected_at_build_time():
    with pytest.raises(InvalidRequest, match="cache"):
        build_live_workload(make_pool(cache=False), {"kind": "scenario", "name": "chat"})


def test_server_style_spec_with_null_fields_is_accepted():
    wl = build_live_workload(make_pool(), {"kind": "trace", "name": None, "seed": 0, "speed": 1.0, "limit": None})
    assert wl.progress()["total"] == 500


@pytest.mark.parametrize("strategy", ["paged", "contiguous"])
def test_progress_stays_below_total_while_running_even_after_a_reset(strategy):
    pool = make_pool(strategy, cache=False)
    wl = build_live_workload(pool, {"kind": "scenario", "name": "fragmentation", "seed": 0, "speed": 4.0})
    estimate = wl.progress()["total"]
    reset_done = False
    seen = []
    for _ in range(20_000):
        more = wl.advance(0.05)
        p = wl.progress()
        seen.append(p)
        if not more:
            break
        assert p["state"] == "running" and 0 <= p["done"] < p["total"], p
        if not reset_done and pool.used_blocks > pool.num_blocks // 2:
            pool.reset()  # the fill phase starts over: more ops than estimated
            reset_done = True
    assert reset_done
    p = wl.progress()
    assert p["state"] == "finished" and p["done"] == p["total"] > estimate
    totals = [q["total"] for q in seen[:-1]]
    assert all(b >= a for a, b in zip(totals, totals[1:]))  # the estimate only grows
    last = [e for e in pool.events.after(0, kinds={"workload"})][-1]
    assert last["state"] == "finished"
    assert len(pool) == 0 and pool.check() == []
