"""A GPU-free engine: a request trace replayed on a prefix-caching pool whose stored / removed /
cleared events go out on the wire, for testing KV-aware routers against kvscope."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .pool_publisher import PoolPublisher


def run_live_source(pool, requests: Iterable[tuple[float, list[int], int]],
                    publisher: PoolPublisher, speed: float | None = 1.0,
                    stop: threading.Event | None = None,
                    progress: Callable[[int, dict], None] | None = None) -> dict:
    """Replay `requests` (arrival seconds, block hashes, prompt tokens) on `pool` (the prefix-cache
    API: `open_sequence(block_hashes=, num_tokens=)`, `close_sequence(id)`), each request opened
    at its arrival divided by `speed` (None: as fast as it goes) and closed at once, so its
    blocks stay cached and idle; after each request the new events are published as one batch,
    as an engine publishes one per scheduler step. A request the pool cannot hold is counted in
    `refused`. Returns counts: requests, refused, cached_tokens, prompt_tokens, batches, events.
    """
    out = {"requests": 0, "refused": 0, "cached_tokens": 0, "prompt_tokens": 0, "batches": 0,
           "events": 0}
    start = time.monotonic()
    first = None
    for arrival, hashes, tokens in requests:
        if stop is not None and stop.is_set():
            break
        if speed:
            first = arrival if first is None else first
            wait = (arrival - first) / speed - (time.monotonic() - start)
            if wait > 0 and stop is not None and stop.wait(wait):
                break
            if wait > 0 and stop is None:
                time.sleep(wait)
        out["requests"] += 1
        out["prompt_tokens"] += tokens
        try:
            info = pool.open_sequence(block_hashes=list(hashes), num_tokens=tokens)
        except Exception as exc:  # the pool's OutOfMemory / InvalidRequest: count, go on
            if type(exc).__name__ not in ("OutOfMemory", "PrefixOutOfMemory", "InvalidRequest"):
                raise
            out["refused"] += 1
        else:
            out["cached_tokens"] += info.cached_tokens
            pool.close_sequence(info.id)
        sent = publisher.flush()
        if sent:
            out["batches"] += 1
            out["events"] += sent
        if progress is not None:
            progress(out["requests"], out)
    return out
