"""Fragmentation metrics, computed exactly as docs/ALLOCATOR.md (Metrics) defines them."""

from __future__ import annotations

import numpy as np


def histogram_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def free_extent_histogram(lengths: np.ndarray) -> dict[str, int]:
    """Count of free runs by power-of-two size class, in blocks: "1", "2-3", "4-7", ..."""
    if lengths.size == 0:
        return {}
    classes = np.floor(np.log2(lengths)).astype(np.int64)
    counts = np.bincount(classes)
    return {
        histogram_label(1 << c, (1 << (c + 1)) - 1): int(n) for c, n in enumerate(counts) if n
    }


def fragmentation_stats(
    free_lengths: np.ndarray, unit_bytes: int, requested_bytes: int, allocated_bytes: int
) -> dict:
    """Internal/external fragmentation from the free runs (in units of `unit_bytes`)."""
    total_free = int(free_lengths.sum()) if free_lengths.size else 0
    largest = int(free_lengths.max()) if free_lengths.size else 0
    return {
        "internal_fragmentation": (1.0 - requested_bytes / allocated_bytes) if allocated_bytes else 0.0,
        "external_fragmentation": (1.0 - largest / total_free) if total_free else 0.0,
        "largest_free_bytes": largest * unit_bytes,
        "free_bytes": total_free * unit_bytes,
        "free_extents": free_extent_histogram(free_lengths),
        "free_extent_count": int(free_lengths.size),
    }
