"""vLLM's and SGLang's own ZmqEventPublisher (from their wheels) drive kvscope's mirror."""

from __future__ import annotations

import time

import pytest
from support.kve_source import RefPrefixCache, to_engine

from allocator.prefix.mirror import MirrorPool
from kvevents.follow import follow
from kvevents.subscriber import Subscriber

# Generous deadlines: a loaded machine may take seconds to run the engine's publisher thread.
# The replay socket must answer within REPLAY_TIMEOUT or the subscriber counts the gap lost.
REPLAY_TIMEOUT = 30.0
DEADLINE = 60.0


def wait_for(cond, timeout: float = DEADLINE, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class Engine:
    """One engine publisher (vLLM's or SGLang's own class) plus the reference cache it reports."""

    def __init__(self, mod, engine: str, endpoint: str, replay: str, buffer_steps: int = 10_000,
                 seed: int = 0):
        self.mod, self.engine = mod, engine
        self.pub = mod.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay,
                                         buffer_steps=buffer_steps, topic="kv")
        self.source = RefPrefixCache(seed=seed)
        self.seq = -1

    def send(self, events) -> int:
        self.pub.publish(self.mod.KVEventBatch(ts=time.time(), events=to_engine(self.mod, events, self.engine)))
        self.seq += 1
        return self.seq

    def close(self):
        self.pub.shutdown()


def publish_and_wait(engine: Engine, sub: Subscriber, events, restarts: int = 0) -> None:
    """Publish one batch and wait until the mirror applied it (after `restarts` engine restarts).
    A SUB socket that is still connecting misses the first batches (ZeroMQ's slow joiner); the
    next one then shows the gap and the replay socket fills it, so an empty batch is sent when
    nothing arrives for a while."""
    seq = engine.send(events)
    end = time.monotonic() + DEADLINE
    nudge = time.monotonic() + 0.5
    while sub.restarts != restarts or sub.last_seq is None or sub.last_seq < seq:
        if time.monotonic() > end:
            raise AssertionError(f"batch {seq} never applied: {sub.status()}")
        time.sleep(0.005)
        if time.monotonic() > nudge:
            seq = engine.send([])
            nudge = time.monotonic() + 0.5


@pytest.fixture(params=["vllm", "sglang"])
def engine(request, ipc, vllm_kv, sglang_kv):
    mod = vllm_kv if request.param == "vllm" else sglang_kv
    eng = Engine(mod, request.param, ipc("pub"), ipc("replay"))
    yield eng
    eng.close()


def mirror_of(eng: Engine, num_blocks: int = 64, **kw):
    pool = MirrorPool(num_blocks, name="m", device="cpu")
    kw.setdefault("replay_timeout", REPLAY_TIMEOUT)
    sub = follow(pool, eng.pub._endpoint, topic="kv", replay_endpoint=eng.pub._replay_endpoint, **kw)
    return pool, sub


def test_mirror_equals_engine_after_every_batch(engine):
    pool, sub = mirror_of(engine)
    try:
        for _ in range(60):
            publish_and_wait(engine, sub, engine.source.step())
            assert pool.cached_hashes() == engine.source.cached
            assert pool.check() == []
        st = sub.status()
        assert st["lost_batches"] == 0 and st["error_count"] == 0, st
        assert pool.stats()["used_blocks"] == len(engine.source.cached)
        forest = pool.forest()
        assert forest["roots"] >= 1 and forest["max_depth"] >= 2
        assert forest["top_prefixes"], "shared system prompts must show as shared prefixes"
    finally:
        sub.stop()


class Dropping(Subscriber):
    """Loses the live messages whose seq is in `drop`, as a congested network would."""

    drop: range = range(0)

    def handle(self, frames):
        if len(frames) == 3 and int.from_bytes(frames[1], "big") in self.drop:
            return
        super().handle(frames)


