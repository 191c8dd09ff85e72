"""A subscriber fed garbage counts it, shows it, and keeps mirroring; old replay framing works."""

from __future__ import annotations

import threading
import time

import msgspec
import zmq
from test_real_publishers import wait_for

from allocator.prefix.mirror import MirrorPool
from kvevents.codec import Removed, Stored, encode_batch, seq_bytes
from kvevents.follow import follow


def raw_pub(endpoint):
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.bind(endpoint)
    return sock


def test_garbage_is_counted_and_survived(ipc):
    pub = raw_pub(ipc("pub"))
    pool = MirrorPool(16, name="m", device="cpu")
    sub = follow(pool, ipc("pub"), max_events=50)
    try:
        def good(seq, events):
            pub.send_multipart([b"", seq_bytes(seq), encode_batch(events, time.time())])
        # Slow joiner: send seq 0 until it is seen (no replay socket, so repeats are harmless).
        end = time.monotonic() + 30
        while sub.last_seq is None and time.monotonic() < end:
            good(0, [Stored([1, 2], None, [0] * 4, 2, "GPU")])
            time.sleep(0.05)
        assert sub.last_seq == 0
        enc = msgspec.msgpack.encode
        pub.send_multipart([b"", seq_bytes(1)])                                   # 2 frames
        pub.send_multipart([b"", b"abc", b"x"])                                   # bad seq frame
        pub.send_multipart([b"", seq_bytes(1), b"\xc1\xc1"])                      # not msgpack
        pub.send_multipart([b"", seq_bytes(2), enc([1.0, [{"type": "X"}], 0])])   # unknown type
        pub.send_multipart([b"", seq_bytes(3), enc([1.0, [["BlockRemoved", [1]]] * 51, 0])])  # huge
        good(4, [Stored([3], 2, [0, 0], 2, "GPU"), Removed([1], "GPU")])
        wait_for(lambda: sub.last_seq == 4, what="the good batch after the garbage")
        st = pool.stats()["mirror"]["source"]
        e = st["errors"]
        assert (e["frames"], e["malformed"], e["unknown_type"], e["too_large"]) == (2, 1, 1, 1), st
        assert st["error_count"] == 5 and st["last_error"] and st["state"] == "live"
        assert st["lost_batches"] == 0
        assert pool.cached_hashes() == {2, 3} and pool.check() == []
        assert sub._thread.is_alive()
    finally:
        sub.stop()
        pub.close(0)


def test_replay_without_topic_frame(ipc):
    """vLLM < 0.26 replied [id, "", seq, payload]: a hand-built ROUTER answers that way."""
    pub = raw_pub(ipc("pub"))
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(ipc("replay"))
    batches = {s: encode_batch([Stored([100 + s], 99 + s if s else None, [s], 1, "GPU")], 1.0)
               for s in range(6)}
    stop = threading.Event()
    asked = []

    def serve():
        while not stop.is_set():
            if router.poll(50):
                client, _, start = router.recv_multipart()
                first = int.from_bytes(start, "big")
                asked.append(first)
                for s in range(first, 5):
                    router.send_multipart([client, b"", seq_bytes(s), batches[s]])
                router.send_multipart([client, b"", seq_bytes(-1), b""])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    pool = MirrorPool(16, name="m", device="cpu")
    sub = follow(pool, ipc("pub"), replay_endpoint=ipc("replay"), replay_timeout=30)
    try:
        time.sleep(0.3)
        end = time.monotonic() + 30
        while sub.last_seq != 5 and time.monotonic() < end:
            pub.send_multipart([b"", seq_bytes(5), batches[5]])  # joins at 5: 0..4 come by replay
            time.sleep(0.1)
        assert asked[0] == 0
        assert pool.cached_hashes() == {100, 101, 102, 103, 104, 105}
        st = sub.status()
        assert st["replayed_batches"] == 5 and st["lost_batches"] == 0 and st["error_count"] == 0
    finally:
        stop.set()
        sub.stop()
        t.join()
        router.close(0)
        pub.close(0)


def test_replay_socket_that_never_answers_is_an_error_not_a_hang(ipc):
    pub = raw_pub(ipc("pub"))
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(ipc("replay"))  # bound, never answers
    pool = MirrorPool(16, name="m", device="cpu")
    sub = follow(pool, ipc("pub"), replay_endpoint=ipc("replay"), replay_timeout=0.3)
    try:
        time.sleep(0.3)
        end = time.monotonic() + 30
        seq = 3
        while sub.last_seq is None and time.monotonic() < end:
            pub.send_multipart([b"", seq_bytes(seq), encode_batch([Stored([seq], None, [1], 1)], 1.0)])
            seq += 1
            time.sleep(0.1)
        wait_for(lambda: sub.last_seq == seq - 1, what="the last batch")
        st = sub.status()
        first = st["last_seq"] - st["batches"] + 1  # the first seq that got through
        assert first >= 3 and st["errors"]["replay"] == 1 and st["lost_batches"] == first, st
        assert pool.cached_hashes() == set(range(first, seq))
    finally:
        sub.stop()
        router.close(0)
        pub.close(0)
