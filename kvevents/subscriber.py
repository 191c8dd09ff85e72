"""Subscriber: follows an engine's KV-event stream, fills gaps from its replay socket, survives
restarts and bad input."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from .codec import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    Batch,
    WireError,
    decode_batch,
    seq_bytes,
    seq_of,
)

if TYPE_CHECKING:
    from .receiver import Receiver

ERROR_KINDS = ("malformed", "frames", "too_large", "unknown_type", "malformed_event", "apply",
               "replay", "seq_jump", "internal")
# A forward jump of more seqs than any replay buffer holds (vLLM keeps 10,000 batches by
# default; 2^32 would be hundreds of GB) is no loss: the engine's numbering moved (a restart
# on another counter) or the seq frame is garbage.
MAX_SEQ_GAP = 1 << 32
REPLAY_DRAIN = 4096  # messages a replay's thread reads after the replay, before handing back


class Subscriber:
    """A SUB socket on `endpoint` (prefix `topic`), run by a daemon thread, that hands every batch
    to `on_batch(seq, batch)` exactly once and in seq order.

    - Gaps: when a seq skips ahead it asks the replay socket (DEALER; a REQ socket would refuse a
      second reply) for everything from the first missing seq, applies what comes back, and counts
      what the engine no longer buffered as `lost_batches`. Reply frames with a topic (vLLM >=
      0.26) and without (older) are both read. Without a replay endpoint a gap is counted lost.
    - Joining late: when the first seq seen is above 0, the missed history is asked for too.
    - Restart: a live seq at or below the last live one means the engine started over; the
      subscriber calls `on_restart()` (its cache is empty now) and follows the new sequence.
    - Jump: a live seq more than `max_gap` past the last one is held, not counted lost. When the
      next message continues it (seq + 1), the engine's numbering moved: a restart, and both
      are applied. Otherwise it was garbage: dropped and counted in `errors["seq_jump"]`.
    - Bad input (wrong frame count, undecodable payload, huge batch, unknown or malformed events,
      an exception from the callbacks) is counted by kind in `errors`, the latest message kept
      in `last_error`; the thread never dies of it.

    `recorder`, when set, gets `write(recv_ts, seq, topic, payload)` for every batch applied, in
    the order applied. `receiver`, when set (a `receiver.Receiver`), reads the SUB socket in its
    thread, shared with other subscribers, instead of one of this subscriber's own; a replay then
    runs in a short-lived thread of its own, so it holds up no other engine.
    """

    def __init__(self, endpoint: str, *, on_batch: Callable[[int, Batch], None],
                 on_restart: Callable[[], None] | None = None, topic: str = "",
                 replay_endpoint: str | None = None, replay_timeout: float = 2.0,
                 max_events: int = MAX_BATCH_EVENTS, recorder=None,
                 ctx: zmq.Context | None = None, max_gap: int = MAX_SEQ_GAP,
                 receiver: Receiver | None = None) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay_timeout = replay_timeout
        self.max_events = max_events
        self.max_gap = max_gap
        self._held: tuple[int, bytes] | None = None  # a jump's (seq, payload) until the next message
        self.recorder = recorder
        self._on_batch = on_batch
        self._on_restart = on_restart
        self._ctx = ctx or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dealer = None
        self._reconnect = False
        self._receiver = receiver
        self._deferred: tuple[int, bytes, int] | None = None  # a gap the receiver hands off
        self._replaying = False  # the socket is out of the receiver's poller, filling a gap
        self._closed = threading.Event()  # the receiver closed the socket
        self.state = "new"
        self.last_seq: int | None = None  # last seq applied
        self.last_live: int | None = None  # last seq seen on the SUB socket
        self.batches = 0
        self.events = 0
        self.gaps = 0
        self.lost_batches = 0
        self.replays = 0
        self.replayed_batches = 0
        self.restarts = 0
        self.duplicates = 0
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_batch_at: float | None = None
        self.started_at: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Subscriber:
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        # ZeroMQ drops a bigger message (and that connection, which it then retries) before
        # buffering it: a publisher cannot make this process hold more than the cap for it.
        self._sub.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES + 64)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        try:
            self._before_connect(self._sub)
            self._sub.connect(self.endpoint)
        except BaseException:
            self._sub.close(linger=0)
            raise
        self.state = "connecting"
        self.started_at = time.time()
        if self._receiver is not None:
            self._receiver.add(self)
            return self
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvevents-sub")
        self._thread.start()
        return self

    def _before_connect(self, sock) -> None:
        """Called with the SUB socket before it connects (a socket monitor attaches here, so it
        sees the first connect)."""

    def stop(self, timeout: float = 3.0) -> None:
        self.stop_soon()
        self.join(timeout)

    def stop_soon(self) -> None:
        """Ask the thread to stop; it notices within 0.1 s, also while waiting on a replay."""
        self._stop.set()
        self.state = "stopped"
        if self._receiver is not None:
            self._receiver.later("stop", self)

    def reconnect_soon(self) -> None:
        """Connect again (from the thread that owns the socket, within 0.1 s): ZeroMQ does not
        after it dropped a connection for a message past ZMQ_MAXMSGSIZE."""
        if self._receiver is not None:
            self._receiver.later("reconnect", self)
        else:
            self._reconnect = True

    def alive(self) -> bool:
        if self._receiver is not None:
            return self.started_at is not None and not self._closed.is_set()
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (after `stop_soon`); True when it is gone (with a receiver: when
        it closed the socket)."""
        if self._receiver is not None:
            return self.started_at is None or self._closed.wait(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        sub = self._sub
        try:
            while not self._stop.is_set():
                try:
                    if self._reconnect:
                        self._reconnect = False
                        with contextlib.suppress(zmq.ZMQError):
                            sub.disconnect(self.endpoint)
                        sub.connect(self.endpoint)
                    if not sub.poll(100):
                        continue
                    frames = sub.recv_multipart()
                    self.handle(frames)
                except zmq.ZMQError as exc:
                    self._error("internal", f"socket: {exc}")
                    time.sleep(0.1)
                except Exception as exc:  # never die: count it, keep following the engine
                    self._error("internal", f"{type(exc).__name__}: {exc}")
        finally:
            sub.close(linger=0)
            if self._dealer is not None:
                self._dealer.close(linger=0)

    # -- one live message ---------------------------------------------------------------------------
    def handle(self, frames: list[bytes]) -> None:
        """Process one SUB message `[topic, seq, payload]`."""
        if len(frames) != 3:
            self._error("frames", f"message of {len(frames)} frames, expected 3 (topic, seq, payload)")
            return
        _topic, seq_frame, payload = frames
        try:
            seq = seq_of(seq_frame)
        except WireError as exc:
            self._error(exc.kind, str(exc))
            return
        if seq < 0:
            self._error("frames", f"live message with seq {seq}")
            return
        self.sequenced(seq, payload)

    def sequenced(self, seq: int, payload: bytes) -> None:
        """One live message's seq (>= 0) and payload: applied in order, gaps replayed or
        counted, restarts and jumps followed (see the class docstring)."""
        self.state = "live"
        held, self._held = self._held, None
        if seq - (-1 if self.last_live is None else self.last_live) > self.max_gap:
            if held is None or seq != held[0] + 1:
                if held is not None:
                    self._error("seq_jump", f"seq {held[0]} jumped past {self.last_live}; dropped")
                self._held = (seq, payload)
                return
            self._jumped(*held)  # continued: the engine's numbering moved
        elif held is not None:
            self._error("seq_jump", f"seq {held[0]} jumped past {self.last_live}; dropped")
        if self.last_live is not None and seq <= self.last_live:
            self.restarts += 1
            self.last_seq = None
            if self._on_restart is not None:
                self._call(self._on_restart)
        self.last_live = seq
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq < expected:
            self.duplicates += 1  # already applied from a replay
            return
        if seq > expected:
            if self._receiver is not None and self.replay_endpoint is not None and not self._replaying:
                self._deferred = (seq, payload, expected)  # the receiver hands it to a thread
                return
            self._gap(seq, payload, expected)
            return
        self._apply(seq, payload)

    def _gap(self, seq: int, payload: bytes, expected: int) -> None:
        """A live message past the next one expected: the missing ones replayed (or counted
        lost), then the message."""
        self.gaps += 1
        self._replay_from(expected)
        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq < expected:
            self.duplicates += 1
            return
        if seq > expected:
            self.lost_batches += seq - expected
        self._apply(seq, payload)

    # -- with a receiver ------------------------------------------------------------------------------
    def _fill_gap_then_resume(self) -> None:
        """(A thread of its own) the gap the receiver handed off, then what queued on the socket
        meanwhile (a gap among those is filled here too), then the socket back to the receiver."""
        self._replaying = True
        deferred, self._deferred = self._deferred, None
        try:
            if deferred is not None:
                self._gap(*deferred)
            for _ in range(REPLAY_DRAIN):
                if self._stop.is_set():
                    break
                try:
                    frames = self._sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames)
        except Exception as exc:  # never die: count it, hand the socket back
            self._error("internal", f"{type(exc).__name__}: {exc}")
        finally:
            self._replaying = False
            self._receiver.later("resume", self)

    def _closed_by_receiver(self, sock) -> None:
        """The receiver is done with this subscriber's socket (stopped, or the receiver ends)."""
        sock.close(linger=0)
        self._drop_dealer()
        self._closed.set()

    def _jumped(self, seq: int, payload: bytes) -> None:
        """Follow a sequence that starts at `seq`, far past the last one: a restart (when there
        was one) with nothing to replay in between."""
        if self.last_live is not None:
            self.restarts += 1
            if self._on_restart is not None:
                self._call(self._on_restart)
        self.last_live = seq
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        if self.recorder is not None:
            self._record(seq, payload)
        try:
            batches = self.decode(payload)
        except WireError as exc:
            self._error(exc.kind, f"batch {seq}: {exc}")
            return
        self.batches += 1
        self.last_batch_at = time.time()
        for batch in batches:
            if batch.unknown:
                self.errors["unknown_type"] += batch.unknown
            if batch.malformed:
                self.errors["malformed_event"] += batch.malformed
            if batch.problems:
                self.last_error = f"batch {seq}: {batch.problems[0]}"
                self.last_error_at = time.time()
            self.events += len(batch.events)
            self._call(self._on_batch, seq, batch)

    def decode(self, payload: bytes) -> list[Batch]:
        """A payload as the batches it holds (vLLM's: one). Raises WireError."""
        return [decode_batch(payload, self.max_events)]

    def _record(self, seq: int, payload: bytes) -> None:
        try:
            self.recorder.write(time.time(), seq, self.topic.encode(), payload)
        except (OSError, ValueError) as exc:
            self._error("internal", f"recording: {exc}")

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._error("apply", f"{type(exc).__name__}: {exc}")

    # -- replay ---------------------------------------------------------------------------------------
    def _replay_from(self, start: int) -> None:
        """Ask the replay socket for every batch from `start`; apply those not yet applied."""
        if self.replay_endpoint is None:
            return
        self.replays += 1
        for frames in self._replay_frames(start):
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) == 3:  # [topic, seq, payload] (vLLM >= 0.26, SGLang)
                seq_frame, payload = frames[1], frames[2]
            elif len(frames) == 2:  # [seq, payload] (vLLM < 0.26)
                seq_frame, payload = frames
            else:
                self._error("frames", f"replay reply of {len(frames)} frames")
                continue
            try:
                seq = seq_of(seq_frame)
            except WireError as exc:
                self._error(exc.kind, f"replay: {exc}")
                continue
            if seq == -1:
                return
            nxt = 0 if self.last_seq is None else self.last_seq + 1
            if seq < nxt:
                continue
            if seq - nxt > self.max_gap:  # garbage, not a replay of what was asked
                self._error("replay", f"replay from {start} answered seq {seq}")
                self._drop_dealer()  # the rest of this reply must not answer the next ask
                return
            if seq > nxt:
                self.lost_batches += seq - nxt
            self.replayed_batches += 1
            self._apply(seq, payload)

    def _replay_frames(self, start: int):
        """The replay socket's reply frames to a request from `start`, as they come, until the
        end marker (the caller stops there) or `replay_timeout` without one (an error)."""
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES + 64)  # as the SUB socket
            self._dealer.connect(self.replay_endpoint)
        dealer = self._dealer
        try:
            dealer.send_multipart((b"", seq_bytes(start)), flags=zmq.NOBLOCK)
        except zmq.Again:
            self._error("replay", f"replay from {start}: replay socket not reachable")
            return
        deadline = time.monotonic() + self.replay_timeout
        while True:
            left = deadline - time.monotonic()
            if self._stop.is_set():
                self._drop_dealer()
                return
            if left <= 0:
                self._error("replay", f"replay from {start}: no end marker within "
                                      f"{self.replay_timeout}s")
                self._drop_dealer()  # a late answer must not be read as the reply to the next request
                return
            if dealer.poll(int(min(left, 0.1) * 1000) + 1):
                yield dealer.recv_multipart()

    def _drop_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    # -- reporting ------------------------------------------------------------------------------------
    def _error(self, kind: str, message: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = message[:300]
        self.last_error_at = time.time()

    def status(self) -> dict:
        return {
            "state": self.state, "last_seq": self.last_seq, "batches": self.batches,
            "events": self.events, "gaps": self.gaps, "lost_batches": self.lost_batches,
            "replays": self.replays, "replayed_batches": self.replayed_batches,
            "restarts": self.restarts, "duplicates": self.duplicates,
            "errors": dict(self.errors), "error_count": sum(self.errors.values()),
            "last_error": self.last_error, "last_error_at": self.last_error_at,
            "last_batch_at": self.last_batch_at,
        }

    def describe(self) -> dict:
        return {"endpoint": self.endpoint, "topic": self.topic,
                "replay_endpoint": self.replay_endpoint}
