"""The stream hub without a network: frame layout, one delta per tick, slow-client resync."""

from __future__ import annotations

import asyncio
import json

from framecodec import decode_frame

from allocator import KVCache, create_pool
from app.housekeeping import Housekeeper
from app.registry import PoolHandle
from app.stream import QUEUE_BYTES, QUEUE_LIMIT, Hub, PoolStream, encode_frame


def make_stream(blocks: int = 1024) -> PoolStream:
    pool = create_pool("paged", num_blocks=blocks, block_bytes=64)
    KVCache(pool)
    return PoolStream(PoolHandle("t", pool), 0.05)


def drain(client) -> list:
    out = []
    while not client.queue.empty():
        out.append(client.get_nowait())
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


def test_housekeeping_reaps_ttl_entries_with_nobody_listening_and_the_stream_does_not():
    async def go():
        pool = create_pool("paged", num_blocks=64, block_bytes=64)
        cache = KVCache(pool)
        handle = PoolHandle("t", pool)
        hub = Hub(0.01)
        stream = hub.attach(handle)
        cache.put("short", 64, ttl_s=0.1)
        cache.put("long", 64)
        await asyncio.sleep(0.25)
        assert "short" in cache  # the stream ticked many times: expiry is not its job
        keeper = Housekeeper([handle], 0.01)
        keeper.start()
        await asyncio.sleep(0.1)
        assert not stream.clients
        assert "short" not in cache and "long" in cache
        assert pool.used_blocks == 1
        evicts = [e for e in pool.events.after(0) if e["type"] == "evict"]
        assert [(e["key"], e["reason"]) for e in evicts] == [("short", "ttl")]
        await keeper.stop()
        assert keeper.task is None
        await hub.detach(handle, "done")

    asyncio.run(go())


def test_resync_names_the_last_event_seq_so_dropped_events_can_be_fetched():
    async def go():
        stream = make_stream()
        slow = stream.join()
        drain(slow)
        pool = stream.handle.pool
        seen: list[int] = []
        for i in range(QUEUE_LIMIT + 5):
            pool.allocate(1)
            stream.tick(float(i))
        msgs = drain(slow)
        assert slow.resyncs >= 1 and isinstance(msgs[0], bytes) and decode_frame(msgs[0])["kind"] == 1
        resync = json.loads(msgs[1])
        assert resync == {"type": "resync", "last_event_seq": resync["last_event_seq"]}
        n = resync["last_event_seq"]
        for m in msgs[2:]:
            if isinstance(m, str) and json.loads(m)["type"] == "events":
                seen += [e["seq"] for e in json.loads(m)["events"]]
        # What the client missed is exactly what REST gives up to N; the rest came on the stream.
        fetched = [e["seq"] for e in pool.events.after(0, 10_000) if e["seq"] <= n]
        assert fetched + seen == list(range(1, pool.events.last_seq + 1))
        assert seen and min(seen) == n + 1

    asyncio.run(go())


def test_resync_resends_the_last_workload_progress():
    async def go():
        stream = make_stream()
        client = stream.join()
        stream.last_progress = {"name": "burst", "state": "running", "done": 3, "total": 9}
        stream._resync(client)
        msgs = drain(client)
        types = [json.loads(m)["type"] for m in msgs if isinstance(m, str)]
        assert types == ["resync", "progress"]

    asyncio.run(go())


def test_queued_bytes_are_capped_not_only_the_message_count():
    async def go():
        pool = create_pool("paged", num_blocks=1_000_000, block_bytes=64)
        stream = PoolStream(PoolHandle("big", pool), 0.05)
        slow = stream.join()  # hello + a ~5 MB snapshot, never drained
        snapshot = len(encode_frame(pool.blockmap, 1, [(0, pool.num_blocks)]))
        for i in range(4):
            pool.allocate(64 * 200_000)  # a ~1 MB delta each tick
            stream.tick(float(i))
            queued = [slow.queue._queue[j] for j in range(slow.queue.qsize())]
            assert slow.queued_bytes == sum(len(m) for m in queued)
            assert slow.queued_bytes <= QUEUE_BYTES + snapshot
        assert slow.queue.qsize() < QUEUE_LIMIT and slow.resyncs >= 1

    asyncio.run(go())


def test_prefix_pool_stream_sends_eviction_order_shared_refcounts_and_shared_state():
    async def go():
        pool = create_pool("paged", num_blocks=64, block_bytes=64, tokens_per_block=4,
                           prefix_caching={"policy": "lru"})
        stream = PoolStream(PoolHandle("px", pool), 0.05)
        client = stream.join()
        drain(client)
        a = pool.open_sequence(tokens=list(range(8)))
        b = pool.open_sequence(tokens=list(range(8)) + [1])
        c = pool.open_sequence(tokens=list(range(100, 112)))
        pool.close_sequence(c.id)
        stream.tick(10.0)
        out = drain(client)
        (frame,) = [decode_frame(m) for m in out if isinstance(m, bytes)]
        states = frame["runs"][0][3]
        assert [states[x] for x in a.blocks] == [4, 4] and states[b.blocks[2]] == 1
        assert [states[x] for x in c.blocks] == [2, 2, 2]
        messages = [json.loads(m) for m in out if isinstance(m, str)]
        (prefix,) = [m for m in messages if m["type"] == "prefix"]
        assert prefix["order"] == c.blocks[::-1] and prefix["truncated"] is False
        assert prefix["shared"] == {"blocks": sorted(a.blocks), "refcounts": [2, 2]}
        stats = [m for m in messages if m["type"] == "stats"]
        assert stats[0]["stats"]["prefix"]["hits"] == 8
    asyncio.run(go())
