"""The fleet index against NVIDIA Dynamo's own (`dynamo._core.RadixTree`), fed the same events in
the same process, interleaved: `python -m bench fleet [--json FILE]`.

- apply: blocks stored + removed per second. Dynamo takes each event as the JSON bytes its
  binding reads; kvscope takes the decoded batch (kvscope's decode is measured with the wire).
- match: one 16-block prompt. Dynamo gets the 16 block hashes (`find_matches`); kvscope gets the
  token ids and hashes them itself (`match_tokens`), and the precomputed keys (`match_keys`).
- wire: msgpack batches over a real ZeroMQ PUB/SUB into the fleet (decode + apply), one process.
- memory: the compiled index's bytes per (engine, block) held.

Goals: apply >= 3x Dynamo's, match <= 1/3 of Dynamo's, wire >= 1 M blocks/s, <= 64 B per block.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import threading
import time

from allocator.fleet import FleetIndex
from kvevents.codec import Removed, Stored
from kvevents.publisher import Publisher
from kvevents.subscriber import Subscriber

BS = 16
ENGINES = 8
QUERY_BLOCKS = 16
GOALS = {"apply_ratio": 3.0, "match_ratio": 1 / 3, "wire_blocks_per_s": 1_000_000,
         "bytes_per_block": 64}


def h63(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big") >> 1


def workload(n_events: int, seed: int = 0, live_cap: int = 4000):
    """Per-engine event streams over shared prompts: stores of the missing tail of a prompt
    (1-16 blocks under a held parent), LRU-ish evictions of whole chains past `live_cap`.
    Returns [(engine, kvscope event, dynamo json bytes)] and the prompts."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32000) for _ in range(BS * rng.randrange(2, 8))] for _ in range(20)]
    prompts = []
    for _ in range(400):
        p = list(rng.choice(systems)) + [rng.randrange(32000) for _ in range(BS * rng.randrange(2, 24))]
        prompts.append(p)
    held = [dict() for _ in range(ENGINES)]  # chain -> None (insertion order = age)
    out = []
    eid = 0
    while len(out) < n_events:
        e = rng.randrange(ENGINES)
        p = rng.choice(prompts)
        chains = [tuple(p[:(i + 1) * BS]) for i in range(len(p) // BS)]
        first = next((i for i, c in enumerate(chains) if c not in held[e]), None)
        if first is None:
            continue
        run = []
        for c in chains[first:first + 16]:
            if c in held[e]:
                break
            run.append(c)
        for c in run:
            held[e][c] = None
        parent = run[0][:-BS]
        eid += 1
        ours = Stored([h63(e, c) for c in run], h63(e, parent) if parent else None,
                      list(run[-1][len(parent):]), BS, "GPU")
        theirs = json.dumps({"event_id": eid, "data": {"stored": {
            "parent_hash": h63("u", parent) if parent else None,
            "blocks": [{"block_hash": h63("u", c), "tokens_hash": h63("t", c[-BS:])} for c in run]}}})
        out.append((e, ours, theirs.encode()))
        if len(held[e]) > live_cap:
            # evict the oldest chain and every held descendant of it (Dynamo cascades)
            victim = next(iter(held[e]))
            gone = [c for c in held[e] if c[:len(victim)] == victim]
            for c in gone:
                del held[e][c]
            eid += 1
            out.append((e, Removed([h63(e, c) for c in gone], "GPU"), json.dumps(
                {"event_id": eid, "data": {"removed": {"block_hashes": [h63("u", c) for c in gone]}}}).encode()))
    return out, prompts


def blocks_of(events) -> int:
    return sum(len(ev.block_hashes) for _, ev, _ in events)


def apply_kvscope(events) -> tuple[float, FleetIndex]:
    fleet = FleetIndex()
    for e in range(ENGINES):
        fleet.add(f"e{e}", block_size=BS)
    batches = [(e, [ev]) for e, ev, _ in events]
    apply = fleet.apply
    t = time.perf_counter()
    for e, b in batches:
        apply(e, b)
    return time.perf_counter() - t, fleet


def apply_dynamo(events):
    from dynamo._core import RadixTree

    tree = RadixTree()
    rows = [(e, js) for e, _, js in events]
    apply = tree.apply_event
    t = time.perf_counter()
    for e, js in rows:
        apply(e, js)
    return time.perf_counter() - t, tree


def bench_match(fleet, tree, prompts, rounds: int = 5, n: int = 2000) -> tuple[float, float, float]:
    rng = random.Random(1)
    qs = [p for p in prompts if len(p) >= QUERY_BLOCKS * BS]
    toks = [list(rng.choice(qs)[:QUERY_BLOCKS * BS]) for _ in range(n)]
    local = [[h63("t", tuple(q[i:i + BS])) for i in range(0, len(q), BS)] for q in toks]
    keys = [fleet.keys_of(q, BS) for q in toks]
    for q, lh in zip(toks[:50], local[:50]):  # the two agree on what they answer
        want = dict(tree.find_matches(lh).scores)
        got = fleet.match_tokens(q, BS)
        assert {(e, 0): s for e, s in got.items()} == want, (got, want)
    best = {"k": 1e9, "kk": 1e9, "d": 1e9}
    mt, mk, fm = fleet.match_tokens, fleet.match_keys, tree.find_matches
    for _ in range(rounds):
        t = time.perf_counter()
        for q in toks:
            mt(q, BS)
        best["k"] = min(best["k"], time.perf_counter() - t)
        t = time.perf_counter()
        for k in keys:
            mk(k)
        best["kk"] = min(best["kk"], time.perf_counter() - t)
        t = time.perf_counter()
        for lh in local:
            fm(lh)
        best["d"] = min(best["d"], time.perf_counter() - t)
    return best["k"] / n * 1e6, best["kk"] / n * 1e6, best["d"] / n * 1e6


def bench_wire(events, folder: str) -> float:
    """Batches of 32 events, msgpack over PUB/SUB (ipc), decoded and applied by one subscriber
    per engine in this process."""
    fleet = FleetIndex()
    for e in range(ENGINES):
        fleet.add(f"e{e}", block_size=BS)
    lock = threading.Lock()
    pubs, subs = [], []
    per = [[] for _ in range(ENGINES)]
    for e, ev, _ in events:
        per[e].append(ev)
    for e in range(ENGINES):
        pub = Publisher(f"ipc://{folder}/f{e}", replay_endpoint=f"ipc://{folder}/f{e}r", topic="kv",
                        buffer_steps=100_000)

        def on_batch(seq, b, e=e):
            with lock:
                fleet.apply(e, b.events)
        sub = Subscriber(f"ipc://{folder}/f{e}", topic="kv", replay_endpoint=f"ipc://{folder}/f{e}r",
                         on_batch=on_batch, replay_timeout=30.0).start()
        pubs.append(pub)
        subs.append(sub)
    time.sleep(0.3)
    for pub, sub in zip(pubs, subs):
        pub.publish([])
        while sub.last_seq is None:
            time.sleep(0.01)
            pub.publish([])
    from kvevents.codec import encode_batch

    payloads = [[encode_batch(evs[i:i + 32], 1.0) for i in range(0, len(evs), 32)] for evs in per]
    n = blocks_of(events)
    t = time.perf_counter()
    for i in range(max(len(p) for p in payloads)):
        for pub, pl in zip(pubs, payloads):
            if i < len(pl):
                with pub._lock:  # publish pre-encoded payloads, as an engine's thread would
                    seq = pub._seq
                    pub._seq += 1
                    pub._buffer.append((seq, pl[i]))
                    pub._pub.send_multipart((pub._topic, seq.to_bytes(8, "big"), pl[i]))
    for pub, sub in zip(pubs, subs):
        last = pub._seq - 1
        while sub.last_seq != last:
            time.sleep(0.0005)
    took = time.perf_counter() - t
    for pub, sub in zip(pubs, subs):
        assert sub.lost_batches == 0 and sum(sub.errors.values()) == 0, sub.status()
        sub.stop()
        pub.close()
    return n / took


def run(json_path: str | None = None) -> dict:
    events, prompts = workload(40_000)
    n = blocks_of(events)
    print(f"workload: {len(events):,} events, {n:,} blocks stored + removed, {ENGINES} engines, "
          f"{BS} tokens per block")
    ours_t, theirs_t = [], []
    for _ in range(3):  # interleaved rounds; the best of each
        t, fleet = apply_kvscope(events)
        ours_t.append(t)
        t, tree = apply_dynamo(events)
        theirs_t.append(t)
    ours, theirs = n / min(ours_t), n / min(theirs_t)
    print(f"apply    kvscope {ours:12,.0f} blocks/s   dynamo RadixTree {theirs:12,.0f}   "
          f"ratio {ours / theirs:.2f} (goal >= {GOALS['apply_ratio']})")
    k_us, kk_us, d_us = bench_match(fleet, tree, prompts)
    print(f"match    kvscope {k_us:8.2f} us from tokens, {kk_us:6.2f} us from keys   dynamo "
          f"{d_us:8.2f} us   ratio {k_us / d_us:.2f} (goal <= {GOALS['match_ratio']:.2f})")
    held = fleet.holdings
    bpb = fleet.memory_bytes() / max(held, 1)
    print(f"memory   {fleet.memory_bytes():,} B for {held:,} held blocks ({fleet.unique:,} distinct): "
          f"{bpb:.1f} B per held block (goal <= {GOALS['bytes_per_block']})")
    with tempfile.TemporaryDirectory() as folder:
        wire = bench_wire(events, folder)
    print(f"wire     kvscope PUB/SUB -> decode -> fleet {wire:12,.0f} blocks/s "
          f"(goal >= {GOALS['wire_blocks_per_s']:,})")
    out = {"apply": {"kvscope_blocks_per_s": round(ours), "dynamo_blocks_per_s": round(theirs)},
           "match": {"kvscope_us": round(k_us, 3), "dynamo_us": round(d_us, 3),
                     "kvscope_keys_us": round(kk_us, 3)},
           "wire": {"kvscope_blocks_per_s": round(wire)},
           "memory": {"bytes_per_held_block": round(bpb, 1)},
           "goals": GOALS,
           "met": {"apply": ours / theirs >= GOALS["apply_ratio"],
                   "match": k_us / d_us <= GOALS["match_ratio"],
                   "wire": wire >= GOALS["wire_blocks_per_s"],
                   "memory": bpb <= GOALS["bytes_per_block"]}}
    print("goals    " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in out["met"].items()))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {json_path}")
    return out


def json_arg(argv: list[str]) -> str | None:
    return argv[argv.index("--json") + 1] if "--json" in argv[:-1] else None


if __name__ == "__main__":
    run(json_arg(sys.argv[1:]))
