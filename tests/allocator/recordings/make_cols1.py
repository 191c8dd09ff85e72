"""Writes the "cols1" recordings in this folder. Run it with a checkout of the build that wrote
that format (commit 6302427, the last before "cols2"), compiled in place:

    git worktree add --detach /tmp/cols1 6302427 && cd /tmp/cols1
    python setup.py build_ext --inplace
    PYTHONPATH=. python /path/to/tests/allocator/recordings/make_cols1.py /path/to/tests/allocator/recordings

Each pool is driven at random (seeded) with a small event ring, so most events reach the file as
"cols1" segments; `<name>.expected.json` holds the live pool's block map (as runs) and stats at
a few points, taken while it ran, which a replay of the file must answer again.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# The modules of that build (allocator/ was flat then), not of this one.
from allocator.recording import Recorder, read_recording

from allocator import KVCache, create_pool
from allocator.history import map_runs

BLOCK = 64


def drive_pool(pool, rng: random.Random, steps: int, seen: dict, cache=None) -> None:
    live = []
    for i in range(steps):
        seen[pool.events.last_seq] = live_point(pool)
        r = rng.random()
        try:
            if r < 0.35 or not live:
                live.append(pool.allocate(BLOCK * rng.randint(1, 12)))
            elif r < 0.6:
                pool.free(live.pop(rng.randrange(len(live))))
            elif r < 0.7 and pool.strategy != "tiered":
                pool.extend(rng.choice(live), BLOCK * rng.randint(1, 4))
            elif r < 0.75:
                aid = rng.choice(live)
                if pool.allocation(aid).requested_bytes > BLOCK:
                    pool.truncate(aid, BLOCK)
            elif cache is not None and r < 0.95:
                key = f"k{rng.randrange(40)}"
                if rng.random() < 0.5:
                    cache.put(key, BLOCK * rng.randint(1, 6))
                else:
                    cache.get(key)
            elif r < 0.97 and pool.strategy == "contiguous":
                pool.defragment()
        except Exception:  # an OOM is an event too
            pass
        if i == steps // 2 and pool.strategy == "paged":
            pool.reset()
            live.clear()


def live_point(pool) -> dict:
    stats = {k: v for k, v in pool.stats().items() if k not in ("cache", "prefix")}
    return {"seq": pool.events.last_seq, "stats": stats,
            "map": map_runs(pool.blockmap.owners_np(), pool.blockmap.states_np())}


def drive_prefix(pool, rng: random.Random, steps: int, seen: dict) -> None:
    open_ids = []
    prompts = [[rng.randrange(1000) for _ in range(64)] for _ in range(6)]
    for _ in range(steps):
        seen[pool.events.last_seq] = live_point(pool)
        r = rng.random()
        try:
            if r < 0.4 or not open_ids:
                tokens = rng.choice(prompts)[: rng.randint(8, 64)]
                open_ids.append(pool.open_sequence(tokens=tokens).id)
            elif r < 0.7:
                pool.append(rng.choice(open_ids), tokens=[rng.randrange(1000) for _ in range(rng.randint(1, 20))])
            else:
                pool.close_sequence(open_ids.pop(rng.randrange(len(open_ids))))
        except Exception:
            pass


def make(out: Path, name: str, pool, drive) -> None:
    path = out / f"{name}.kvrec"
    path.unlink(missing_ok=True)
    rec = Recorder(pool, path)
    seen: dict = {}
    drive(seen)
    seen[pool.events.last_seq] = live_point(pool)
    rec.stop()
    meta, view = read_recording(path)
    points = sorted({view.first_seq, view.last_seq, *random.Random(7).sample(sorted(seen), 8)})
    expected = [seen[seq] for seq in points]
    (out / f"{name}.expected.json").write_text(json.dumps(expected, sort_keys=True) + "\n")
    print(name, path.stat().st_size, "bytes,", view.last_seq - view.first_seq, "events")


def main(out: Path) -> None:
    rng = random.Random(1)
    pool = create_pool("paged", num_blocks=128, block_bytes=BLOCK, device="cpu", event_capacity=64,
                       name="paged")
    cache = KVCache(pool, BLOCK * 64, "lru")
    make(out, "cols1-paged", pool, lambda seen: drive_pool(pool, rng, 500, seen, cache))
    pool = create_pool("contiguous", num_blocks=128, block_bytes=BLOCK, device="cpu", event_capacity=64,
                       name="contiguous")
    make(out, "cols1-contiguous", pool, lambda seen: drive_pool(pool, rng, 300, seen))
    pool = create_pool("tiered", num_blocks=256, block_bytes=BLOCK, device="cpu", event_capacity=64,
                       name="tiered")
    make(out, "cols1-tiered", pool, lambda seen: drive_pool(pool, rng, 300, seen))
    pool = create_pool("paged", num_blocks=128, block_bytes=BLOCK, tokens_per_block=8, device="cpu",
                       event_capacity=64, name="prefix", prefix_caching={"policy": "lru"})
    make(out, "cols1-prefix", pool, lambda seen: drive_prefix(pool, rng, 300, seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
