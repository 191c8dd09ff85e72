"""The stream hub: one task per pool turns block-map changes and new events into frames.

Every `interval_s` (50 ms) a pool's task asks `blockmap.changes_since(v)` and the event log for what
is new, encodes ONE delta frame and one `events` message, and fans them out to every client's
bounded queue. A client whose queue is over its bounds (QUEUE_LIMIT messages or QUEUE_BYTES bytes)
has its backlog dropped and is sent a fresh snapshot, then
`{"type": "resync", "last_event_seq": N}`: the dropped `events` are those up to N it had not seen
(`GET /api/pools/{pool}/events?after=`), later ones come on the stream; the last workload `progress`
is re-sent. So a slow client never makes the server buffer without bound. `stats` go out about 4
times a second when something changed and once a second when nothing did (the page's charts are time
series), `order` (cache pools) and `prefix` (prefix-caching pools) about 4 times a second.

Binary layout (docs/STREAM.md, protocol 1; reader: static/js/frames.js `decodeFrame`), all
little-endian:

    offset size  field
    0      1     magic    0x4B ('K')
    1      1     version  PROTOCOL_VERSION (1)
    2      1     kind     1 = snapshot, 2 = delta
    3      1     reserved 0
    4      4     u32 frame   per-connection frame counter (0 = the first snapshot)
    8      4     u32 blocks  total blocks in the pool
    12     4     u32 runs    number of runs that follow
    16     ...   runs, each:
                 u32 start, u32 count, i32 owner[count] (-1 = free), u8 state[count],
                 zero padding to the next 4-byte boundary

A snapshot is the single run [0, blocks). A delta holds the changed 64-block chunks (adjacent
chunks merged), so a run of n blocks costs 8 + 5n bytes rounded up to 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from allocator import STATE_NAMES, BlockMap, PrefixPool, meta

from .mirrors import detach as detach_links
from .runner import stop_workload

PROTOCOL_VERSION = 1
FRAME_MAGIC = 0x4B
FRAME_SNAPSHOT = 1
FRAME_DELTA = 2
HEADER = struct.Struct("<BBBBIII")
RUN_HEADER = struct.Struct("<II")
FRAME_COUNTER_OFFSET = 4
PAD = (b"", b"\0\0\0", b"\0\0", b"\0")

QUEUE_LIMIT = 64  # messages a client may have queued before it is resynced with a snapshot
# Bytes a client may have queued: a 1M-block snapshot is ~5 MB, so 64 of them would be 320 MB.
QUEUE_BYTES = 8 << 20
STATS_EVERY_S = 0.25
STATS_IDLE_S = 1.0  # unchanged stats still go out this often, so the page's charts keep time
ORDER_EVERY_S = 0.25  # the heat mode colours by it; at ~100 evictions/s a second is stale
ORDER_LIMIT = 5_000
EVENTS_PER_TICK = 1_000

log = logging.getLogger("kvscope.stream")
META = meta()  # the vocabulary, in every hello (allocator/vocab.py)


def prefix_message(pool: PrefixPool) -> dict:
    """The `prefix` message: idle cached blocks in eviction order (next victim first) and the
    reference count of every block held more than once, for the sharing heat mode."""
    order = pool.eviction_order(ORDER_LIMIT + 1)
    refs = pool.core.refcnt_np
    shared = np.flatnonzero(refs >= 2)[:ORDER_LIMIT]
    return {"type": "prefix", "order": order[:ORDER_LIMIT], "truncated": len(order) > ORDER_LIMIT,
            "shared": {"blocks": shared.tolist(), "refcounts": refs[shared].tolist()}}


def encode_frame(bm: BlockMap, kind: int, runs: list[tuple[int, int]], frame: int = 0) -> bytes:
    """One binary frame (layout in the module docstring) holding the given runs of `bm`."""
    owner, state = memoryview(bm.owner).cast("B"), bm.state
    parts = [HEADER.pack(FRAME_MAGIC, PROTOCOL_VERSION, kind, 0, frame, bm.num_blocks, len(runs))]
    append = parts.append
    for start, count in runs:
        append(RUN_HEADER.pack(start, count))
        append(owner[4 * start:4 * (start + count)])
        append(state[start:start + count])
        append(PAD[count & 3])
    return b"".join(parts)


def snapshot_frame(bm: BlockMap, frame: int = 0) -> bytes:
    return encode_frame(bm, FRAME_SNAPSHOT, [(0, bm.num_blocks)], frame)


def with_counter(frame: bytes, counter: int) -> bytes:
    """The same frame with another connection's frame counter (a 16-byte header copy)."""
    return frame[:FRAME_COUNTER_OFFSET] + struct.pack("<I", counter) + frame[FRAME_COUNTER_OFFSET + 4:]


def blockmap_runs(bm: BlockMap) -> list[list[int]]:
    """The whole map run-length encoded as [start, count, owner, state] (numpy, O(blocks))."""
    return blockmap_runs_array(bm).tolist()


