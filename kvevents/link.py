"""MirrorLink: everything that keeps one MirrorPool in step with one engine."""

from __future__ import annotations

import threading
from collections.abc import Callable

from allocator.prefix.mirror import MirrorPool

from .engine_metrics import MetricsPoller
from .follow import follow
from .recording import Recorder


class MirrorLink:
    """The subscriber on the engine's events, the poller of its `/metrics` (optional), and a
    recorder of what was applied (optional). Installed as `pool.source`, so the pool's stats
    carry `status()`: the stream's health (lost batches, errors, restarts) and the engine's own
    KV usage and hit ratio. `close()` stops all three (it blocks up to a few seconds: call it
    off the event loop)."""

    def __init__(self, pool: MirrorPool, endpoint: str, *, topic: str = "",
                 replay_endpoint: str | None = None, metrics_url: str | None = None,
                 record: str | None = None,
                 apply: Callable[[Callable[[], None]], None] | None = None,
                 metrics_every_s: float = 2.0) -> None:
        self.pool = pool
        self.metrics_url = metrics_url
        self.recorder = Recorder(record, endpoint, topic) if record else None
        self.poller = MetricsPoller(metrics_url, metrics_every_s).start() if metrics_url else None
        self.subscriber = follow(pool, endpoint, topic=topic, replay_endpoint=replay_endpoint,
                                 apply=apply or _locked(), recorder=self.recorder)
        pool.source = self

    def status(self) -> dict:
        out = self.subscriber.status()
        if self.poller is not None:
            out["engine"] = self.poller.status()
        if self.recorder is not None:
            out["recording"] = {"path": self.recorder.path, "records": self.recorder.records}
        return out

    def describe(self) -> dict:
        out = self.subscriber.describe()
        out["metrics_url"] = self.metrics_url
        return out

    def close(self) -> None:
        self.subscriber.stop()
        if self.poller is not None:
            self.poller.stop()
        if self.recorder is not None:
            self.recorder.close()


def _locked():
    lock = threading.Lock()

    def run(change):
        with lock:
            change()
    return run
