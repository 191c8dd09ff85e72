"""EventLog: a bounded ring of what happened in one pool, read by sequence number."""

from __future__ import annotations

from ._core import EventRing

# Field names of each event kind, after the common (seq, ts, type). Events are stored as plain
# tuples on the hot path and turned into dicts only when someone reads them.
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "allocate": ("id", "requested_bytes", "allocated_bytes", "blocks"),
    "extend": ("id", "requested_bytes", "allocated_bytes", "moved"),
    "free": ("id", "blocks"),
    "truncate": ("id", "requested_bytes", "allocated_bytes"),
    "oom": ("requested_bytes", "free_bytes", "largest_free_bytes", "cause"),
    "defragment": ("moved_blocks", "moved_bytes", "seconds", "before", "after"),
    "reset": ("freed",),
    "put": ("key", "id", "bytes", "blocks"),
    "hit": ("key",),
    "miss": ("key",),
    "remove": ("key", "bytes"),
    "evict": ("key", "bytes", "blocks", "reason", "policy", "age_s", "idle_s"),
    "policy": ("policy",),
    "workload": ("name", "state", "done", "total"),
    # Prefix cache (allocator/prefix.py): hashes are ints in [0, 2**64); parent None for a root
    # block; token_ids a flat list over the stored blocks, or None when only hashes were given.
    "stored": ("blocks", "block_hashes", "parent_block_hash", "token_ids", "block_size", "seq_id"),
    "removed": ("blocks", "block_hashes", "reason"),
    "cleared": ("blocks", "block_hashes"),
    "open": ("seq_id", "num_tokens", "cached_tokens", "blocks"),
    "append": ("seq_id", "num_tokens", "blocks"),
    "close": ("seq_id", "blocks"),
}


class EventLog(EventRing):
    """Bounded ring of typed events with a monotonically increasing `seq` (compiled: see
    `allocator/_events.pxi` for the layout and invariants).

    Invariant: `seq` of the newest event == `last_seq`; events older than the ring's capacity are
    dropped (readers see a gap in seq, never a reordering). `record(kind, *values)` takes the
    kind's EVENT_FIELDS in order; `after()` turns events into dicts only when someone reads them.
    The compiled pool records its numeric events (allocate, free) without any Python object.
    """

    __slots__ = ()

    def __init__(self, capacity: int = 10_000) -> None:
        pass  # EventRing.__cinit__ took the capacity; the kinds are EVENT_FIELDS'

    def __new__(cls, capacity: int = 10_000):
        return EventRing.__new__(cls, capacity, EVENT_FIELDS)
