"""Waiting out ZeroMQ's slow joiner on a condition instead of a fixed sleep."""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message


def connect_joined(sock: zmq.Socket, endpoint: str, timeout: float = 30.0) -> None:
    """Connect `sock` (a SUB with its subscription set, or a DEALER) to `endpoint` and return once
    the handshake with the bound peer finished, plus a short grace for a PUB to register the
    subscription the SUB sends right after it."""
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)  # before connect: no event missed
    try:
        sock.connect(endpoint)
        if not mon.poll(int(timeout * 1000)):
            raise AssertionError(f"no ZeroMQ handshake with {endpoint} within {timeout:g} s")
        recv_monitor_message(mon)
    finally:
        sock.disable_monitor()
        mon.close(0)
    time.sleep(0.2)
