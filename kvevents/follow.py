"""Follow an engine: a Subscriber feeding a MirrorPool."""

from __future__ import annotations

import threading
from collections.abc import Callable

from allocator.prefix.mirror import MirrorPool

from .codec import Cleared
from .subscriber import Subscriber


def threaded_apply(lock: threading.Lock) -> Callable[[Callable[[], None]], None]:
    """Run each change at once in the subscriber's thread, under `lock`."""
    def run(change: Callable[[], None]) -> None:
        with lock:
            change()
    return run


def follow(pool: MirrorPool, endpoint: str, *, topic: str = "", replay_endpoint: str | None = None,
           apply: Callable[[Callable[[], None]], None] | None = None, recorder=None,
           start: bool = True, **kw) -> Subscriber:
    """Subscribe to `endpoint` and mirror it into `pool`. Each change to the pool is a callable
    handed to `apply` (default: run at once under a lock private to this pool) so a server can
    run it on its event loop under the pool's lock instead. The subscriber becomes `pool.source`
    (its status shows in `pool.stats()`); an engine restart clears the mirror."""
    run = apply or threaded_apply(threading.Lock())

    def on_batch(seq, batch) -> None:
        run(lambda: pool.apply(batch.events))

    def on_restart() -> None:
        run(lambda: pool.apply([Cleared()]))

    sub = Subscriber(endpoint, topic=topic, replay_endpoint=replay_endpoint, on_batch=on_batch,
                     on_restart=on_restart, recorder=recorder, **kw)
    pool.source = sub
    return sub.start() if start else sub
