"""BlockStorage: the one preallocated device tensor of a pool, read and moved in batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import InvalidRequest


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidRequest(f"unknown device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequest("device 'cuda' requested but no CUDA device is available")
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

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

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
        """Copy a run of blocks; overlapping runs are handled by an intermediate clone."""
        if count <= 0 or src_start == dst_start:
            return
        chunk = self.data[src_start : src_start + count]
        if abs(src_start - dst_start) < count:
            chunk = chunk.clone()
        self.data[dst_start : dst_start + count].copy_(chunk)

    def checksum(self, blocks: Sequence[int], nbytes: int) -> int:
        import zlib

        return zlib.crc32(self.read(blocks, nbytes))

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
