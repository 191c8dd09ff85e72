"""A Python reader of the stream's binary frames (docs/STREAM.md), for tests and the benchmark."""

from __future__ import annotations

import struct

HEADER = struct.Struct("<BBBBIII")


def decode_frame(buf: bytes) -> dict:
    magic, version, kind, _, frame, blocks, nruns = HEADER.unpack_from(buf, 0)
    assert magic == 0x4B and version == 1 and kind in (1, 2), (magic, version, kind)
    off, runs = HEADER.size, []
    for _ in range(nruns):
        start, count = struct.unpack_from("<II", buf, off)
        off += 8
        owners = list(struct.unpack_from(f"<{count}i", buf, off))
        states = list(buf[off + 4 * count: off + 5 * count])
        off += 5 * count
        off += -off % 4
        runs.append((start, count, owners, states))
    assert off == len(buf), (off, len(buf))
    return {"kind": kind, "frame": frame, "blocks": blocks, "runs": runs}


def apply_frame(owners: list[int], states: list[int], frame: dict) -> None:
    for start, count, own, st in frame["runs"]:
        owners[start:start + count] = own
        states[start:start + count] = st
