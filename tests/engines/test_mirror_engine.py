"""A kvscope mirror held to a real vLLM engine's own BlockPool after every engine step: batches in
flight at once, an engine killed mid-stream and restarted (with byte hashes), and a mirror that
joins late and catches up through the replay socket."""

from __future__ import annotations

import pytest
from enginetest import Driver, Mirror, ports, request_batches

pytestmark = pytest.mark.engines


def drive(driver: Driver, mirrors: list[Mirror], batches, steps_cap: int = 2000) -> dict:
    """Feed each batch, adding the next one while the previous is still decoding; after every
    step each mirror must hold exactly the engine's cached set. Returns counters."""
    steps = max_unfinished = 0
    seen: set[int] = set()
    for batch in batches:
        driver.add(batch)
        for _ in range(4):  # the next batch arrives mid-flight
            answer = driver.step()
            steps += 1
            max_unfinished = max(max_unfinished, answer["unfinished"])
            seen |= set(answer["cached"])
            for m in mirrors:
                m.catch_up(answer)
    while True:
        answer = driver.step()
        steps += 1
        seen |= set(answer["cached"])
        for m in mirrors:
            m.catch_up(answer)
        if not answer["unfinished"]:
            break
        assert steps < steps_cap
    return {"steps": steps, "max_unfinished": max_unfinished, "blocks_seen": len(seen)}


def test_mirror_equals_the_engine_after_every_step_with_batches_in_flight(engine_env, tmp_path,
                                                                         figures):
    ev, rp = ports()
    mirror = Mirror(ev, rp)
    driver = Driver(engine_env, ev, rp, tmp_path / "engine.log", num_blocks=64, max_num_seqs=8)
    try:
        got = drive(driver, [mirror], request_batches(1, 10))
    finally:
        driver.quit()
        mirror.close()
    figures.append(f"in-process engine: up after {driver.ready['boot_s']} s; concurrency: "
                   f"{got['steps']} steps compared, up to {got['max_unfinished']} requests "
                   f"unfinished (8 scheduled at once), {got['blocks_seen']} distinct blocks cached")
    # Several requests were in flight at once, and the engine cycled more blocks than it has.
    assert got["max_unfinished"] >= 4, got
    assert got["blocks_seen"] > 63, got
    c = mirror.pool.mirror_counters
    assert c["removed_blocks"] > 0 and mirror.sub.status()["error_count"] == 0, (c, mirror.sub.status())


def test_engine_killed_mid_stream_restarts_with_byte_hashes_and_a_late_mirror_catches_up(
        engine_env, tmp_path):
    ev, rp = ports()
    mirror = Mirror(ev, rp)
    first = Driver(engine_env, ev, rp, tmp_path / "first.log")
    try:
        first.add(next(request_batches(2, 1, (6, 6))))
        for _ in range(5):
            answer = first.step()
            mirror.catch_up(answer)
        assert answer["unfinished"] > 0 and mirror.hashes(), "kill it while requests decode"
    finally:
        first.kill()
    assert mirror.sub.restarts == 0
    # The same ports, now naming blocks by their hash bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
    second = Driver(engine_env, ev, rp, tmp_path / "second.log",
                    env={"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"})
    late = None
    try:
        batches = list(request_batches(3, 6))
        drive(second, [mirror], batches[:3])
        assert mirror.sub.restarts == 1, mirror.sub.status()
        assert mirror.pool.mirror_counters["cleared_events"] == 1
        # A mirror joining now has missed every batch so far: it asks the replay socket.
        late = Mirror(ev, rp, late=True)
        drive(second, [mirror, late], batches[3:])
        assert late.sub.replays >= 1 and late.sub.replayed_batches > 0, late.sub.status()
        assert late.sub.lost_batches == 0 and late.hashes() == mirror.hashes()
        assert late.sub.status()["error_count"] == 0, late.sub.status()
    finally:
        second.quit()
        mirror.close()
        if late is not None:
            late.close()
