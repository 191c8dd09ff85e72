"""Publisher: kvscope's KV events on the wire exactly as vLLM's ZmqEventPublisher sends them."""

from __future__ import annotations

import threading
import time
from collections import deque

import zmq

from .codec import encode_batch, seq_bytes

END_SEQ = seq_bytes(-1)


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard and ipc/inproc endpoints, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class Publisher:
    """A PUB socket sending `[topic, seq (8-byte big-endian), payload]` and a ROUTER replay socket
    answering an 8-byte start seq with every buffered batch from there, then `seq -1`.

    `publish(events)` encodes and sends at once (under a lock, so any thread may call it) and
    returns the batch's seq; seqs count from 0 per Publisher, as a freshly started engine's do.
    The replay socket is served by a daemon thread that owns it; `buffer_steps` batches are kept.
    Replies carry the topic (vLLM >= 0.26 framing): `[id, "", topic, seq, payload]`.

    Invariant: the buffer holds consecutive seqs ending at the last one published.
    """

    def __init__(self, endpoint: str, *, replay_endpoint: str | None = None, topic: str = "",
                 buffer_steps: int = 10_000, hwm: int = 100_000, bind: bool | None = None,
                 ctx: zmq.Context | None = None) -> None:
        self._ctx = ctx or zmq.Context.instance()
        self.topic = topic
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        if is_bind_endpoint(endpoint) if bind is None else bind:
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._pub.connect(endpoint)
            self.endpoint = endpoint
        self.replay_endpoint = None
        self._replay = None
        self._running = True
        self._thread = None
        self.published_batches = 0
        self.published_events = 0
        self.replays_served = 0
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True,
                                            name="kvevents-replay")
            self._thread.start()

    def publish(self, events, ts: float | None = None, dp_rank: int | None = 0) -> int:
        """Send one batch of normalised events; returns its seq."""
        payload = encode_batch(events, time.time() if ts is None else ts, dp_rank)
        return self.publish_encoded(payload, len(events))

    def publish_encoded(self, payload: bytes, events: int = 0) -> int:
        """Send one batch already encoded (`codec.encode_batch`) of `events` events; returns
        its seq."""
        with self._lock:
            if not self._running:
                raise RuntimeError("publisher is closed")
            seq = self._seq
            self._seq += 1
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
            self._buffer.append((seq, payload))
            self.published_batches += 1
            self.published_events += events
        return seq

    @property
    def next_seq(self) -> int:
        return self._seq

    def _serve_replay(self) -> None:
        sock = self._replay
        while self._running:
            try:
                if not sock.poll(100):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    continue
                client, _, start = frames
                if len(start) != 8:
                    continue
                first = int.from_bytes(start, "big")
                with self._lock:
                    rows = [r for r in self._buffer if r[0] >= first]
                for seq, payload in rows:
                    sock.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
                sock.send_multipart((client, b"", b"", END_SEQ, b""))
                self.replays_served += 1
            except zmq.ZMQError:
                if not self._running:
                    return
                time.sleep(0.05)

    def status(self) -> dict:
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "topic": self.topic, "next_seq": self._seq, "batches": self.published_batches,
                "events": self.published_events, "replays_served": self.replays_served}

    def close(self, linger_ms: int = 500) -> None:
        """Stop; batches still queued for connected subscribers get `linger_ms` to leave."""
        with self._lock:
            self._running = False
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._pub.close(linger=linger_ms)
        if self._replay is not None:
            self._replay.close(linger=0)