def blockmap_runs_array(bm: BlockMap) -> np.ndarray:
    """`blockmap_runs` as an (n, 4) int64 array: a copy, independent of the live map."""
    owners = bm.owners_np()
    states = bm.states_np()
    if bm.num_blocks == 0:
        return np.zeros((0, 4), dtype=np.int64)
    change = np.flatnonzero((owners[1:] != owners[:-1]) | (states[1:] != states[:-1])) + 1
    starts = np.concatenate(([0], change))
    counts = np.diff(np.concatenate((starts, [bm.num_blocks])))
    return np.stack([starts, counts, owners[starts].astype(np.int64), states[starts].astype(np.int64)], axis=1)


RUNS_PER_CHUNK = 4_096  # one json.dumps holds the GIL: keep each short for the loop


def json_runs_chunks(head: dict, runs: np.ndarray):
    """`{**head, "runs": [[start, count, owner, state], ...]}` as JSON, in chunks of
    RUNS_PER_CHUNK runs: a 1M-block map is never one 19 MB string."""
    opening = json.dumps(head, separators=(",", ":"))[:-1]
    yield (opening + (',"runs":[' if head else '{"runs":[')).encode()
    for at in range(0, len(runs), RUNS_PER_CHUNK):
        part = json.dumps(runs[at:at + RUNS_PER_CHUNK].tolist(), separators=(",", ":"))[1:-1]
        yield ((',' if at else '') + part).encode()
    yield b"]}"


def dumps(msg: dict) -> str:
    return json.dumps(msg, separators=(",", ":"), default=str)


@dataclass(eq=False)
class Client:
    """One websocket's outgoing side: a queue drained by its sender task, bounded by count and bytes.

    `queued_bytes` is the size of what sits in `queue` (a text message counts its length: the
    JSON is almost all ASCII). Messages go in with `put` and out with `get`, which keep it true.
    """

    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))
    max_bytes: int = QUEUE_BYTES
    queued_bytes: int = 0
    frames: int = 0  # binary frames sent so far (the next frame counter)
    resyncs: int = 0

    def next_counter(self) -> int:
        n = self.frames
        self.frames = n + 1
        return n

    def fits(self, size: int) -> bool:
        """Whether a message of `size` may join the queue; an empty queue takes anything (a
        snapshot may be larger than `max_bytes` on its own)."""
        q = self.queue
        return q.empty() or (not q.full() and self.queued_bytes + size <= self.max_bytes)

    def put(self, msg: bytes | str | None) -> None:
        """Queue `msg` (None tells the sender to close the socket)."""
        self.queue.put_nowait(msg)
        if msg is not None:
            self.queued_bytes += len(msg)

    def get_nowait(self) -> bytes | str | None:
        msg = self.queue.get_nowait()
        if msg is not None:
            self.queued_bytes -= len(msg)
        return msg

    async def get(self) -> bytes | str | None:
        msg = await self.queue.get()
        if msg is not None:
            self.queued_bytes -= len(msg)
        return msg

    def clear(self) -> None:
        while not self.queue.empty():
            self.get_nowait()


