"""Dynamo's event plane: the wire decoded exactly (named and positional forms, the frame, the
envelope), and Dynamo's own KvEventPublisher over ZeroMQ mirrored into a fleet that answers as
Dynamo's own RadixTree fed the same events does."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from kve_dynamo import BS, Reference, Runtime, Worker, queries
from kve_zmq import connect_joined
from test_real_publishers import wait_for

from kvevents.codec import WireError
from kvevents.dynamo import (
    TIERS,
    decode_envelope,
    decode_router_events,
    encode_envelope,
    encode_router_events,
    frame,
    tokens_hashes,
    unframe,
)
from kvevents.fleet import EngineSpec, Fleet

enc = msgspec.msgpack.encode


def stored(worker=7, rank=0, tier="device", parent=None, blocks=((101, 11), (102, 12)), eid=1):
    return {"worker_id": worker, "storage_tier": tier, "event": {"event_id": eid, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}},
        "dp_rank": rank}}


# -- the wire, decoded exactly ------------------------------------------------------------------------
def test_named_and_positional_forms_decode_alike():
    named = [stored(), {"worker_id": 7, "event": {"event_id": 2, "data": {"removed": {"block_hashes": [102]}},
                                                  "dp_rank": 0}},
             {"worker_id": 7, "event": {"event_id": 3, "data": "cleared", "dp_rank": 0}},
             {"worker_id": 7, "event": {"event_id": 4, "data": {"cleared": None}, "dp_rank": 0}}]
    positional = [[7, "device", [1, {"stored": [None, [[101, 11], [102, 12]]]}, 0]],
                  [7, "device", "worker", [2, {"removed": [[102]]}, 0]],
                  [7, [3, "cleared", 0]],
                  [7, "device", [4, {"cleared": None}, 0]]]
    a, b = decode_router_events(enc(named)), decode_router_events(enc(positional))
    assert a.malformed == b.malformed == 0
    assert [(w, bt.dp_rank, bt.events) for w, bt in a.parts] == [(w, bt.dp_rank, bt.events) for w, bt in b.parts]
    (worker, batch), = a.parts
    assert worker == 7 and batch.dp_rank == 0
    kinds = [e.kind for e in batch.events]
    assert kinds == ["stored", "removed", "cleared", "cleared"]
    st_ = batch.events[0]
    assert st_.block_hashes == [101, 102] and st_.parent is None and st_.token_ids == [11, 12]
    assert st_.block_size == 1 and st_.medium == "GPU"
    one = decode_router_events(enc(stored()))  # one RouterEvent alone (older releases)
    assert one.parts[0][1].events == [st_]


def test_unknown_fields_are_ignored_and_missing_ones_are_malformed():
    extra = stored()
    extra["future"] = {"x": 1}
    extra["event"]["also"] = [1, 2]
    extra["event"]["data"]["stored"]["start_position"] = 3
    extra["event"]["data"]["stored"]["blocks"][0]["mm_extra_info"] = None
    bad = [{"storage_tier": "device", "event": {"event_id": 1, "data": "cleared"}},  # no worker_id
           {"worker_id": 7},  # no event
           {"worker_id": 7, "event": {"event_id": 1}},  # no data
           {"worker_id": 7, "event": {"event_id": 1, "data": {"stored": {"parent_hash": None}}}},
           {"worker_id": 7, "event": {"event_id": 1, "data": {"removed": {}}}},
           {"worker_id": 7, "event": {"event_id": 1, "data": "wiped"}},
           {"worker_id": 7, "storage_tier": "tape", "event": {"event_id": 1, "data": "cleared"}},
           {"worker_id": -1, "event": {"event_id": 1, "data": "cleared"}},
           {"worker_id": 7, "event": {"event_id": 1, "data": "cleared", "dp_rank": 5000}},
           {"worker_id": 7, "event": {"event_id": 1, "data": {"stored": {"blocks": [{"tokens_hash": 1}]}}}}]
    out = decode_router_events(enc([extra, *bad]))
    assert out.malformed == len(bad) and len(out.problems) == 4
    assert out.parts[0][1].events[0].block_hashes == [101, 102]


def test_hashes_fold_to_u64_and_a_block_without_tokens_hash_keys_by_the_engines_hashes():
    out = decode_router_events(enc([stored(parent=-5, blocks=((-1, (1 << 64) - 2), (3, 4)))]))
    ev = out.parts[0][1].events[0]
    assert ev.parent == (1 << 64) - 5 and ev.block_hashes == [(1 << 64) - 1, 3]
    assert ev.token_ids == [-2, 4]  # tokens_hash as the index's signed token
    no_tokens = stored()
    del no_tokens["event"]["data"]["stored"]["blocks"][1]["tokens_hash"]
    ev = decode_router_events(enc([no_tokens])).parts[0][1].events[0]
    assert ev.token_ids is None and ev.block_size is None


def test_tiers_are_kept_as_media_and_counted():
    out = decode_router_events(enc([stored(tier=t) for t in TIERS]))
    assert [e.medium for e in out.parts[0][1].events] == ["GPU", "CPU_PINNED", "DISK", "EXTERNAL"]
    assert out.tier_blocks == dict.fromkeys(TIERS, 2)


def test_events_of_several_workers_and_ranks_are_batches_of_their_own():
    out = decode_router_events(enc([stored(7, 0), stored(7, 0), stored(7, 1), stored(8, 1)]))
    assert [(w, b.dp_rank, len(b.events)) for w, b in out.parts] == [(7, 0, 2), (7, 1, 1), (8, 1, 1)]


def test_frames_and_envelopes_that_cannot_be_read_say_why():
    env = encode_envelope(5, 9, enc([stored()]), published_at=1700000000000)
    e = decode_envelope(unframe(frame(env)))
    assert (e.publisher_id, e.sequence, e.topic, e.published_at) == (5, 9, "kv-events", 1700000000000)
    assert decode_envelope(enc([5, 9, 1, "kv-events", e.payload])).payload == e.payload
    later = enc({"publisher_id": 5, "sequence": 9, "published_at": 1, "topic": "kv-events",
                 "payload": e.payload, "published_at_ns": 10, "trace": {"id": "x"}})
    assert decode_envelope(later).payload == e.payload  # fields of later releases ignored
    for bad, kind in [(b"\x01\x00", "frames"), (b"\x02" + frame(env)[1:], "frames"),
                      (frame(env)[:-1], "frames")]:
        with pytest.raises(WireError) as info:
            unframe(bad)
        assert info.value.kind == kind
    for bad in (b"\xc1", enc({"sequence": 1, "payload": b""}), enc([1, 2]), enc("x")):
        with pytest.raises(WireError):
            decode_envelope(bad)
    with pytest.raises(WireError):
        decode_router_events(b"\xc1")
    too_many = enc([stored(blocks=[(i, i) for i in range(1 << 16 + 1)])])
    assert decode_router_events(too_many).malformed == 1


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.text(max_size=8)
                    | st.binary(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                        st.sampled_from(["worker_id", "event", "data", "stored", "removed", "cleared",
                                         "blocks", "block_hash", "tokens_hash", "parent_hash",
                                         "block_hashes", "event_id", "dp_rank", "storage_tier", "x"]),
                        kids, max_size=5), max_leaves=30))
def test_any_payload_decodes_or_is_refused_never_raises_otherwise(obj):
    try:
        out = decode_router_events(enc(obj))
    except WireError:
        return
    for _w, batch in out.parts:
        for ev in batch.events:
            assert ev.kind in ("stored", "removed", "cleared")
            if ev.kind != "cleared":
                assert all(0 <= h < 1 << 64 for h in ev.block_hashes)


def test_tokens_hashes_are_dynamos_own():
    from dynamo._core import compute_block_hash_for_seq

    tokens = list(range(3, 3 + 4 * 5)) + [9, 9]
    want = [h - (1 << 64) if h >= 1 << 63 else h for h in compute_block_hash_for_seq(tokens, 4)]
    assert tokens_hashes(tokens, 4) == want


# -- Dynamo's own publisher over ZeroMQ ----------------------------------------------------------------
class Capture:
    """A raw SUB socket on every worker's endpoint feeding Dynamo's RadixTree (the reference)."""

    def __init__(self, endpoints) -> None:
        self.ref = Reference()
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        for ep in endpoints:
            connect_joined(self.sock, ep)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(50):
                self.ref.feed_envelope(unframe(self.sock.recv_multipart()[3]))

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close(0)


@pytest.fixture
def zmq_runtime(tmp_path):
    rt = Runtime(str(tmp_path / "discovery"), "zmq")
    yield rt
    rt.close()


def test_dynamo_publishers_over_zmq_are_mirrored_as_dynamos_radix_tree_holds(zmq_runtime):
    workers = {"w1": Worker(zmq_runtime, "ns.backend.generate", 11, seed=1),
               "w2": Worker(zmq_runtime, "ns.backend.generate", 22, seed=2, dp_rank=1)}
    workers["w2"].source.prompts = workers["w1"].source.prompts  # the same system prompts
    fleet = Fleet("dyn")
    capture = None
    try:
        wait_for(lambda: len(zmq_runtime.zmq_endpoints()) == 2, what="both publishers in discovery")
        endpoints = zmq_runtime.zmq_endpoints()
        for name, ep in zip(("a", "b"), sorted(endpoints.values())):
            fleet.add(EngineSpec(name, ep, wire="dynamo", block_size=BS))
        capture = Capture(endpoints.values())
        wait_for(lambda: all(link.connection == "connected" for link in fleet.links.values()),
                 what="the fleet's sockets connected")
        time.sleep(0.5)  # the subscriptions reach the publishers
        for _ in range(25):
            for w in workers.values():
                w.step()
        total = sum(w.sent for w in workers.values())
        wait_for(lambda: sum(capture.ref.envelopes.values()) == total,
                 what=f"the reference fed ({capture.ref.errors[:2]})")
        wait_for(lambda: sum((link.subscriber.last_seq or -1) + 1 for link in fleet.links.values()) == total,
                 what="the fleet fed")
        time.sleep(0.2)
        assert capture.ref.errors == []
        with fleet.lock:
            assert fleet.index.check() == []
            rows = {r["name"]: r for r in fleet.engines()}
            engine_of = {(r["stream"]["worker_id"], r["dp_rank"]): n for n, r in rows.items()}
            assert set(engine_of) == {(11, 0), (22, 1)}, engine_of
            nonzero = 0
            for q in queries(workers.values()):
                want = capture.ref.scores(q)
                got = fleet.match_tokens(q)
                assert {k: want.get(k, 0) for k in engine_of} == {k: got[n] for k, n in engine_of.items()}, q
                nonzero += bool(want)
            assert nonzero > 20
            held = capture.ref.blocks_per_worker()
            for key, name in engine_of.items():
                assert rows[name]["cached_blocks"] == held.get(key, 0)
                w = next(x for x in workers.values() if x.worker_id == key[0])
                assert rows[name]["cached_blocks"] == len(w.source.cached)
        for r in rows.values():
            assert r["wire"] == "dynamo" and r["keyed_by"] == "tokens_hash" and r["block_size"] == BS
            assert r["stream"]["lost_batches"] == 0 and r["stream"]["error_count"] == 0
            assert r["stream"]["tier_blocks"]["device"] > 0
        assert fleet.index.stats()["duplicated_blocks"] > 0  # two workers, one content hash
    finally:
        if capture is not None:
            capture.close()
        fleet.close()
        for w in workers.values():
            w.close()


def test_a_new_publisher_on_the_socket_is_a_restart_and_gaps_are_counted_lost(tmp_path):
    ep = f"ipc://{tmp_path}/dyn.sock"
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(ep)
    fleet = Fleet("r")
    try:
        fleet.add(EngineSpec("w", ep, wire="dynamo", block_size=BS))
        wait_for(lambda: fleet.links["w"].connection == "connected", what="connected")
        time.sleep(0.3)

        def send(pid: int, seq: int, events: list) -> None:
            env = encode_envelope(pid, seq, encode_router_events(events))
            pub.send_multipart((b"kv-events", pid.to_bytes(8, "big"), seq.to_bytes(8, "big"), frame(env)))

        send(1, 0, [stored(blocks=((1, 11), (2, 12)))])
        send(1, 1, [stored(parent=2, blocks=((3, 13),))])
        sub = fleet.links["w"].subscriber
        wait_for(lambda: sub.last_seq == 1, what="two envelopes")
        send(1, 4, [stored(parent=3, blocks=((4, 14),))])  # 2 and 3 missed
        wait_for(lambda: sub.last_seq == 4, what="the gap")
        assert sub.lost_batches == 2 and sub.gaps == 1
        with fleet.lock:
            assert fleet.index.engine_stats("w")["cached_blocks"] == 4
        send(2, 0, [stored(blocks=((9, 19),))])  # the worker's publisher started again
        wait_for(lambda: sub.restarts == 1, what="the restart")
        wait_for(lambda: fleet.index.engine_stats("w")["cached_blocks"] == 1, what="cleared, then 1 block")
        pub.send_multipart((b"kv-events", b"short", b"x"))
        pub.send_multipart((b"kv-events", (2).to_bytes(8, "big"), (1).to_bytes(8, "big"), b"\x01\x00\x00\x00\x09junk"))
        wait_for(lambda: sub.errors["frames"] == 2, what="bad frames counted")
        with fleet.lock:
            row = fleet.engines()[0]
        assert row["stream"]["publisher_id"] == 2 and row["stream"]["worker_id"] == 7
    finally:
        fleet.close()
        pub.close(0)


def test_dynamo_engines_over_rest(tmp_path):
    from support.apputil import assert_error, make_client

    with make_client() as client:
        r = client.post("/api/fleets", json={"name": "d", "engines": [
            {"name": "w", "endpoint": f"ipc://{tmp_path}/x.sock", "wire": "dynamo", "block_size": 16}]})
        assert r.status_code == 201, r.text
        row = r.json()["engines"][0]
        assert row["wire"] == "dynamo" and row["block_size"] == 16
        m = client.post("/api/fleets/d/match", json={"tokens": list(range(64))})
        assert m.status_code == 200 and m.json() == {"engines": {"w": 0}, "block_sizes": {"w": 16}}
        bad = client.post("/api/fleets", json={"name": "e", "engines": [
            {"name": "w", "endpoint": "tcp://127.0.0.1:9", "wire": "zmq"}]})
        assert_error(bad, 422, "invalid_request")
