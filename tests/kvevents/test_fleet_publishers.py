"""A fleet fed by vLLM's and SGLang's own ZmqEventPublisher (from their wheels): engines with
different hash seeds caching the same prompts, DP ranks, restarts, bad input, recordings."""

from __future__ import annotations

import socket
import time

import msgspec
import pytest
import zmq
from support.kve_source import RefPrefixCache, chain_hash, to_engine
from test_real_publishers import DEADLINE, Engine, publish_and_wait, wait_for

from kvevents.codec import Cleared, Removed, Stored
from kvevents.fleet import EngineSpec, Fleet


def spec_of(eng: Engine, name: str, **kw) -> EngineSpec:
    return EngineSpec(name=name, endpoint=eng.pub._endpoint, topic="kv",
                      replay_endpoint=eng.pub._replay_endpoint, block_size=4, **kw)


def held_prefix(src: RefPrefixCache, tokens: list[int]) -> int:
    """Blocks of `tokens` the engine holds from the first on (its own hash chain)."""
    n, parent = 0, src.hash_seed
    for i in range(0, len(tokens) - src.block_size + 1, src.block_size):
        parent = chain_hash(parent, tokens[i:i + src.block_size])
        if parent not in src.lru:
            break
        n += 1
    return n


def applied(fleet: Fleet, name: str) -> int:
    with fleet.lock:
        return fleet.index.engine_stats(name)["batches"] if name in fleet.index.engines else -1


def publish_all(fleet: Fleet, engines: dict[str, Engine], steps: int) -> None:
    """Publish `steps` batches per engine and wait until the fleet applied every one (an empty
    batch nudges a subscriber that missed the first ones while joining: replay fills the gap)."""
    for _ in range(steps):
        for eng in engines.values():
            eng.send(eng.source.step())
    end = time.monotonic() + DEADLINE
    while any(applied(fleet, n) < e.seq + 1 for n, e in engines.items()):
        assert time.monotonic() < end, {n: fleet.links[n].health() for n in engines}
        time.sleep(0.05)
        for n, e in engines.items():
            if applied(fleet, n) < e.seq + 1 and fleet.links[n].subscriber.last_seq is None:
                e.send([])


@pytest.fixture
def two_engines(ipc, vllm_kv, sglang_kv):
    a = Engine(vllm_kv, "vllm", ipc("a"), ipc("ar"))
    b = Engine(sglang_kv, "sglang", ipc("b"), ipc("br"))
    a.source = RefPrefixCache(seed=1, hash_seed=1111)
    b.source = RefPrefixCache(seed=2, hash_seed=2222)
    b.source.prompts = a.source.prompts  # the same system prompts, hashed differently
    yield {"a": a, "b": b}
    a.close()
    b.close()


def test_fleet_of_vllm_and_sglang_matches_what_each_engine_holds(two_engines):
    fleet = Fleet("t")
    try:
        for name, eng in two_engines.items():
            fleet.add(spec_of(eng, name))
        for _ in range(5):
            publish_all(fleet, two_engines, 8)
            with fleet.lock:
                assert fleet.index.check() == []
                for p in two_engines["a"].source.prompts:
                    got = fleet.index.match(p)
                    assert got == {n: held_prefix(e.source, p) for n, e in two_engines.items()}
                for n, e in two_engines.items():
                    assert fleet.index.engine_stats(n)["cached_blocks"] == len(e.source.cached)
        with fleet.lock:
            stats = fleet.index.stats()
            # the same prompts under different hash seeds are still found to be the same blocks
            assert stats["duplicated_blocks"] > 0 and stats["cross_engine_recomputes"] > 0
            assert stats["recompute_tokens"] == 4 * stats["cross_engine_recomputes"]
            rows = {r["name"]: r for r in fleet.engines()}
        for r in rows.values():
            assert r["keyed_by"] == "tokens" and r["block_size"] == 4 and not r["errors"]
            assert r["stream"]["lost_batches"] == 0 and r["stream"]["error_count"] == 0
            assert r["stream"]["state"] in ("live", "connected")
            assert 0 <= r["stream"]["apply_lag_p50_ms"] <= r["stream"]["apply_lag_p99_ms"]
    finally:
        fleet.close()


