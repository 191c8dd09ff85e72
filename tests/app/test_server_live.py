"""A real uvicorn server: websocket hello/snapshot/deltas/events, reconnects, concurrent clients."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
from framecodec import apply_frame, decode_frame
from websockets.sync.client import connect


class Watcher:
    """A websocket client that keeps a mirror of the block map and the events it was sent."""

    def __init__(self, url: str) -> None:
        self._connection = connect(url, max_size=None, compression=None)
        self.ws = self._connection.__enter__()
        self.hello = json.loads(self.ws.recv(timeout=30))
        snap = decode_frame(self.ws.recv(timeout=30))
        assert snap["kind"] == 1 and snap["frame"] == 0
        self.owners = [-1] * snap["blocks"]
        self.states = [0] * snap["blocks"]
        apply_frame(self.owners, self.states, snap)
        self.events: list[dict] = []
        self.frames = [snap]
        self.stats: dict | None = None
        self.resyncs = 0  # snapshots received after the first
        self.resync_messages = 0

    def pump_until(self, done, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting on the stream"
            msg = self.ws.recv(timeout=left)
            if isinstance(msg, bytes):
                frame = decode_frame(msg)
                if frame["kind"] == 1:
                    # A snapshot after the first one is a resync: the server dropped this
                    # client's backlog (it was not reading), so counters of dropped frames
                    # are skipped; a JSON `resync` follows it.
                    assert frame["frame"] > self.frames[-1]["frame"]
                    self.resyncs += 1
                else:
                    assert frame["frame"] == self.frames[-1]["frame"] + 1
                self.frames.append(frame)
                apply_frame(self.owners, self.states, frame)
            else:
                data = json.loads(msg)
                if data["type"] == "events":
                    self.events.extend(data["events"])
                elif data["type"] == "stats":
                    self.stats = data["stats"]
                elif data["type"] == "resync":
                    self.resync_messages += 1

    def owned(self, aid: int) -> list[int]:
        return [b for b, o in enumerate(self.owners) if o == aid]

    def close(self) -> None:
        self._connection.__exit__(None, None, None)


def test_hello_snapshot_deltas_events_and_reconnect(server):
    api = httpx.Client(base_url=server.url, timeout=10)
    api.post("/api/pools/default/reset")
    w = Watcher(server.ws_url + "/ws/pools/default")
    assert w.hello["type"] == "hello" and w.hello["protocol"] == 1
    assert w.hello["pool"]["num_blocks"] == 4096 and w.hello["states"]["2"] == "cached"

    alloc = api.post("/api/pools/default/allocations", json={"bytes": 5 * 4096}).json()
    blocks = [b for s, c in alloc["blocks"] for b in range(s, s + c)]
    w.pump_until(lambda: w.owned(alloc["id"]) == blocks)
    assert all(w.states[b] == 1 for b in blocks)
    delta = w.frames[-1]
    assert delta["kind"] == 2 and sum(r[1] for r in delta["runs"]) <= 128  # only the changed chunks

    api.delete(f"/api/pools/default/allocations/{alloc['id']}")
    w.pump_until(lambda: w.owned(alloc["id"]) == [])

    # fill the cache: the fifth 1024-block entry evicts the first
    for i in range(5):
        api.put(f"/api/pools/default/entries/e{i}", json={"bytes": 1024 * 4096})
    w.pump_until(lambda: any(e["type"] == "evict" and e["key"] == "e0" for e in w.events))
    evict = next(e for e in w.events if e["type"] == "evict")
    assert evict["reason"] == "capacity" and evict["policy"] == "lru" and evict["blocks"] == 1024
    e4 = api.get("/api/pools/default/entries/e4").json()
    w.pump_until(lambda: len(w.owned(e4["id"])) == 1024)
    assert {w.states[b] for b in w.owned(e4["id"])} == {2}
    w.pump_until(lambda: w.stats is not None and w.stats["cache"]["entries"] == 4)
    w.close()

    # a reconnect gets hello + snapshot again, showing the current map
    w2 = Watcher(server.ws_url + "/ws/pools/default")
    assert w2.hello["type"] == "hello"
    assert len(w2.owned(e4["id"])) == 1024
    w2.close()


def test_unknown_pool_closes_with_4404_and_deleted_pool_says_closed(server):
    from websockets.exceptions import ConnectionClosed

    with connect(server.ws_url + "/ws/pools/nope") as ws:
        try:
            ws.recv(timeout=30)
            raise AssertionError("expected a close")
        except ConnectionClosed as exc:
            assert exc.rcvd.code == 4404
    api = httpx.Client(base_url=server.url, timeout=10)
    api.post("/api/pools", json={"name": "gone", "num_blocks": 64, "block_bytes": 64})
    w = Watcher(server.ws_url + "/ws/pools/gone")
    api.delete("/api/pools/gone")
    msgs = []
    try:
        while True:
            msgs.append(w.ws.recv(timeout=30))
    except ConnectionClosed:
        pass
    assert json.loads(msgs[-1]) == {"type": "closed", "reason": "pool deleted"}


def test_many_clients_at_once_keep_the_books_straight(server):
    api = httpx.Client(base_url=server.url, timeout=10)
    api.post("/api/pools", json={"name": "conc", "num_blocks": 2048, "block_bytes": 256,
                                 "cache": {"capacity_bytes": 1024 * 256}})
    watcher = Watcher(server.ws_url + "/ws/pools/conc")
    totals = {"gets": 0, "allocs": 0, "frees": 0}
    live: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        gets = allocs = frees = 0
        with httpx.Client(base_url=server.url + "/api/pools/conc", timeout=20) as c:
            for _ in range(120):
                r = rng.random()
                if r < 0.3 or not mine:
                    resp = c.post("/allocations", json={"bytes": rng.randint(1, 4096)})
                    if resp.status_code == 201:
                        mine.append(resp.json()["id"])
                        allocs += 1
                    elif resp.status_code != 507:
                        errors.append(resp.text)
                elif r < 0.45:
                    aid = mine.pop(rng.randrange(len(mine)))
                    if c.delete(f"/allocations/{aid}").status_code != 204:
                        errors.append(f"free {aid}")
                    frees += 1
                elif r < 0.55:
                    resp = c.post(f"/allocations/{rng.choice(mine)}/extend", json={"bytes": 300})
                    if resp.status_code not in (200, 507):
                        errors.append(resp.text)
                elif r < 0.75:
                    resp = c.put(f"/entries/k{rng.randrange(60)}", json={"bytes": rng.randint(1, 40_000)})
                    if resp.status_code not in (200, 201, 507):
                        errors.append(resp.text)
                elif r < 0.95:
                    resp = c.get(f"/entries/k{rng.randrange(60)}")
                    if resp.status_code not in (200, 404):
                        errors.append(resp.text)
                    gets += 1
                else:
                    ops = [{"op": "allocate", "bytes": 100}, {"op": "get", "key": "k1"}]
                    res = c.post("/ops", json={"ops": ops}).json()["results"]
                    if res[0]["ok"]:
                        mine.append(res[0]["id"])
                        allocs += 1
                    gets += 1
        with lock:
            totals["gets"] += gets
            totals["allocs"] += allocs
            totals["frees"] += frees
            for aid in mine:
                live[aid] = 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:5]
    check = api.get("/api/pools/conc/check").json()
    assert check["ok"], check["problems"]
    stats = api.get("/api/pools/conc/stats").json()
    cache = stats["cache"]
    assert cache["hits"] + cache["misses"] == totals["gets"]
    assert stats["allocation_count"] == len(live) + cache["entries"]
    assert stats["counters"]["frees"] >= totals["frees"]
    # the watcher's mirror converges on the server's map
    runs = api.get("/api/pools/conc/blockmap").json()["runs"]
    expected = [o for s, c, o, _ in runs for _ in range(c)]
    watcher.pump_until(lambda: watcher.owners == expected, timeout=30)
    watcher.close()
