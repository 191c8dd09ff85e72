"""PoolPublisher: a pool's prefix-cache events (stored / removed / cleared) on the wire."""

from __future__ import annotations

from .codec import from_pool_event
from .publisher import Publisher

KINDS = {"stored", "removed", "cleared"}


class PoolPublisher:
    """Reads the pool's EventLog past the last seq it published and sends the prefix-cache events
    found as one vLLM batch per `flush()`. Any pool that records the contract's `stored` /
    `removed` / `cleared` events works (a prefix-caching pool, or a mirror re-published).

    If the event ring dropped events before a flush read them (more than its capacity between
    two flushes) `overruns` counts it; a router following this publisher would then see a set
    that differs from the pool's, so flush often (the server does every stream tick).
    """

    def __init__(self, pool, endpoint: str, *, topic: str = "", replay_endpoint: str | None = None,
                 **kw) -> None:
        self.pool = pool
        self.publisher = Publisher(endpoint, topic=topic, replay_endpoint=replay_endpoint, **kw)
        self.seen = pool.events.last_seq
        self.overruns = 0

    def flush(self) -> int:
        """Publish what is new; returns the number of events sent."""
        log = self.pool.events
        if log.last_seq == self.seen:
            return 0
        events = []
        seen = self.seen
        while seen < log.last_seq:
            rows = log.after(seen, 10_000)
            if not rows:
                break
            if rows[0]["seq"] > seen + 1:
                self.overruns += 1
            for row in rows:
                if row["type"] in KINDS:
                    ev = from_pool_event(row)
                    if ev is not None:
                        events.append(ev)
            seen = rows[-1]["seq"]
        self.seen = log.last_seq
        if events:
            self.publisher.publish(events)
        return len(events)

    def status(self) -> dict:
        return {**self.publisher.status(), "overruns": self.overruns}

    def close(self) -> None:
        self.publisher.close()
