"""Keyframe: a pool's block map and numbers right after one event, its pages compressed and
shared with the keyframe before it where unchanged."""

from __future__ import annotations

import pickle
import zlib
from dataclasses import dataclass

import numpy as np

from .columns import CacheFigures, KeyframeFigures
from .pickles import safe_loads


@dataclass(slots=True)
class Keyframe:
    """The block map and the numbers right after event `seq`, from which events after `seq`
    replay. The owner (int32) and state (uint8) arrays are cut in pages of PAGE_BLOCKS blocks,
    each zlib-compressed; a keyframe shares (the same bytes object) every page that did not
    change since the keyframe before it, so a keyframe costs what changed, not the whole map.

    `own_bytes`: the compressed bytes this keyframe holds that no older kept keyframe holds
    (what dropping the oldest keyframe frees is recomputed when it goes; see History._trim).
    """

    seq: int
    owner_pages: tuple
    state_pages: tuple
    requested: int
    allocations: int  # live allocation count
    last_id: int
    frees: int
    counters: tuple  # values of COUNTER_NAMES
    own_bytes: int = -1
    cache: CacheFigures | None = None  # the KV cache's own figures then; None: no cache

    def __post_init__(self) -> None:
        if self.own_bytes < 0:
            self.own_bytes = unique_bytes(self.owner_pages + self.state_pages)

    @property
    def nbytes(self) -> int:
        return self.own_bytes + 200

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        owner = np.frombuffer(b"".join(map(zlib.decompress, self.owner_pages)), dtype=np.int32).copy()
        state = np.frombuffer(b"".join(map(zlib.decompress, self.state_pages)), dtype=np.uint8).copy()
        return owner, state

    def size_problem(self, num_blocks: int) -> str | None:
        """None when the pages inflate to exactly `num_blocks` owners and states; else what is
        wrong. Bounded: no page inflates past what is still due plus one byte (a zlib bomb
        stops there), so a file from elsewhere cannot make this allocate more than the map."""
        for pages, width in ((self.owner_pages, 4), (self.state_pages, 1)):
            due = num_blocks * width
            for page in pages:
                try:
                    got = len(zlib.decompressobj().decompress(page, due + 1))
                except (zlib.error, TypeError) as exc:
                    return f"keyframe {self.seq}: {exc}"
                due -= got
                if due < 0:
                    break
            if due != 0:
                return f"keyframe {self.seq} does not hold {num_blocks} blocks"
        return None

    def to_row(self) -> dict:
        figures = KeyframeFigures(self.requested, self.allocations, self.last_id, self.frees,
                                  tuple(self.counters), self.cache)
        return {"seq": self.seq, "owner_z": _pages_blob(self.owner_pages),
                "state_z": _pages_blob(self.state_pages), "scalars": pickle.dumps(figures.plain(), 4)}

    @classmethod
    def from_row(cls, seq: int, owner_z: bytes, state_z: bytes, scalars: bytes) -> Keyframe:
        """A keyframe as a recording stores it (`to_row`), every field checked to be what the
        writer writes. Raises pickle.UnpicklingError."""
        f = KeyframeFigures.of(safe_loads(scalars, bounded=True), seq)
        return cls(seq, _blob_pages(owner_z), _blob_pages(state_z), f.requested, f.allocations,
                   f.last_id, f.frees, f.counters, cache=f.cache)


PAGE_BLOCKS = 16_384  # blocks per keyframe page (64 KiB of owners before compression)


def _pages_blob(pages: tuple) -> bytes:
    """One page as its zlib stream (what recordings always held); several as a pickled tuple
    (a pickle starts with 0x80, a zlib stream with 0x78: the reader tells them apart)."""
    return pages[0] if len(pages) == 1 else pickle.dumps(tuple(pages), 4)


def _blob_pages(blob: bytes) -> tuple:
    if blob.__class__ is not bytes:
        raise pickle.UnpicklingError(f"a keyframe's pages are {type(blob).__name__}, not bytes")
    if blob[:1] == b"\x80":
        pages = safe_loads(blob, bounded=True)
        if not (isinstance(pages, tuple) and all(isinstance(p, bytes) for p in pages)):
            raise pickle.UnpicklingError("a keyframe's pages are not bytes")
        return pages
    return (blob,)


def _compress_pages(arr: np.ndarray, dirty, old: tuple | None, page_blocks: int,
                    uniform: bool = False) -> tuple:
    """arr cut in pages of `page_blocks`, compressed; pages not in `dirty` reuse `old`'s (None:
    compress every page). `uniform`: every element is the same (a new pool's map), so every
    full page is the same bytes object, compressed once."""
    n = arr.shape[0]
    out = []
    same = None
    for i, start in enumerate(range(0, n, page_blocks)):
        if old is not None and i not in dirty:
            out.append(old[i])
        elif uniform and start + page_blocks <= n:
            if same is None:
                same = zlib.compress(memoryview(arr[start:start + page_blocks]).cast("B"), 1)
            out.append(same)
        else:
            out.append(zlib.compress(memoryview(arr[start:start + page_blocks]).cast("B"), 1))
    return tuple(out)


def unique_bytes(pages, exclude=()) -> int:
    """Bytes of the distinct page objects in `pages` that are not in `exclude` (by identity)."""
    skip = {id(p) for p in exclude}
    seen: dict[int, int] = {}
    for p in pages:
        if id(p) not in skip:
            seen[id(p)] = len(p)
    return sum(seen.values())


def keyframe_of(seq: int, owner: np.ndarray, state: np.ndarray, requested: int, allocations: int,
                last_id: int, frees: int, counters, dirty=None, base: Keyframe | None = None,
                page_blocks: int = PAGE_BLOCKS, uniform: bool = False,
                cache: CacheFigures | None = None) -> Keyframe:
    """A keyframe of the map now; with `base` (the previous keyframe), only the pages in `dirty`
    (page indexes changed since `base`) are compressed, the others shared with it. `uniform`:
    every block has the same owner and state (a new pool's map)."""
    old_o = base.owner_pages if base is not None else None
    old_s = base.state_pages if base is not None else None
    owner_pages = _compress_pages(owner, dirty, old_o, page_blocks, uniform)
    state_pages = _compress_pages(state, dirty, old_s, page_blocks, uniform)
    own = unique_bytes(owner_pages + state_pages, (old_o or ()) + (old_s or ()))
    return Keyframe(seq, owner_pages, state_pages, requested, allocations, last_id, frees,
                    tuple(counters), own, cache)


__all__ = ["PAGE_BLOCKS", "Keyframe", "keyframe_of", "unique_bytes"]
