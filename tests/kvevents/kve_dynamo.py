"""Dynamo's own pieces for the tests (the ai-dynamo-runtime wheel): a DistributedRuntime on file
discovery (no etcd), its `KvEventPublisher`s driven by reference caches, and Dynamo's own
`RadixTree` fed what those publishers put on the wire."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import threading

import msgspec
import pytest
from support.kve_source import RefPrefixCache, signed

from kvevents.codec import Removed

try:
    from dynamo._core import (
        DistributedRuntime,
        KvEventPublisher,
        RadixTree,
        compute_block_hash_for_seq,
    )
except ImportError as exc:  # a third-party wheel: CI installs it with the test extra
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"ai-dynamo-runtime is not installed ({exc}): pip install -e '.[test]'",
                allow_module_level=True)

BS = 4
UNIFORM_HASH_SEED = 1_000_003


class Runtime:
    """A Dynamo DistributedRuntime with `event_plane` ("zmq" or "nats"), its discovery in a
    folder (Dynamo's file backend), run on an event loop of its own thread."""

    def __init__(self, folder: str, event_plane: str, nats_url: str | None = None) -> None:
        os.environ["DYN_FILE_KV"] = folder
        os.environ["DYN_EVENT_PLANE_HOST"] = "127.0.0.1"
        if nats_url:
            os.environ["NATS_SERVER"] = nats_url
        self.folder = folder
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make():
            return DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane=event_plane)

        self.drt = asyncio.run_coroutine_threadsafe(make(), self.loop).result(30)

    def publisher(self, path: str, worker_id: int, dp_rank: int = 0,
                  local_indexer: bool = False) -> KvEventPublisher:
        return KvEventPublisher(self.drt.endpoint(path), worker_id=worker_id, kv_block_size=BS,
                                dp_rank=dp_rank, enable_local_indexer=local_indexer)

    def zmq_endpoints(self) -> dict[int, str]:
        """{publisher_id: endpoint} of the ZeroMQ publishers registered in discovery."""
        out = {}
        for f in glob.glob(os.path.join(self.folder, "v1", "event_channels", "*")):
            with open(f, encoding="utf-8") as fh:
                d = json.load(fh)
            if d["transport"]["kind"] == "Zmq" and d["topic"] == "kv-events":
                out[d["instance_id"]] = d["transport"]["config"]["endpoint"]
        return out

    def close(self) -> None:
        self.drt.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class TreeCache(RefPrefixCache):
    """The reference cache keeping its cached blocks prefix-closed, as Dynamo's RadixTree
    assumes: a block is evicted with the descendants it holds (deepest first, in one remove),
    so every store is under a parent the worker holds."""

    def step(self, requests: int = 2) -> list:
        keep, self.capacity = self.capacity, 1 << 30
        try:
            events = super().step(requests)
        finally:
            self.capacity = keep
        parents = getattr(self, "parents", None)
        if parents is None:
            parents = self.parents = {}
        for ev in events:
            if ev.kind == "stored":
                for i, h in enumerate(ev.block_hashes):
                    parents[h] = ev.parent if i == 0 else ev.block_hashes[i - 1]
        while len(self.lru) > self.capacity:
            victim = next(iter(self.lru))
            gone = self._subtree(victim)
            for h in gone:
                del self.lru[h]
                parents.pop(h, None)
            events.append(Removed(gone, "GPU"))
        return events

    def _subtree(self, root: int) -> list[int]:
        """`root` and its cached descendants, deepest first."""
        kids: dict[int, list[int]] = {}
        for h, p in self.parents.items():
            if h in self.lru:
                kids.setdefault(p, []).append(h)
        order, stack = [], [root]
        while stack:
            h = stack.pop()
            order.append(h)
            stack.extend(kids.get(h, ()))
        return order[::-1]


class Worker:
    """One Dynamo worker: a reference cache whose every step goes out through Dynamo's own
    KvEventPublisher (`publish_stored` with the block's token ids, `publish_removed`)."""

    def __init__(self, runtime: Runtime, path: str, worker_id: int, seed: int, dp_rank: int = 0,
                 local_indexer: bool = False):
        self.worker_id = worker_id
        self.pub = runtime.publisher(path, worker_id, dp_rank, local_indexer)
        # Dynamo's workers hash a block alike (vLLM under Dynamo runs with one hash seed), and
        # its RadixTree relies on it: a block stored by two workers under two hashes loses the
        # first worker's hash. So every worker here hashes with the same seed.
        self.source = TreeCache(block_size=BS, seed=seed, hash_seed=UNIFORM_HASH_SEED)
        self.sent = 0  # envelopes published (one per event)

    def step(self) -> None:
        for ev in self.source.step():
            if ev.kind == "stored":
                self.pub.publish_stored(list(ev.token_ids), [BS] * len(ev.block_hashes),
                                        [signed(h) for h in ev.block_hashes],
                                        None if ev.parent is None else signed(ev.parent))
            else:
                self.pub.publish_removed([signed(h) for h in ev.block_hashes])
            self.sent += 1

    def close(self) -> None:
        self.pub.shutdown()


class Reference:
    """Dynamo's RadixTree fed every RouterEvent captured off the wire (decoded generically,
    apart from kvscope's decoder), per publisher in sequence order."""

    def __init__(self) -> None:
        self.tree = RadixTree()
        self.envelopes: dict[int, int] = {}  # publisher_id -> envelopes applied
        self.errors: list[str] = []  # what the RadixTree refused
        self.lock = threading.Lock()

    def feed_envelope(self, envelope: bytes) -> None:
        env = msgspec.msgpack.decode(envelope)
        events = msgspec.msgpack.decode(env["payload"])
        for r in events if isinstance(events, list) else [events]:
            try:
                self.tree.apply_event(r["worker_id"], json.dumps(r["event"]).encode())
            except Exception as exc:  # noqa: BLE001 (the tree says only RuntimeError / ValueError)
                self.errors.append(f"{exc}: {r}")
        with self.lock:
            self.envelopes[env["publisher_id"]] = self.envelopes.get(env["publisher_id"], 0) + 1

    def scores(self, tokens: list[int]) -> dict[tuple[int, int], int]:
        hashes = compute_block_hash_for_seq(tokens, BS)
        return dict(self.tree.find_matches(hashes).scores)

    def blocks_per_worker(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for line in self.tree.dump_tree_as_events():
            e = json.loads(line)
            key = (e["worker_id"], e["event"].get("dp_rank", 0))
            data = e["event"]["data"]
            out[key] = out.get(key, 0) + len(data["stored"]["blocks"]) if "stored" in data else out.get(key, 0)
        return out


def queries(workers) -> list[list[int]]:
    """Every prompt the workers serve, each cut at every block, and one run on past its end."""
    out = []
    for w in workers:
        for p in w.source.prompts:
            for n in range(1, len(p) // BS + 1):
                out.append(p[:n * BS])
            out.append(p + [1, 2, 3, 4, 5, 6, 7, 8])
    return out
