"""Eviction policies: which cached key goes first. They know keys only, never sizes or blocks.

Every policy answers the same calls: `insert(key)`, `touch(key)` (a hit), `remove(key,
evicted)`, `victim()` (the next key to evict, without removing it), `order(limit)` (keys in
eviction order, next victim first), `keys()`, `len()` and `check()`. Invariant: the set of keys
held equals what was inserted and not yet removed; the cache's `check()` compares them.

The policies are compiled (allocator/_policies.pxi): each order is an intrusive int32 list
over per-key slots, so a touch or an eviction is a few C array writes. The plain-Python
reference they are tested against lives in tests/allocator/policy_model.py.
"""

from __future__ import annotations

from .._core import FIFO, LFU, LRU, S3FIFO

POLICIES: dict[str, type] = {"lru": LRU, "fifo": FIFO, "lfu": LFU, "s3fifo": S3FIFO}

__all__ = ["FIFO", "LFU", "LRU", "POLICIES", "S3FIFO"]
