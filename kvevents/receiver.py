"""Receiver: one thread reading many subscribers' SUB sockets.

A fleet of hundreds of engines given as endpoints has a SUB socket per endpoint. A thread per
socket makes every batch two GIL hand-overs between hundreds of threads (costing more than the
batch's own work: `python -m bench fleet`); one thread polling all the sockets reads each ready
socket until it is empty (at most DRAIN messages a turn, so one busy engine cannot starve the
others) and hands every message to its subscriber, in the order the socket holds them.

A gap a subscriber fills from its engine's replay socket must not hold up the other engines
while it waits for the reply: the subscriber's socket leaves the poller, one short-lived thread
asks for the replay, applies what comes back and the messages queued on the socket meanwhile,
and hands the socket back (ZeroMQ keeps what arrives in between, up to its receive
high-water mark; anything past that is a gap the next replay covers).

Subscribers register (`add`), ask to stop or reconnect, and hand sockets back through a queue
the thread reads between polls, so the thread is the only one touching a socket it polls.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import TYPE_CHECKING

import zmq

if TYPE_CHECKING:
    from .subscriber import Subscriber

DRAIN = 64  # messages read from one socket before the next socket's turn
POLL_MS = 100  # how often the thread looks at its queue when no message comes
# After a turn that read messages the thread waits this long before polling again, so the
# messages that trickle in meanwhile are read in one turn, not one poll (and one GIL hand-over)
# each, for at most this much more lag.
COALESCE_S = 0.002


class Receiver:
    """One daemon thread polling the SUB sockets of the subscribers `add`ed to it."""

    def __init__(self, name: str = "kvevents-recv") -> None:
        self.name = name
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # starting the thread; handing it work once it has ended
        self._done = False  # the thread has ended: what is handed over now is done by the caller
        self.turns = 0  # polls that found a socket ready
        self.messages = 0

    # -- called from any thread -------------------------------------------------------------------
    def add(self, sub: Subscriber) -> None:
        """Start reading `sub`'s SUB socket (already connected)."""
        self._start()
        self.later("add", sub)

    def later(self, op: str, sub: Subscriber) -> None:
        """`op` ("add", "stop", "reconnect", "resume") for `sub`, done by the thread between
        polls. Once the thread has ended, a socket handed to it ("add", "resume": the caller
        owns it) is closed at once."""
        with self._lock:
            if not self._done:
                self._ops.put((op, sub))
                return
        if op in ("add", "resume"):
            sub._closed_by_receiver(sub._sub)

    def stop_soon(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._done:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        subs: dict = {}  # socket -> Subscriber, the sockets polled now
        owned: dict = {}  # socket -> Subscriber, every socket not yet closed (polled or replaying)
        try:
            while not self._stop.is_set():
                self._do_ops(poller, subs, owned)
                if not subs:
                    self._stop.wait(POLL_MS / 1000)
                    continue
                try:
                    ready = poller.poll(POLL_MS)
                except zmq.ZMQError:
                    time.sleep(0.01)
                    continue
                if not ready:
                    continue
                self.turns += 1
                for sock, _ in ready:
                    sub = subs.get(sock)
                    if sub is not None:
                        self._read(sock, sub, poller, subs)
                self._stop.wait(COALESCE_S)
        finally:
            with self._lock:
                self._done = True
            self._do_ops(poller, subs, owned)  # what was handed over before the end
            for sock, sub in owned.items():
                if not sub._replaying:  # a replay's thread closes its socket as it hands it back
                    sub._closed_by_receiver(sock)

    def _read(self, sock, sub: Subscriber, poller, subs: dict) -> None:
        for _ in range(DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                sub._error("internal", f"socket: {exc}")
                return
            self.messages += 1
            try:
                sub.handle(frames)
            except Exception as exc:  # never die: count it, keep reading
                sub._error("internal", f"{type(exc).__name__}: {exc}")
            if sub._deferred is not None:  # a gap to fill from the replay socket: off this thread
                poller.unregister(sock)
                del subs[sock]
                threading.Thread(target=sub._fill_gap_then_resume, daemon=True,
                                 name="kvevents-replay").start()
                return

    def _do_ops(self, poller, subs: dict, owned: dict) -> None:
        while True:
            try:
                op, sub = self._ops.get_nowait()
            except queue.Empty:
                return
            sock = sub._sub
            if op == "add" or op == "resume":
                if sub._stop.is_set():
                    if sock in owned:
                        del owned[sock]
                        subs.pop(sock, None)
                        with contextlib.suppress(KeyError):
                            poller.unregister(sock)
                    sub._closed_by_receiver(sock)
                    continue
                owned[sock] = sub
                if sock not in subs:
                    poller.register(sock, zmq.POLLIN)
                    subs[sock] = sub
            elif op == "stop":
                if sock in subs:
                    poller.unregister(sock)
                    del subs[sock]
                if sock in owned and not sub._replaying:
                    del owned[sock]
                    sub._closed_by_receiver(sock)
                # a replaying subscriber hands its socket back ("resume") and is closed then
            elif op == "reconnect" and sock in subs:
                with contextlib.suppress(zmq.ZMQError):
                    sock.disconnect(sub.endpoint)
                with contextlib.suppress(zmq.ZMQError):
                    sock.connect(sub.endpoint)
