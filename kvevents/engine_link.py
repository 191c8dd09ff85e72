"""One engine's link into a fleet: where it publishes (`EngineSpec`), its subscription, metrics
poller and connection state (`EngineLink`), and the lag figures every engine reports.

Connection state comes from a ZeroMQ socket monitor: an endpoint nobody answers shows
`unreachable` with the retry count and the next retry interval, which ZeroMQ doubles per retry
up to `RECONNECT_MAX_MS` (the fleet's own context, `_context()`, sets that backoff). The
fleet (kvevents/fleet.py), its listening endpoint (listen.py) and its NATS source
(nats_source.py) all build their engines from these.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import zmq

from allocator.errors import InvalidRequest

from .dynamo_wire import DynamoWire
from .engine_metrics import MetricsPoller
from .subscriber import Subscriber

if TYPE_CHECKING:
    from .fleet import Fleet

RECONNECT_MS = 100
RECONNECT_MAX_MS = 5000
LAGS = 2048
CLOSE_DEADLINE_S = 5.0  # how long a close waits for an engine's threads
WIRES = ("vllm", "dynamo")
_MONITOR_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED
                   | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED)


@dataclass(slots=True)
class EngineSpec:
    """Where one engine publishes. `dp_rank`: the rank this endpoint is (vLLM publishes each
    rank on port + rank); `block_size`: tokens per block as configured, checked against the
    events; `num_blocks`: the engine's KV blocks, for the page's maps."""

    name: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    metrics_url: str | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    dp_rank: int = 0
    server: str | None = None  # groups one server's DP ranks given as separate endpoints
    model: str | None = None  # the model it serves (shown; a listening fleet reads it off topics)
    # the wire it speaks: "vllm" (vLLM's and SGLang's) or "dynamo" (a Dynamo worker's event
    # plane, whose blocks are keyed by Dynamo's tokens_hash: `block_size` is its kv block size)
    wire: str = "vllm"

    def index_block_size(self) -> int | None:
        """The block size the index checks the events against: tokens_hash-keyed blocks are one
        hash each to the index, so a Dynamo engine's own block size is kept here only."""
        return None if self.wire == "dynamo" else self.block_size

    @classmethod
    def parse(cls, d: dict) -> EngineSpec:
        """From a JSON object (the REST body, a `--fleet` file). Raises InvalidRequest."""
        if not isinstance(d, dict):
            raise InvalidRequest("an engine is an object with 'name' and 'endpoint'")
        unknown = set(d) - set(cls.__slots__)
        if unknown:
            raise InvalidRequest(f"unknown engine field(s) {sorted(unknown)}; fields: {list(cls.__slots__)}")
        for key in ("name", "endpoint"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise InvalidRequest(f"engine needs '{key}' (a string)")
        if d.get("wire", "vllm") not in WIRES:
            raise InvalidRequest(f"wire {d['wire']!r} is not one of {list(WIRES)}")
        return cls(**d)


def _context() -> zmq.Context:
    ctx = zmq.Context()
    ctx.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    ctx.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    return ctx


class _MonitoredSubscriber(Subscriber):
    """A Subscriber whose SUB socket reports connects and retries to `link.on_monitor`: the
    monitor is attached before the socket connects, so it sees the first connect too (a quiet
    publisher shows `connected`, not `connecting`, until its first batch)."""

    link: EngineLink | None

    def _before_connect(self, sock) -> None:
        try:
            mon = sock.get_monitor_socket(_MONITOR_EVENTS)
        except zmq.ZMQError:
            mon = None
        if mon is not None and self.link is not None:
            self.link.monitor = mon


class _MonitoredDynamoSubscriber(DynamoWire, _MonitoredSubscriber):
    """A Dynamo worker's PUB socket, monitored as any engine's."""


class EngineLink:
    """One engine spec's subscription, metrics poller and connection state."""

    def __init__(self, fleet: Fleet, spec: EngineSpec) -> None:
        self.spec = spec
        self.fleet = fleet
        self.connection = "connecting"
        self.retries = 0
        self.disconnects = 0
        self.retry_in_ms: int | None = None
        self.connected_at: float | None = None
        self.refused_batches = 0
        # Seconds from each batch's engine timestamp to its applying here (the last LAGS).
        self.lags: deque = deque(maxlen=LAGS)
        # rank -> engine name (None: a rank the user removed, its batches refused from then on)
        self.ranks: dict[int, str | None] = {spec.dp_rank: spec.name}
        self.monitor = None
        self.poller = MetricsPoller(spec.metrics_url).start() if spec.metrics_url else None
        kind = _MonitoredDynamoSubscriber if spec.wire == "dynamo" else _MonitoredSubscriber
        self.subscriber = kind(
            spec.endpoint, topic=spec.topic, replay_endpoint=spec.replay_endpoint,
            on_batch=self._on_batch, on_restart=self._on_restart, ctx=fleet.ctx,
            recorder=fleet.recorder_for(spec.name), receiver=fleet.receiver)
        self.subscriber.link = self
        try:
            self.subscriber.start()
        except zmq.ZMQError as exc:
            if self.poller is not None:
                self.poller.stop()
            raise InvalidRequest(f"cannot connect to {spec.endpoint}: {exc}") from None

    def _on_batch(self, seq: int, batch) -> None:
        fleet = self.fleet
        if fleet is not None:
            fleet.route(self, batch)

    def _on_restart(self) -> None:
        fleet = self.fleet
        if fleet is not None:
            fleet.restarted(self)

    def engine_names(self) -> list[str]:
        return [n for n in self.ranks.values() if n is not None]

    def on_monitor(self, event: int, value: int) -> None:
        if event == zmq.EVENT_CONNECTED:
            self.connection, self.connected_at, self.retry_in_ms = "connected", time.time(), None
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self.connection, self.retry_in_ms = "unreachable", value
            self.retries += 1
        elif event == zmq.EVENT_DISCONNECTED:
            # the publisher went away, or sent a message past the cap (ZeroMQ drops the
            # connection for it, then connects again)
            self.connection = "disconnected"
            self.disconnects += 1
            self.subscriber.reconnect_soon()

    def health(self) -> dict:
        sub = self.subscriber.status()
        if self.connection == "connecting" and sub["state"] == "live":
            self.connection = "connected"  # a batch came before the monitor's connect event
        if self.connection == "connected":
            state = "live" if sub["state"] == "live" else "connected"
        else:
            state = self.connection
        out = {"state": state, "connection": self.connection, "retries": self.retries,
               "retry_in_ms": self.retry_in_ms, "disconnects": self.disconnects,
               "refused_batches": self.refused_batches, **sub}
        out["state"] = state
        last = sub.get("last_batch_at")
        out["lag_s"] = None if last is None else round(max(0.0, time.time() - last), 3)
        out.update(lag_percentiles(self.lags))
        return out

    def close(self) -> None:
        """Stop and wait (blocking)."""
        self.stop_soon()
        self.join(time.monotonic() + CLOSE_DEADLINE_S)

    def stop_soon(self) -> None:
        """Ask the subscriber and the poller to stop; both notice within about 0.1 s (a poll
        in flight is cut, a replay wait broken off)."""
        self.subscriber.stop_soon()
        if self.poller is not None:
            self.poller.stop_soon()

    def join(self, deadline: float) -> bool:
        """Wait for the link's threads until `deadline` (monotonic); True when they are gone.
        Then drops its references to the fleet, so nothing of a deleted fleet outlives it."""
        gone = self.subscriber.join(max(0.0, deadline - time.monotonic()))
        if self.poller is not None:
            gone = self.poller.join(max(0.0, deadline - time.monotonic())) and gone
        self.fleet = None
        self.subscriber.link = None
        return gone

    def alive(self) -> bool:
        return self.subscriber.alive() or (self.poller is not None and self.poller.alive())


def lag_percentiles(lags) -> dict:
    """p50 / p99 / max, in ms, of the time from a batch's engine timestamp to its applying here
    (the engine's clock: across machines this includes their clock offset)."""
    if not lags:
        return {"apply_lag_p50_ms": None, "apply_lag_p99_ms": None, "apply_lag_max_ms": None}
    a = np.fromiter(lags, dtype=np.float64, count=len(lags)) * 1000.0
    n = len(a)
    # np.percentile's linear interpolation, read off one partition (a sixth of its cost: the
    # page asks for every engine's figures each second)
    pos = [(n - 1) * q for q in (0.5, 0.99)]
    ks = sorted({int(p) for p in pos} | {min(int(p) + 1, n - 1) for p in pos} | {n - 1})
    part = np.partition(a, ks)

    def at(p: float) -> float:
        lo = int(p)
        hi = min(lo + 1, n - 1)
        return float(part[lo] + (part[hi] - part[lo]) * (p - lo))
    return {"apply_lag_p50_ms": round(at(pos[0]), 2), "apply_lag_p99_ms": round(at(pos[1]), 2),
            "apply_lag_max_ms": round(float(part[n - 1]), 2)}