class PoolStream:
    """The stream of one pool: its clients and the task that feeds them."""

    def __init__(self, handle, interval_s: float, instance: dict | None = None) -> None:
        self.handle = handle
        self.interval_s = interval_s
        self.instance = instance or {}  # app/instance.py: instance_id, started_at
        self.clients: set[Client] = set()
        self.since = handle.pool.blockmap.checkpoint()  # the block map's reader checkpoint
        self.seq = handle.pool.events.last_seq
        self.deltas = 0
        self.task: asyncio.Task | None = None
        self._stats_at = 0.0
        self._stats_mark: tuple = ()
        self._order_at = 0.0
        self._order_mark: tuple = ()
        self.last_progress: dict | None = None

    # -- clients ------------------------------------------------------------------------------
    def hello(self) -> dict:
        pool = self.handle.pool
        return {"type": "hello", "protocol": PROTOCOL_VERSION, "pool": pool.config(),
                "states": {str(k): v for k, v in STATE_NAMES.items()},
                "last_event_seq": pool.events.last_seq, "meta": META, **self.instance}

    def join(self) -> Client:
        """A new client, queued with hello + snapshot (synchronously: no delta can slip between)."""
        client = Client()
        if not self.clients:  # the first listener starts from now, not from the last idle tick
            pool = self.handle.pool
            self.since, self.seq = pool.blockmap.checkpoint(), pool.events.last_seq
        client.put(dumps(self.hello()))
        client.put(snapshot_frame(self.handle.pool.blockmap, client.next_counter()))
        self._put_progress(client)
        self.clients.add(client)
        return client

    def leave(self, client: Client) -> None:
        self.clients.discard(client)

    def _put_progress(self, client: Client) -> None:
        if self.last_progress is not None:
            client.put(dumps({"type": "progress", "workload": self.last_progress}))

    def _resync(self, client: Client) -> None:
        """Replace `client`'s backlog with a snapshot and a `resync` naming the last event seq
        the stream had handed out (events up to it that were dropped can be fetched by REST)."""
        client.clear()
        client.resyncs += 1
        client.put(snapshot_frame(self.handle.pool.blockmap, client.next_counter()))
        client.put(dumps({"type": "resync", "last_event_seq": self.seq}))
        self._put_progress(client)

    def send_frame(self, frame: bytes) -> None:
        size = len(frame)
        for client in list(self.clients):
            if client.fits(size):
                client.put(with_counter(frame, client.next_counter()))
            else:
                self._resync(client)

    def send_json(self, msg: dict) -> None:
        text = dumps(msg)
        size = len(text)
        for client in list(self.clients):
            if client.fits(size):
                client.put(text)
            else:
                self._resync(client)

    def close(self, reason: str) -> None:
        for client in list(self.clients):
            client.clear()
            client.put(dumps({"type": "closed", "reason": reason}))
            client.put(None)  # tells the sender to close the socket
        self.clients.clear()

    # -- the tick ------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Send what changed since the last tick. Synchronous: the core is read consistently."""
        pool = self.handle.pool
        bm, events = pool.blockmap, pool.events
        cache = pool.cache  # TTL expiry is app/housekeeping.py's, not the stream's
        if self.handle.lock.locked():
            # A worker thread holds the pool (app/deps.py run_locked); read it next tick.
            return
        if not self.clients:  # nobody listens; `join` takes a fresh checkpoint
            return
        # Chunks stamped since the last checkpoint; a numpy scan of one u32 per 64 blocks.
        self.since, runs = bm.changes_since(self.since)
        if runs:
            self.deltas += 1
            self.send_frame(encode_frame(bm, FRAME_DELTA, runs))
        if events.last_seq != self.seq:
            start = max(self.seq, events.last_seq - EVENTS_PER_TICK)
            batch = events.after(start, EVENTS_PER_TICK)
            msg = {"type": "events", "events": batch}
            if start > self.seq:
                msg["skipped"] = start - self.seq
            self.seq = events.last_seq
            self.send_json(msg)
        if now - self._stats_at >= STATS_EVERY_S:
            mark = (self.deltas, events.last_seq)
            if mark != self._stats_mark or now - self._stats_at >= STATS_IDLE_S:
                self._stats_mark, self._stats_at = mark, now
                self.send_json({"type": "stats", "stats": pool.stats()})
        if cache is not None and now - self._order_at >= ORDER_EVERY_S:
            mark = (self.deltas, events.last_seq, cache.policy)
            if mark != self._order_mark:
                self._order_mark, self._order_at = mark, now
                entries = cache.entries(ORDER_LIMIT + 1)
                shown = entries[:ORDER_LIMIT]
                self.send_json({"type": "order", "ids": [e.id for e in shown],
                                "keys": [e.key for e in shown],
                                "truncated": len(entries) > ORDER_LIMIT})
        if isinstance(pool, PrefixPool) and now - self._order_at >= ORDER_EVERY_S:
            mark = (self.deltas, events.last_seq)
            if mark != self._order_mark:
                self._order_mark, self._order_at = mark, now
                self.send_json(prefix_message(pool))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                self.tick(time.monotonic())
            except Exception:  # a broken tick must not kill the stream of a live pool
                log.exception("stream tick failed for pool %s", self.handle.name)
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))


class Hub:
    """All pool streams of one app; attached when a pool is created, detached when dropped.

    It admits clients up to `max_clients` in all and `max_per_pool` on one pool (`refusal`);
    `stall_s` is how long a client's socket may stay unwritable before it is dropped.
    """

    def __init__(self, interval_s: float = 0.05, instance=None, settings=None) -> None:
        self.interval_s = interval_s
        self.instance = instance.describe() if instance is not None else {}
        self.max_clients = settings.max_stream_clients if settings is not None else 64
        self.max_per_pool = settings.max_stream_clients_per_pool if settings is not None else 16
        self.stall_s = settings.stream_stall_s if settings is not None else 5.0
        self.streams: set[PoolStream] = set()

    def refusal(self, stream: PoolStream) -> str | None:
        """Why one more client may not join `stream`, or None when it may."""
        if len(stream.clients) >= self.max_per_pool:
            return (f"too many stream clients on pool {stream.handle.name!r} "
                    f"({self.max_per_pool}, KVSCOPE_MAX_STREAM_CLIENTS_PER_POOL); try again later")
        if sum(len(s.clients) for s in self.streams) >= self.max_clients:
            return f"too many stream clients ({self.max_clients}, KVSCOPE_MAX_STREAM_CLIENTS); try again later"
        return None

    def attach(self, handle) -> PoolStream:
        stream = PoolStream(handle, self.interval_s, self.instance)
        self.streams.add(stream)
        handle.stream = stream
        stream.task = asyncio.get_running_loop().create_task(stream.run(), name=f"stream:{handle.name}")
        return stream

    async def detach(self, handle, reason: str) -> None:
        stream: PoolStream | None = handle.stream
        if stream is None:
            return

        await stop_workload(handle)
        self.streams.discard(stream)
        await detach_links(handle)
        stream.close(reason)
        if stream.task is not None:
            stream.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream.task
        handle.stream = None

    def progress(self, handle, workload: dict) -> None:
        stream: PoolStream | None = handle.stream
        if stream is not None:
            stream.last_progress = workload
            stream.send_json({"type": "progress", "workload": workload})
