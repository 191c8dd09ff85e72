"""A small, obviously-correct prefix cache: the reference the capacity curve is checked against.

Imported by name (`from prefix_curve_model import RefPrefixPool`). It answers the same calls the curve
makes on the allocator's pool (`open_sequence(block_hashes, num_tokens, next_use)`,
`close_sequence`, `prefix_stats`) with plain dictionaries and linear scans, no cleverness:

- a sequence's cached prefix is its longest run of leading hashes held in the cache;
- its other blocks are all new, as in vLLM: one whose hash the cache already holds (past the
  first miss) is a private copy, freed on close, and the cached one stays where it was;
- room for the new blocks is made by evicting idle blocks (held by no open sequence), the
  victim chosen by scanning them all: lru = oldest release, fifo = oldest insertion (a prompt's
  new blocks stored head first, as a prefill fills them), lfu = fewest uses then oldest release, belady = largest next
  use then oldest release;
- closing releases the blocks tail first (the head is the most recently used).
"""

from __future__ import annotations

from dataclasses import dataclass

REF_POLICIES = ("lru", "fifo", "lfu", "belady")


@dataclass
class Info:
    id: int
    num_tokens: int
    cached_tokens: int
    blocks: list


@dataclass
class Meta:
    refs: int = 0
    inserted: int = 0
    released: int = 0
    uses: int = 1
    next_use: float = float("inf")


class RefPrefixPool:
    def __init__(self, num_blocks: int, tokens_per_block: int, policy: str) -> None:
        assert policy in REF_POLICIES, policy
        self.capacity, self.tpb, self.policy = num_blocks, tokens_per_block, policy
        self.cached: dict[int, Meta] = {}
        self.open: dict[int, list[int]] = {}
        self.clock = 0
        self.evictions = 0
        self.queries = self.hit_blocks = 0

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _victim(self, pinned: set[int]) -> int:
        idle = [h for h, m in self.cached.items() if m.refs == 0 and h not in pinned]
        assert idle, "no idle block to evict"
        score = {
            "lru": lambda h: (self.cached[h].released,),
            "fifo": lambda h: (self.cached[h].inserted,),
            "lfu": lambda h: (self.cached[h].uses, self.cached[h].released),
            "belady": lambda h: (-self.cached[h].next_use, self.cached[h].released),
        }[self.policy]
        return min(idle, key=score)

    def open_sequence(self, block_hashes, num_tokens, next_use=None) -> Info:
        hashes = list(block_hashes)
        assert len(hashes) <= self.capacity
        matched = 0
        while matched < len(hashes) and hashes[matched] in self.cached:
            matched += 1
        pinned = set(hashes[:matched])
        while len(self.cached) + len(hashes) - matched > self.capacity:  # room for every new block
            del self.cached[self._victim(pinned)]
            self.evictions += 1
        held = []  # the cached blocks this sequence holds (private copies are not cached)
        for k, h in enumerate(hashes):  # stored head first, as a prefill fills them
            if k < matched:
                self.cached[h].uses += 1
            elif h in self.cached:
                continue  # cached past the first miss: this sequence's block is a private copy
            else:
                self.cached[h] = Meta(inserted=self._tick())
            self.cached[h].refs += 1
            if next_use is not None:
                self.cached[h].next_use = next_use[k]
            held.append(h)
        sid = self._tick()
        self.open[sid] = held
        self.queries += 1
        self.hit_blocks += matched
        return Info(sid, num_tokens, min(matched * self.tpb, num_tokens), hashes)

    def close_sequence(self, seq_id: int) -> None:
        for h in reversed(self.open.pop(seq_id)):  # tail first: released earliest
            m = self.cached[h]
            m.refs -= 1
            m.released = self._tick()

    def prefix_stats(self) -> dict:
        return {"queries": self.queries, "evicted": self.evictions,
                "cached_blocks": len(self.cached)}


def ref_pool(num_blocks: int, tokens_per_block: int, policy: str) -> RefPrefixPool:
    return RefPrefixPool(num_blocks, tokens_per_block, policy)
