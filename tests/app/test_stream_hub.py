"""The stream hub without a network: frame layout, one delta per tick, slow-client resync."""

from __future__ import annotations

import asyncio

from framecodec import decode_frame

from allocator import KVCache, create_pool
from app.registry import PoolHandle
from app.stream import QUEUE_LIMIT, PoolStream, encode_frame


def make_stream(blocks: int = 1024) -> PoolStream:
    pool = create_pool("paged", num_blocks=blocks, block_bytes=64)
    KVCache(pool)
    return PoolStream(PoolHandle("t", pool), 0.05)


def drain(client) -> list:
    out = []
    while not client.queue.empty():
        out.append(client.queue.get_nowait())
    return out


def test_delta_holds_only_the_changed_chunks_and_decodes():
    async def go():
        stream = make_stream(100_000)
        client = stream.join()
        drain(client)
        pool = stream.handle.pool
        aid = pool.allocate(64 * 3)
        stream.tick(0.0)
        frames = [decode_frame(m) for m in drain(client) if isinstance(m, bytes)]
        assert len(frames) == 1 and frames[0]["kind"] == 2 and frames[0]["frame"] == 1
        (start, count, owners, states), = frames[0]["runs"]
        assert (start, count) == (0, 64) and owners[:3] == [aid] * 3 and states[:4] == [1, 1, 1, 0]
        stream.tick(0.0)  # nothing changed: no frame
        assert not [m for m in drain(client) if isinstance(m, bytes)]

    asyncio.run(go())


def test_frame_layout_pads_runs_to_four_bytes():
    pool = create_pool("paged", num_blocks=10, block_bytes=64)
    frame = encode_frame(pool.blockmap, 2, [(0, 3), (5, 5)], frame=7)
    assert len(frame) == 16 + (8 + 15 + 1) + (8 + 25 + 3)
    decoded = decode_frame(frame)
    assert decoded["frame"] == 7 and [r[:2] for r in decoded["runs"]] == [(0, 3), (5, 5)]


def test_slow_client_gets_a_snapshot_instead_of_a_backlog():
    async def go():
        stream = make_stream()
        slow, fast = stream.join(), stream.join()
        pool = stream.handle.pool
        for i in range(QUEUE_LIMIT + 5):
            pool.allocate(1)
            stream.tick(float(i))
            drain(fast)
        msgs = drain(slow)
        assert len(msgs) <= QUEUE_LIMIT
        assert slow.resyncs >= 1 and fast.resyncs == 0
        binary = [decode_frame(m) for m in msgs if isinstance(m, bytes)]
        assert binary[0]["kind"] == 1  # the backlog was dropped for a fresh snapshot
        owners = binary[0]["runs"][0][2]
        for f in binary[1:]:
            for start, count, own, _ in f["runs"]:
                owners[start:start + count] = own
        assert owners == list(pool.blockmap.owner)

    asyncio.run(go())


def test_stats_go_out_when_something_changed_and_once_a_second_when_idle():
    async def go():
        stream = make_stream()
        client = stream.join()
        drain(client)

        def stats_sent(now: float) -> bool:
            stream.tick(now)
            return any(isinstance(m, str) and '"type":"stats"' in m for m in drain(client))

        stream.handle.pool.allocate(64)
        assert stats_sent(10.0)          # a change: stats at once
        assert not stats_sent(10.1)      # nothing changed, too soon
        assert not stats_sent(10.9)
        assert stats_sent(11.05)         # idle heartbeat after a second
        stream.handle.pool.allocate(64)
        assert not stats_sent(11.1)      # changes still wait for the 0.25 s spacing
        assert stats_sent(11.35)

    asyncio.run(go())
