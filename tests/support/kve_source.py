"""A small, obviously correct prefix cache that plays the engine in the KV-event tests.

Requests share a few system prompts; each block's hash chains its parent's (as vLLM's do), new
blocks are stored, and the least recently used blocks are evicted once `capacity` is passed.
Each `step()` returns the events of one engine step in kvscope's normalised form, and `cached`
is the set the engine holds after it: what a mirror must equal.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict

from kvevents.codec import Cleared, Removed, Stored


def chain_hash(parent: int | None, tokens: list[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update((parent or 0).to_bytes(8, "big"))
    h.update(repr(tokens).encode())
    return int.from_bytes(h.digest(), "big")


class RefPrefixCache:
    def __init__(self, capacity: int = 48, block_size: int = 4, seed: int = 0,
                 hash_seed: int | None = None) -> None:
        # hash_seed: the root's parent in the hash chain, as vLLM seeds each process's hashes
        self.hash_seed = hash_seed
        self.capacity = capacity
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.prompts = [[self.rng.randrange(1000) for _ in range(block_size * n)]
                        for n in (3, 5, 2, 6)]

    @property
    def cached(self) -> set[int]:
        return set(self.lru)

    def step(self, requests: int = 2) -> list:
        events: list = []
        for _ in range(requests):
            tokens = list(self.rng.choice(self.prompts))
            tokens += [self.rng.randrange(1000) for _ in range(self.block_size * self.rng.randrange(0, 4))]
            parent = self.hash_seed
            new: list[int] = []
            new_tokens: list[int] = []
            new_parent = None
            for i in range(0, len(tokens) - self.block_size + 1, self.block_size):
                blk = tokens[i:i + self.block_size]
                h = chain_hash(parent, blk)
                if h in self.lru:
                    self.lru.move_to_end(h)
                    if new:  # a cached block after new ones: flush the run so parents stay right
                        events.append(Stored(new, new_parent, new_tokens, self.block_size, "GPU"))
                        new, new_tokens = [], []
                else:
                    if not new:
                        new_parent = None if parent == self.hash_seed else parent
                    new.append(h)
                    new_tokens += blk
                    self.lru[h] = None
                parent = h
            if new:
                events.append(Stored(new, new_parent, new_tokens, self.block_size, "GPU"))
            evicted = []
            while len(self.lru) > self.capacity:
                h, _ = self.lru.popitem(last=False)
                evicted.append(h)
            if evicted:
                events.append(Removed(evicted, "GPU"))
        return events

    def clear(self) -> list:
        self.lru.clear()
        return [Cleared()]


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def to_engine(mod, events, engine: str = "vllm"):
    """Normalised events as the engine module's own structs (SGLang's hashes signed)."""
    conv = signed if engine == "sglang" else (lambda h: h)
    out = []
    for e in events:
        if e.kind == "stored":
            kw = dict(block_hashes=[conv(h) for h in e.block_hashes],
                      parent_block_hash=None if e.parent is None else conv(e.parent),
                      token_ids=list(e.token_ids), block_size=e.block_size, lora_id=None,
                      medium=e.medium)
            if engine == "vllm":
                kw["lora_name"] = None
            out.append(mod.BlockStored(**kw))
        elif e.kind == "removed":
            out.append(mod.BlockRemoved(block_hashes=[conv(h) for h in e.block_hashes],
                                        medium=e.medium))
        else:
            out.append(mod.AllBlocksCleared())
    return out