def test_restart_clears_that_engine_only(two_engines, vllm_kv, ipc):
    fleet = Fleet("t")
    try:
        for name, eng in two_engines.items():
            fleet.add(spec_of(eng, name))
        publish_all(fleet, two_engines, 6)
        with fleet.lock:
            b_before = fleet.index.engine_stats("b")["cached_blocks"]
        a = two_engines["a"]
        a.close()
        fresh = Engine(vllm_kv, "vllm", a.pub._endpoint, a.pub._replay_endpoint)
        fresh.source = RefPrefixCache(seed=5, hash_seed=1111)
        two_engines["a"] = fresh
        # seq 0 again: the subscriber sees a restart
        publish_and_wait(fresh, fleet.links["a"].subscriber, fresh.source.step(), restarts=1)
        wait_for(lambda: fleet.index.engine_stats("a")["cached_blocks"] == len(fresh.source.cached),
                 what="the restarted engine's blocks")
        with fleet.lock:
            assert fleet.index.engine_stats("b")["cached_blocks"] == b_before
            assert fleet.index.check() == []
        fresh.close()
    finally:
        fleet.close()


def free_port_pair() -> int:
    """A loopback port p with p + 1 also free (vLLM's rank r publishes on port + r)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
        return p
    raise AssertionError("no two consecutive free ports")


def bind_on_free_pairs(make, tries: int = 5):
    """make(pub_port, replay_port), each port p of a pair with p + 1 free when chosen. The ports
    are chosen before make binds them, so another process may take one in between: a bind that
    fails with EADDRINUSE tries fresh pairs (make closes what it opened before raising)."""
    for attempt in range(tries):
        try:
            return make(free_port_pair(), free_port_pair())
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == tries - 1:
                raise


def test_dp_ranks_are_engines_grouped_under_their_server(vllm_kv):
    # vLLM's publisher of rank r binds port + r and tags its batches with rank r.
    def make(pub_port: int, replay_port: int):
        ranks = {}
        try:
            for r in (0, 1):
                eng = Engine.__new__(Engine)
                eng.mod, eng.engine, eng.seq = vllm_kv, "vllm", -1
                eng.pub = vllm_kv.ZmqEventPublisher(r, endpoint=f"tcp://*:{pub_port}",
                                                    replay_endpoint=f"tcp://*:{replay_port}",
                                                    buffer_steps=10_000, topic="kv")
                eng.source = RefPrefixCache(seed=r + 1, hash_seed=7)
                ranks[r] = eng
        except BaseException:
            for eng in ranks.values():
                eng.close()
            raise
        return pub_port, replay_port, ranks

    pub_port, replay_port, ranks = bind_on_free_pairs(make)
    fleet = Fleet("dp")
    try:
        for r in (0, 1):
            fleet.add(EngineSpec(f"srv-r{r}", f"tcp://127.0.0.1:{pub_port + r}",
                                 f"tcp://127.0.0.1:{replay_port + r}", "kv", block_size=4,
                                 dp_rank=r, server="srv"))
        publish_all(fleet, {"srv-r0": ranks[0], "srv-r1": ranks[1]}, 5)
        with fleet.lock:
            rows = {r["name"]: r for r in fleet.engines()}
            assert set(rows) == {"srv-r0", "srv-r1"}
            assert rows["srv-r0"]["server"] == rows["srv-r1"]["server"] == "srv"
            assert (rows["srv-r0"]["dp_rank"], rows["srv-r1"]["dp_rank"]) == (0, 1)
            for r in (0, 1):
                assert rows[f"srv-r{r}"]["cached_blocks"] == len(ranks[r].source.cached)
    finally:
        fleet.close()
        for eng in ranks.values():
            eng.close()


def test_one_endpoint_carrying_several_ranks_makes_one_engine_per_rank(ipc, vllm_kv):
    eng = Engine(vllm_kv, "vllm", ipc("m"), ipc("mr"))
    fleet = Fleet("m")
    try:
        fleet.add(spec_of(eng, "srv"))
        src1 = RefPrefixCache(seed=3, hash_seed=9)
        for _ in range(4):
            eng.send(eng.source.step())
            # the same socket, batches tagged rank 1 (a router relaying a DP server)
            eng.pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=[], data_parallel_rank=1))
            eng.seq += 1
        eng.pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=to_engine(vllm_kv, src1.step()),
                                             data_parallel_rank=1))
        eng.seq += 1
        end = time.monotonic() + DEADLINE
        while applied(fleet, "srv:dp1") < 1 or applied(fleet, "srv") + applied(fleet, "srv:dp1") < eng.seq + 1:
            assert time.monotonic() < end, (applied(fleet, "srv"), applied(fleet, "srv:dp1"), eng.seq,
                                            fleet.links["srv"].health())
            time.sleep(0.2)
            if fleet.links["srv"].subscriber.last_seq is None:
                eng.send([])  # a SUB socket that joined after the last batch sees the gap now
        with fleet.lock:
            rows = {r["name"]: r for r in fleet.engines()}
        assert rows["srv:dp1"]["cached_blocks"] == len(src1.cached)
        assert rows["srv:dp1"]["server"] == "srv" and rows["srv:dp1"]["dp_rank"] == 1
        assert rows["srv"]["cached_blocks"] == len(eng.source.cached)
    finally:
        fleet.close()
        eng.close()


def test_unreachable_endpoint_shows_its_state_and_is_retried(tmp_path):
    fleet = Fleet("u")
    try:
        fleet.add(EngineSpec("gone", f"ipc://{tmp_path}/nobody.sock"))
        link = fleet.links["gone"]
        wait_for(lambda: link.retries >= 2, what="retries")
        h = link.health()
        assert h["state"] == "unreachable" and h["retry_in_ms"] > 0
        first = link.retry_in_ms
        wait_for(lambda: link.retry_in_ms is not None and link.retry_in_ms > first,
                 what="a longer retry interval (backoff)")
    finally:
        fleet.close()


def test_malformed_batches_are_counted_per_engine_and_the_fleet_goes_on(two_engines):
    fleet = Fleet("bad")
    try:
        for name, eng in two_engines.items():
            fleet.add(spec_of(eng, name))
        publish_all(fleet, two_engines, 2)
        a = two_engines["a"]
        # garbage on engine a's wire: not msgpack, then a batch whose event is not an event
        sock = a.pub._pub
        a.seq += 1
        sock.send_multipart((b"kv", a.seq.to_bytes(8, "big"), b"\xc1 not msgpack"))
        a.seq += 1
        sock.send_multipart((b"kv", a.seq.to_bytes(8, "big"),
                             msgspec.msgpack.encode([time.time(), [{"type": "BlockStored",
                                                                     "block_hashes": "x"}], 0])))
        wait_for(lambda: fleet.links["a"].subscriber.errors["malformed"] >= 1 and
                 fleet.links["a"].subscriber.errors["malformed_event"] >= 1, what="errors counted")
        assert fleet.links["b"].subscriber.status()["error_count"] == 0
        publish_all(fleet, {"b": two_engines["b"]}, 3)
        with fleet.lock:
            assert fleet.index.engine_stats("b")["cached_blocks"] == len(two_engines["b"].source.cached)
    finally:
        fleet.close()


def test_fleet_recording_plays_back_into_the_same_index(two_engines, tmp_path):
    path = str(tmp_path / "fleet.kvevents")
    fleet = Fleet("rec", record=path)
    try:
        for name, eng in two_engines.items():
            fleet.add(spec_of(eng, name))
        publish_all(fleet, two_engines, 6)
    finally:
        fleet.close()
    with fleet.lock:
        want = {n: fleet.index.engine_stats(n)["cached_blocks"] for n in two_engines}
        want_stats = fleet.index.stats()
    replay = Fleet("play")
    try:
        out = replay.play(path)
        assert out["batches"] == sum(e.seq + 1 for e in two_engines.values())
        with replay.lock:
            got = {n: replay.index.engine_stats(n)["cached_blocks"] for n in two_engines}
            assert got == want and replay.index.stats() == want_stats
            assert replay.index.check() == []
    finally:
        replay.close()


def test_a_vllm_engine_that_offloads_is_indexed_per_tier(vllm_kv, ipc):
    """vLLM's own publisher and structs, as its offloading connector publishes: GPU blocks copied
    to the CPU (self-describing: hashes, parent, tokens) and to storage (by hash alone, block
    size 0, its placeholder), evicted from the GPU, removed from one tier by medium; then
    AllBlocksCleared, and a restart, empty every tier."""
    eng = Engine(vllm_kv, "vllm", ipc("o"), ipc("or"))
    fleet = Fleet("t")
    try:
        fleet.add(spec_of(eng, "a"))
        toks = list(range(40, 52))
        hashes = [chain_hash(None, toks[:4])]
        for i in (4, 8):
            hashes.append(chain_hash(hashes[-1], toks[i:i + 4]))

        def send(events) -> None:
            eng.send(events)
            wait_for(lambda: applied(fleet, "a") >= eng.seq + 1, what=f"batch {eng.seq} applied")

        def tiers() -> dict:
            with fleet.lock:
                return fleet.index.engine_stats("a")["tiers"]

        def weighted() -> dict:
            with fleet.lock:
                return fleet.match_weighted(toks, {"gpu": 1.0, "cpu": 0.8, "disk": 0.5})

        def connected() -> bool:
            eng.send([])
            return applied(fleet, "a") > 0
        wait_for(connected, what="the fleet follows the engine")
        send([Stored(hashes, None, toks, 4, "GPU"), Stored(hashes[:2], None, toks[:8], 4, "CPU"),
              Stored(hashes[2:], None, [], 0, "STORAGE")])
        assert tiers() == {"gpu": 3, "cpu": 2, "disk": 1}
        send([Removed(hashes[1:], "GPU")])  # evicted from the GPU: the offloaded copies stay
        assert tiers() == {"gpu": 1, "cpu": 2, "disk": 1}
        assert weighted() == {"a": pytest.approx(1.0 + 0.8 + 0.5)}
        with fleet.lock:
            device, lower = fleet.match_tiered(toks)
        assert device == {"a": 1} and lower == {"cpu": {"a": 1}, "disk": {"a": 1}}
        send([Removed(hashes[1:2], "CPU")])  # the remove names its medium: the GPU's copy is gone already
        assert tiers() == {"gpu": 1, "cpu": 1, "disk": 1} and weighted() == {"a": pytest.approx(1.0)}
        send([Cleared()])  # vLLM's AllBlocksCleared: every tier of the engine
        assert tiers() == {"gpu": 0, "cpu": 0, "disk": 0}
        send([Stored(hashes[:1], None, toks[:4], 4, "CPU")])
        assert tiers()["cpu"] == 1
        with fleet.lock:
            assert fleet.index.check() == [] and fleet.index.engine_stats("a")["malformed_events"] == 0
        eng.close()
        fresh = Engine(vllm_kv, "vllm", eng.pub._endpoint, eng.pub._replay_endpoint)
        eng = fresh
        publish_and_wait(fresh, fleet.links["a"].subscriber, [], restarts=1)  # seq 0 again: a restart
        assert tiers() == {"gpu": 0, "cpu": 0, "disk": 0}
    finally:
        eng.close()
        fleet.close()
