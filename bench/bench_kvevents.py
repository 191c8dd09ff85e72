"""KV-event benchmark: how far the mirror is from keeping up with a busy engine, with baselines
measured in the same run.

1. decode: kvscope's lenient decoder (both wire forms, per-event error isolation) against a typed
   msgspec decoder of vLLM's own struct layout (what vLLM's tests and typed consumers use).
2. apply: blocks/s into a MirrorPool (slots, block map, forest links, event log) against updating
   a plain Python set (the least any mirror must do).
3. end to end over ZeroMQ ipc: kvscope Publisher -> Subscriber -> MirrorPool, against the same
   payloads through a bare PUB/SUB pair (transport alone).

Run: python -m bench kvevents (or python -m bench.bench_kvevents); about 20 s.

A busy engine (20,000 prefill tokens/s, 16-token blocks) stores ~1,250 blocks/s and removes as
many; the target is 100,000 blocks/s end to end (80x that).
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import zmq

from allocator.mirror import MirrorPool
from kvevents.codec import KVEventBatch, Removed, Stored, decode_batch, encode_batch
from kvevents.publisher import Publisher
from kvevents.subscriber import Subscriber

TARGET_BLOCKS_PER_S = 100_000
BLOCK_SIZE = 16


def workload(n_batches: int, seed: int = 0, live_cap: int = 20_000):
    """Batches like an engine step's: a few stored chains (1-8 blocks, 16 tokens each) and the
    removals that keep about `live_cap` blocks cached."""
    rng = random.Random(seed)
    live: list[int] = []
    out = []
    nxt = 1
    for _ in range(n_batches):
        events = []
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(1, 8)
            hashes = [(nxt + i) * 0x9E3779B97F4A7C15 & ((1 << 64) - 1) for i in range(k)]
            nxt += k
            parent = rng.choice(live) if live and rng.random() < 0.7 else None
            events.append(Stored(hashes, parent, [rng.randrange(32000) for _ in range(k * BLOCK_SIZE)],
                                 BLOCK_SIZE, "GPU"))
            live.extend(hashes)
        if len(live) > live_cap:
            drop = len(live) - live_cap
            events.append(Removed(live[:drop], "GPU"))
            del live[:drop]
        out.append(events)
    return out


def blocks_of(batches) -> int:
    return sum(len(e.block_hashes) for b in batches for e in b if e.kind in ("stored", "removed"))


def best_of(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench_decode(batches) -> tuple[float, float]:
    payloads = [encode_batch(b, 1.0) for b in batches]
    typed = msgspec.msgpack.Decoder(type=KVEventBatch)
    n = blocks_of(batches)
    ours = best_of(lambda: [decode_batch(p) for p in payloads])
    theirs = best_of(lambda: [typed.decode(p) for p in payloads])
    return n / ours, n / theirs


def bench_apply(batches) -> tuple[float, float]:
    n = blocks_of(batches)

    def mirror():
        pool = MirrorPool(65_536, name="b", device="cpu")
        for b in batches:
            pool.apply(b)

    def plain():
        s: set[int] = set()
        for b in batches:
            for e in b:
                if e.kind == "stored":
                    s.update(e.block_hashes)
                else:
                    s.difference_update(e.block_hashes)

    return n / best_of(mirror), n / best_of(plain)


def bench_wire(batches, folder: str) -> tuple[float, float]:
    n = blocks_of(batches)
    ctx = zmq.Context.instance()
    # kvscope end to end
    pub = Publisher(f"ipc://{folder}/e2e", replay_endpoint=f"ipc://{folder}/e2e-r", topic="kv")
    pool = MirrorPool(65_536, name="b", device="cpu")
    lock = threading.Lock()

    def on_batch(seq, b):
        with lock:
            pool.apply(b.events)

    sub = Subscriber(f"ipc://{folder}/e2e", topic="kv", replay_endpoint=f"ipc://{folder}/e2e-r",
                     on_batch=on_batch).start()
    time.sleep(0.3)
    pub.publish([])
    while sub.last_seq is None:
        time.sleep(0.01)
    t = time.perf_counter()
    for b in batches:
        pub.publish(b)
    last = pub.next_seq - 1
    while sub.last_seq != last:
        time.sleep(0.0005)
    ours = time.perf_counter() - t
    assert sub.lost_batches == 0, sub.status()
    sub.stop()
    pub.close()
    # bare PUB/SUB with the same payloads
    payloads = [encode_batch(b, 1.0) for b in batches]
    p = ctx.socket(zmq.PUB)
    p.set_hwm(1_000_000)
    p.bind(f"ipc://{folder}/raw")
    s = ctx.socket(zmq.SUB)
    s.set_hwm(1_000_000)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(f"ipc://{folder}/raw")
    time.sleep(0.3)
    got = []
    done = threading.Event()

    def drain():
        while len(got) < len(payloads):
            got.append(s.recv_multipart())
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    t = time.perf_counter()
    for i, pl in enumerate(payloads):
        p.send_multipart((b"kv", i.to_bytes(8, "big"), pl))
    done.wait(60)
    raw = time.perf_counter() - t
    p.close(0)
    s.close(0)
    return n / ours, n / raw


def run() -> int:
    batches = workload(4000)
    n = blocks_of(batches)
    print(f"workload: {len(batches)} batches, {n:,} blocks stored+removed, "
          f"{sum(len(b) for b in batches):,} events")
    ours, typed = bench_decode(batches)
    print(f"decode   kvscope {ours:12,.0f} blocks/s   typed msgspec (vLLM layout) {typed:12,.0f}   ratio {ours / typed:.2f}")
    mirror, plain = bench_apply(batches)
    print(f"apply    MirrorPool {mirror:9,.0f} blocks/s   plain set {plain:12,.0f}   ratio {mirror / plain:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        e2e, raw = bench_wire(batches, folder)
    print(f"wire     kvscope e2e {e2e:8,.0f} blocks/s   bare PUB/SUB {raw:12,.0f}   ratio {e2e / raw:.2f}")
    ok = e2e >= TARGET_BLOCKS_PER_S
    print(f"target   end to end >= {TARGET_BLOCKS_PER_S:,} blocks/s: {'met' if ok else 'MISSED'} "
          f"({e2e / 1250:,.0f}x a busy engine's ~1,250 stored blocks/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
