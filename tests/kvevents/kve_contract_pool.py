"""A tiny prefix cache with the prefix-cache contract's API and events (BRIEF: open_sequence /
close_sequence; `stored` / `removed` / `cleared` in an allocator EventLog), to drive kvscope's
publisher where the allocator's own prefix pool is not built."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from allocator.errors import OutOfMemory
from allocator.pools.events import EventLog


@dataclass
class Info:
    id: int
    num_tokens: int
    cached_tokens: int
    blocks: list[int]


class ContractPrefixPool:
    """Capacity `num_blocks`; idle cached blocks evicted LRU; blocks held by an open sequence
    never. Block ids are not tracked (the events' `blocks` lists are empty)."""

    def __init__(self, num_blocks: int, tokens_per_block: int) -> None:
        self.num_blocks, self.tokens_per_block = num_blocks, tokens_per_block
        self.events = EventLog(100_000)
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.held: dict[int, int] = {}  # hash -> refcount
        self.seqs: dict[int, list[int]] = {}
        self.next_id = 0

    @property
    def cached(self) -> set[int]:
        return set(self.idle) | set(self.held)

    def open_sequence(self, block_hashes, num_tokens):
        hit = 0
        for h in block_hashes:
            if h in self.idle or h in self.held:
                hit += 1
            else:
                break
        new = block_hashes[hit:]
        need = len(set(self.cached) | set(block_hashes)) - self.num_blocks
        evictable = [h for h in self.idle if h not in block_hashes]
        if need > len(evictable):
            raise OutOfMemory(num_tokens, 0, 0, "capacity")
        if need > 0:
            victims = evictable[:need]
            for h in victims:
                del self.idle[h]
            self.events.record("removed", [], victims, "capacity")
        for h in block_hashes:
            self.idle.pop(h, None)
            self.held[h] = self.held.get(h, 0) + 1
        if new:
            parent = block_hashes[hit - 1] if hit else None
            self.events.record("stored", [], list(new), parent, None, self.tokens_per_block, self.next_id + 1)
        self.next_id += 1
        self.seqs[self.next_id] = list(block_hashes)
        return Info(self.next_id, num_tokens, hit * self.tokens_per_block, [])

    def close_sequence(self, seq_id):
        for h in reversed(self.seqs.pop(seq_id)):
            self.held[h] -= 1
            if not self.held[h]:
                del self.held[h]
                self.idle[h] = None  # most recent last, tail before head: the head stays longest

    def reset_prefix_cache(self):
        hashes = list(self.idle)
        self.idle.clear()
        self.events.record("cleared", [], hashes)
