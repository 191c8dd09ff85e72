"""The serving simulator with prefix caching on a finite pool, against prefix caching off."""

import json

import pytest

from workloads.mooncake import load_mooncake, parse_mooncake
from workloads.prefix_sim import build, compare, mode_report, sim_config


def trace_of(*requests):
    """requests: (arrival s, input_length, output_length, ids)."""
    return parse_mooncake([json.dumps({"timestamp": int(t * 1000), "input_length": n_in,
                                       "output_length": n_out, "hash_ids": ids})
                           for t, n_in, n_out, ids in requests], source="hand.jsonl")


def test_a_cached_prefix_is_not_prefilled_again():
    # R1 repeats R0's prompt (1024 tokens, all 64 blocks cached): it computes one token, as an
    # engine recomputes the last one. R2 shares the first 512-token block: computes 1000 - 512.
    trace = trace_of((0, 1024, 10, [1, 2]), (100, 1024, 10, [1, 2]), (200, 1000, 10, [1, 3]))
    cfg = sim_config(max_len=4096, pool_tokens=8192)
    on = build(trace, cfg, "prefix").run()
    off = build(trace, cfg, "no-prefix").run()
    assert [r.computed for r in on.requests] == [1024, 1, 488]
    assert [r.computed for r in off.requests] == [1024, 1024, 1000]
    report = mode_report(on, "prefix")
    assert report["hit_ratio"] == pytest.approx((1023 + 512) / 3048)
    assert report["prefill_tokens"] == 1024 + 1 + 488 and report["completed"] == 3
    assert mode_report(off, "no-prefix")["hit_ratio"] == 0
    assert on.pool.check() == [] and on.pool.prefix_stats()["sequences"] == 0
    # Less prefill, so the later requests finish sooner than without caching.
    assert on.requests[2].finished_at < off.requests[2].finished_at


def test_preempted_request_readmits_its_prompt_from_the_cache_and_recomputes_the_rest():
    # Two 500-token prompts growing to 1020 tokens (64 blocks each) in a 96-block pool: the later
    # one is preempted at 48 blocks. Its prompt's 31 full blocks stay cached while idle: the
    # other needs only 16 more blocks and takes the 17 freed ones first. So re-admission
    # computes only the partial block and what it had generated.
    trace = trace_of((0, 500, 520, [5]), (0, 500, 520, [6]))
    cfg = sim_config(max_len=1024, pool_tokens=1536)
    sim = build(trace, cfg, "prefix").run()
    r0, r1 = sim.requests
    assert sim.counters.completed == 2 and sim.counters.preemptions >= 1 and r1.preemptions >= 1
    assert r0.computed == 500
    assert r1.cached == 496 and r1.computed == 500 + r1.context - 496
    assert sim.pool.check() == [] and sim.pool.used_blocks == 0


def test_compare_on_a_slice_of_the_bundled_trace():
    trace = load_mooncake(limit=150)
    report = compare(trace, sim_config(pool_tokens=400_000))
    on, off = report["modes"]["prefix"], report["modes"]["no-prefix"]
    assert on["completed"] == off["completed"] == 150
    assert on["prompt_tokens"] == off["prompt_tokens"] == int(trace.input_length.sum())
    assert 0 < on["hit_ratio"] < 1 and off["hit_ratio"] == 0
    assert on["prefill_tokens"] < off["prefill_tokens"]
    assert report["prefill_saved"] == pytest.approx(1 - on["prefill_tokens"] / off["prefill_tokens"])
    assert "Mooncake" in report["attribution"]