def follow_dropping(eng, drop, pool):
    sub = Dropping(eng.pub._endpoint, topic="kv", replay_endpoint=eng.pub._replay_endpoint,
                   replay_timeout=REPLAY_TIMEOUT,
                   on_batch=lambda s, b: pool.apply(b.events),
                   on_restart=lambda: None)
    sub.drop = drop
    pool.source = sub
    return sub.start()


def test_dropped_range_is_recovered_through_replay(engine):
    pool = MirrorPool(64, name="m", device="cpu")
    sub = follow_dropping(engine, range(5, 10), pool)
    try:
        for _ in range(20):
            events = engine.source.step()
            if engine.seq + 1 in sub.drop:
                engine.send(events)  # lost on the way: nothing to wait for
                continue
            publish_and_wait(engine, sub, events)
            assert pool.cached_hashes() == engine.source.cached
        st = sub.status()
        # One gap for the dropped range (plus one if the SUB socket joined after batch 0).
        assert 1 <= st["gaps"] <= 2 and st["replays"] >= 1, st
        assert st["replayed_batches"] >= 5 and st["lost_batches"] == 0, st
    finally:
        sub.stop()


def test_range_beyond_replay_buffer_is_counted_lost(ipc, vllm_kv):
    eng = Engine(vllm_kv, "vllm", ipc("pub"), ipc("replay"), buffer_steps=3)
    pool = MirrorPool(64, name="m", device="cpu")
    sub = follow_dropping(eng, range(0), pool)
    try:
        # Joined first: a slow joiner's own gap (the nudges of publish_and_wait) may already
        # exceed the 3-batch buffer, so the losses counted here are those after it.
        publish_and_wait(eng, sub, eng.source.step())
        lost_before, replayed_before = sub.lost_batches, sub.replayed_batches
        first = eng.seq + 1
        sub.drop = range(first, first + 7)
        while eng.seq < first + 9:
            events = eng.source.step()
            if eng.seq + 1 in sub.drop:
                eng.send(events)
                continue
            publish_and_wait(eng, sub, events)
        st = sub.status()
        # At seq first+7 the engine buffers first+5..first+7 only: first..first+4 are gone for
        # good, and said so.
        assert st["lost_batches"] - lost_before == 5, st
        assert st["replayed_batches"] - replayed_before >= 2, st
        assert pool.stats()["mirror"]["source"]["lost_batches"] == lost_before + 5
    finally:
        sub.stop()
        eng.close()


def test_all_blocks_cleared_empties_the_mirror(engine):
    pool, sub = mirror_of(engine)
    try:
        for _ in range(10):
            publish_and_wait(engine, sub, engine.source.step())
        assert pool.used_blocks > 0
        publish_and_wait(engine, sub, engine.source.clear())
        assert pool.cached_hashes() == set() and pool.used_blocks == 0
        assert pool.check() == []
        publish_and_wait(engine, sub, engine.source.step())
        assert pool.cached_hashes() == engine.source.cached
    finally:
        sub.stop()


@pytest.mark.parametrize("which", ["vllm", "sglang"])
def test_engine_restart_resets_the_mirror(which, ipc, vllm_kv, sglang_kv):
    mod = vllm_kv if which == "vllm" else sglang_kv
    pub, rep = ipc("pub"), ipc("replay")
    first = Engine(mod, which, pub, rep, seed=1)
    pool, sub = mirror_of(first)
    try:
        for _ in range(15):
            publish_and_wait(first, sub, first.source.step())
        assert pool.cached_hashes() == first.source.cached
        first.close()
        second = Engine(mod, which, pub, rep, seed=2)  # a new process: empty cache, seq 0
        try:
            for _ in range(5):
                publish_and_wait(second, sub, second.source.step(), restarts=1)
                assert pool.cached_hashes() == second.source.cached
            assert sub.status()["restarts"] == 1
            assert pool.check() == []
        finally:
            second.close()
    finally:
        sub.stop()
