"""One receiver thread reading many subscribers' sockets: every batch applied once and in order
per engine, a gap filled from the engine's replay socket without holding up the other engines,
stops and closes that leave no socket or thread behind. Real ZeroMQ sockets throughout."""

from __future__ import annotations

import threading

import zmq
from test_real_publishers import wait_for

from kvevents.codec import Stored, encode_batch, seq_bytes
from kvevents.publisher import Publisher
from kvevents.receiver import Receiver
from kvevents.subscriber import Subscriber


def follow_all(receiver, endpoints, replays=None, **kw):
    applied = {i: [] for i in range(len(endpoints))}
    subs = []
    for i, ep in enumerate(endpoints):
        sub = Subscriber(ep, topic="kv", replay_endpoint=None if replays is None else replays[i],
                         on_batch=lambda seq, b, i=i: applied[i].append(seq), receiver=receiver, **kw)
        subs.append(sub.start())
    return subs, applied


def stop_all(subs, receiver) -> None:
    """Stop every subscriber and the receiver; each socket closed and the thread gone."""
    for s in subs:
        s.stop_soon()
    receiver.stop_soon()
    assert all(s.join(5) for s in subs) and receiver.join(5)


def connected(pubs, subs):
    """Publish empty batches until every subscriber has one (SUB joins late); returns the seq
    each publisher is at."""
    def all_in():
        for p in pubs:
            p.publish([])
        return all(s.last_seq is not None for s in subs)
    wait_for(all_in, what="every subscriber connected")


def test_many_engines_on_one_receiver_get_every_batch_in_order_with_no_thread_each(ipc):
    n = 24
    pubs = [Publisher(ipc(f"p{i}"), bind=True, topic="kv", replay_endpoint=ipc(f"r{i}"),
                      buffer_steps=10_000) for i in range(n)]
    receiver = Receiver("test-recv")
    before = threading.active_count()
    subs, applied = follow_all(receiver, [p.endpoint for p in pubs], [ipc(f"r{i}") for i in range(n)])
    try:
        assert threading.active_count() == before + 1  # the receiver's thread, none per engine
        connected(pubs, subs)
        for k in range(50):
            for i, p in enumerate(pubs):
                p.publish([Stored([i * 1000 + k], None, [1], 1)])
        ends = [p.next_seq - 1 for p in pubs]
        wait_for(lambda: all(s.last_seq == e for s, e in zip(subs, ends)), what="every batch")
        for i, s in enumerate(subs):
            seqs = applied[i]
            assert seqs == list(range(seqs[0], ends[i] + 1)), f"engine {i} out of order or missing"
            assert s.lost_batches == 0 and sum(s.errors.values()) == 0, s.status()
        assert receiver.messages >= 50 * n
    finally:
        stop_all(subs, receiver)
        for p in pubs:
            p.close()
    assert not any(s.alive() for s in subs) and not receiver.alive()


def skip(pub: Publisher, events) -> None:
    """A batch the engine buffers for replay but the subscriber never gets live (dropped)."""
    with pub._lock:
        pub._buffer.append((pub._seq, encode_batch(events, 1.0)))
        pub._seq += 1


def test_a_gap_is_replayed_from_the_engines_replay_socket(ipc):
    pubs = [Publisher(ipc(f"p{i}"), bind=True, topic="kv", replay_endpoint=ipc(f"r{i}"),
                      buffer_steps=100) for i in range(2)]
    receiver = Receiver("test-recv")
    subs, applied = follow_all(receiver, [p.endpoint for p in pubs], [ipc(f"r{i}") for i in range(2)])
    try:
        connected(pubs, subs)
        wait_for(lambda: subs[0].last_seq == pubs[0].next_seq - 1, what="the empty batches")
        s0 = subs[0].status()  # joining late may already have been a gap, replayed
        skip(pubs[0], [Stored([1], None, [1], 1)])
        skip(pubs[0], [Stored([2], None, [1], 1)])
        pubs[0].publish([Stored([3], None, [1], 1)])
        pubs[1].publish([Stored([4], None, [1], 1)])
        end = pubs[0].next_seq - 1
        wait_for(lambda: subs[0].last_seq == end, what="the gap replayed")
        s = {k: v - s0[k] for k, v in subs[0].status().items()
             if k in ("gaps", "replays", "lost_batches", "replayed_batches", "duplicates")}
        # the two dropped batches come back from the replay (and the live one with them when the
        # engine had buffered it by the time the replay was asked: then its live copy is a duplicate)
        assert s["gaps"] == 1 and s["replays"] == 1 and s["lost_batches"] == 0, s
        assert s["replayed_batches"] == 2 + (s["duplicates"] == 1), s
        assert applied[0] == list(range(applied[0][0], end + 1))  # each once, in order
        wait_for(lambda: subs[1].last_seq == pubs[1].next_seq - 1, what="the other engine's batch")
        # the socket is back in the receiver's poller: a live batch after the replay arrives
        pubs[0].publish([Stored([5], None, [1], 1)])
        wait_for(lambda: subs[0].last_seq == end + 1, what="a live batch after the replay")
    finally:
        stop_all(subs, receiver)
        for p in pubs:
            p.close()


def test_a_replay_that_never_answers_holds_up_no_other_engine_and_a_stop_breaks_it_off(ipc):
    ctx = zmq.Context.instance()
    slow_pub = ctx.socket(zmq.PUB)
    slow_pub.bind(ipc("slow"))
    router = ctx.socket(zmq.ROUTER)
    router.bind(ipc("slow-replay"))  # bound, never answers
    fast = Publisher(ipc("fast"), bind=True, topic="kv")
    receiver = Receiver("test-recv")
    subs, applied = follow_all(receiver, [ipc("slow"), fast.endpoint], [ipc("slow-replay"), None],
                               replay_timeout=600)
    slow, quick = subs
    try:
        def slow_in():  # seq 5 first: a gap from 0, so the slow engine asks its replay socket
            slow_pub.send_multipart([b"kv", seq_bytes(5), encode_batch([], 1.0)])
            return slow._replaying
        wait_for(slow_in, what="the slow engine waiting on its replay")
        connected([fast], [quick])
        for k in range(20):
            fast.publish([Stored([k], None, [1], 1)])
        end = fast.next_seq - 1
        wait_for(lambda: quick.last_seq == end, what="the other engine's batches during the replay")
        assert slow._replaying and slow.last_seq is None  # still waiting: nothing timed out
        slow.stop_soon()  # breaks the replay wait off within 0.1 s; the socket is closed
        assert slow.join(10) and not slow.alive()
        assert quick.alive()
        fast.publish([Stored([99], None, [1], 1)])
        wait_for(lambda: quick.last_seq == end + 1, what="the other engine after the stop")
    finally:
        stop_all(subs, receiver)
        fast.close()
        router.close(0)
        slow_pub.close(0)


def test_a_subscriber_added_after_the_receiver_ended_is_closed_not_leaked(ipc):
    receiver = Receiver("test-recv")
    pub = Publisher(ipc("p"), bind=True, topic="kv")
    try:
        first, _ = follow_all(receiver, [pub.endpoint])
        receiver.stop_soon()
        assert receiver.join(5)
        assert first[0].join(5) and not first[0].alive()  # closed as the receiver ended
        late, _ = follow_all(receiver, [pub.endpoint])
        assert late[0].join(5) and not late[0].alive()
    finally:
        pub.close()
