"""BlockStorage: the one preallocated device tensor of a pool, read and moved in batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import InvalidRequest

# Moves of runs smaller than this on average go through batched gather/scatter: one slice copy
# per run costs a few microseconds of dispatch, which dominates for small blocks.
SMALL_RUN_BYTES = 16 * 1024
# Upper bound on the temporary tensor of a batched move, so that compacting a large GPU pool
# never needs as much spare memory as it moves.
STAGING_BYTES = 64 << 20
# Overlapping slides copied piecewise up to this many pieces; beyond it, through one clone.
MAX_OVERLAP_PIECES = 64


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidRequest(f"unknown device {device!r}: {exc}") from None
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise InvalidRequest(f"device {device!r} requested; CUDA devices here: {torch.cuda.device_count()}")
    if dev.type not in ("cpu", "cuda"):
        raise InvalidRequest(f"device {device!r} is not supported; use auto, cpu or cuda")
    return dev


class BlockStorage:
    """Owns `data`, a uint8 tensor of shape (num_blocks, block_bytes) on one device.

    Blocks are addressed by index; every read, write and move is one batched tensor op
    (index_select / index_copy_), never a Python loop per block. The tensor is allocated once,
    with torch.empty, so creating a large pool does not touch its pages.
    """

    __slots__ = ("num_blocks", "block_bytes", "device", "data")

    def __init__(self, num_blocks: int, block_bytes: int, device: str = "auto") -> None:
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.device = resolve_device(device)
        self.data = torch.empty((num_blocks, block_bytes), dtype=torch.uint8, device=self.device)

    def _index(self, blocks: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(blocks, dtype=torch.long).to(self.device, non_blocking=True)

    def read(self, blocks: Sequence[int], nbytes: int) -> bytes:
        """The first `nbytes` bytes stored across `blocks`, in order."""
        if not blocks:
            return b""
        rows = self.data.index_select(0, self._index(blocks))
        return rows.reshape(-1)[:nbytes].cpu().numpy().tobytes()

    def write(self, blocks: Sequence[int], payload: bytes) -> None:
        """Write `payload` across `blocks` in order; the tail of the last block is zeroed."""
        capacity = len(blocks) * self.block_bytes
        if len(payload) > capacity:
            raise InvalidRequest(f"{len(payload)} bytes do not fit in {capacity} allocated bytes")
        if not blocks:
            return
        buf = torch.zeros(capacity, dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        rows = buf.view(len(blocks), self.block_bytes).to(self.device, non_blocking=True)
        self.data.index_copy_(0, self._index(blocks), rows)

    def move(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy block src[i] to dst[i] for all i as one gather and one scatter.

        The gather materialises the sources first, so overlapping src/dst sets are safe.
        """
        if len(src) != len(dst):
            raise ValueError("src and dst differ in length")
        if not src:
            return
        rows = self.data.index_select(0, self._index(src))
        self.data.index_copy_(0, self._index(dst), rows)

    def move_range(self, src_start: int, dst_start: int, count: int) -> None:
        """Copy a run of blocks with slice copies (no staging buffer when the runs are apart).

        Overlapping runs are copied in gap-sized pieces, in the direction that never overwrites
        a source row before it is read; when the pieces would be many, through one clone.
        """
        if count <= 0 or src_start == dst_start:
            return
        data = self.data
        gap = abs(src_start - dst_start)
        if gap >= count:
            data[dst_start : dst_start + count].copy_(data[src_start : src_start + count])
        elif count // gap > MAX_OVERLAP_PIECES:
            data[dst_start : dst_start + count].copy_(data[src_start : src_start + count].clone())
        else:
            offsets = range(0, count, gap)
            for off in offsets if dst_start < src_start else reversed(offsets):
                n = min(gap, count - off)
                data[dst_start + off : dst_start + off + n].copy_(data[src_start + off : src_start + off + n])

    def move_runs(self, runs: Sequence[tuple[int, int, int]], disjoint: bool = False) -> None:
        """Apply (src, dst, count) moves in order; the caller guarantees that order is safe.

        With `disjoint` (no destination is any move's source), many small runs are moved as
        batched gathers and scatters through a bounded staging size instead of one copy per run.
        """
        if not runs:
            return
        total = sum(r[2] for r in runs)
        if disjoint and total * self.block_bytes < SMALL_RUN_BYTES * len(runs):
            src = np.concatenate([np.arange(s, s + n) for s, _, n in runs])
            dst = np.concatenate([np.arange(d, d + n) for _, d, n in runs])
            step = max(1, STAGING_BYTES // self.block_bytes)
            for i in range(0, len(src), step):
                self.move(src[i : i + step].tolist(), dst[i : i + step].tolist())
            return
        for s, d, n in runs:
            self.move_range(s, d, n)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
