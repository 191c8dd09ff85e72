"""A small, obviously-correct model of vLLM-style prefix caching, for the property tests.

A cached block is named by the whole token prefix it ends (plus the salt), not by a hash, so
there is nothing clever to get wrong. Eviction order is a sort of the idle cached keys by the
policy's key (lru: idle stamp; fifo: store stamp; lfu: (hits, idle stamp); belady: (-next use,
idle stamp)). Blocks are not named: only how many are free, which prefixes are cached, which
are idle, and what each sequence holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from allocator.prefix.prefix import block_hash, root_hash


class ModelOOM(Exception):
    pass


@dataclass
class MSeq:
    tokens: list[int]
    keys: list  # per block: a prefix key (cached block) or an int (unhashed block, see anon)
    salt: str | None
    cached_tokens: int
    nu: list  # next use of each block as given at open (inf for blocks appended later)
    count: int | None = None  # tokens of a sequence opened by count alone (no ids, never cached)


@dataclass
class PrefixModel:
    num_blocks: int
    bs: int
    policy: str = "lru"
    refs: dict = field(default_factory=dict)  # key -> holders (cached keys only)
    idle_stamp: dict = field(default_factory=dict)  # idle cached key -> stamp
    store_stamp: dict = field(default_factory=dict)
    hits: dict = field(default_factory=dict)
    next_use: dict = field(default_factory=dict)
    seqs: dict = field(default_factory=dict)
    anon: dict = field(default_factory=dict)  # unhashed held block id -> holders
    stamp: int = 0
    anon_ids: int = 0
    # s3fifo's order is its own simulation: the test makes the model evict what the pool did,
    # after checking that each of those was an idle cached key
    forced: list | None = None
    queries: int = 0
    hit_tokens: int = 0

    # -- derived ---------------------------------------------------------------------------
    @property
    def held_keyed(self) -> int:
        return sum(1 for k, r in self.refs.items() if r > 0)

    @property
    def free(self) -> int:
        return self.num_blocks - len(self.anon) - self.held_keyed - len(self.idle_stamp)

    def _new_anon(self) -> int:
        self.anon_ids += 1
        self.anon[self.anon_ids] = 1
        return self.anon_ids

    def order(self) -> list:
        def sort_key(k):
            if self.policy == "lru":
                return (self.idle_stamp[k],)
            if self.policy == "fifo":
                return (self.store_stamp[k],)
            if self.policy == "lfu":
                return (self.hits[k], self.idle_stamp[k])
            return (-self.next_use.get(k, float("inf")), self.idle_stamp[k])
        return sorted(self.idle_stamp, key=sort_key)

    def key_of(self, salt, tokens: list[int], i: int) -> tuple:
        return (salt, tuple(tokens[: (i + 1) * self.bs]))

    def key_by_hash(self, h: int):
        return next(k for k in self.refs if self.hash_of(k) == h)

    def hash_of(self, key) -> int:
        salt, toks = key
        h = root_hash(salt)
        for i in range(len(toks) // self.bs):
            h = block_hash(h, toks[i * self.bs:(i + 1) * self.bs])
        return h

    # -- operations --------------------------------------------------------------------------
    def _take(self, n: int) -> list:
        """Take n blocks; returns the keys evicted, in order."""
        evicted = []
        short = n - self.free
        if short > 0:
            victims = self.order()[:short] if self.forced is None else self.forced
            assert len(victims) == short, f"{len(victims)} evicted, {short} needed"
            for k in victims:
                assert k in self.idle_stamp, f"{k} was evicted but is not idle and cached"
                del self.idle_stamp[k], self.refs[k]
                evicted.append(k)
        return evicted

    def _hold(self, key) -> None:
        if self.refs.get(key) == 0:
            del self.idle_stamp[key]
        self.refs[key] = self.refs.get(key, 0) + 1

    def _store(self, key, next_use: float) -> bool:
        if key in self.refs:
            return False
        self.stamp += 1
        self.refs[key] = 1
        self.store_stamp[key] = self.stamp
        self.hits[key] = 0
        self.next_use[key] = next_use
        return True

    def open(self, sid: int, tokens: list[int], salt=None, next_use=None):
        """Returns (cached_tokens, evicted keys); raises ModelOOM with nothing changed."""
        bs = self.bs
        nfull, nblocks = len(tokens) // bs, -(-len(tokens) // bs)
        matched = 0
        while matched < nfull and self.key_of(salt, tokens, matched) in self.refs:
            matched += 1
        keys = [self.key_of(salt, tokens, i) for i in range(matched)]
        idle_matched = sum(1 for k in keys if self.refs[k] == 0)
        need = nblocks - matched
        if need > self.free + len(self.idle_stamp) - idle_matched:
            raise ModelOOM()
        for k in keys:
            self._hold(k)
            self.hits[k] += 1
        evicted = self._take(need)
        nu = next_use or [float("inf")] * nblocks
        if next_use is not None:
            for i, k in enumerate(keys):
                self.next_use[k] = nu[i]
        for i in range(matched, nblocks):
            k = self.key_of(salt, tokens, i) if i < nfull else None
            if k is not None and self._store(k, nu[i]):
                keys.append(k)
            else:
                keys.append(self._new_anon())
        self.seqs[sid] = MSeq(list(tokens), keys, salt, matched * bs, list(nu))
        self.queries += len(tokens)
        self.hit_tokens += matched * bs
        return matched * bs, evicted

    def append(self, sid: int, tokens: list[int]):
        seq = self.seqs[sid]
        bs = self.bs
        old = len(seq.tokens)
        new = old + len(tokens)
        have, nblocks = len(seq.keys), -(-new // bs)
        need = nblocks - have
        if need > self.free + len(self.idle_stamp):
            raise ModelOOM()
        evicted = self._take(need)
        seq.tokens += tokens
        seq.keys += [self._new_anon() for _ in range(need)]
        for i in range(old // bs, new // bs):
            # block i becomes full (it was partial or new, so unhashed until stored)
            k = self.key_of(seq.salt, seq.tokens, i)
            nu = seq.nu[i] if i < len(seq.nu) else float("inf")
            if self._store(k, nu):
                del self.anon[seq.keys[i]]
                seq.keys[i] = k
        return evicted

    def open_counted(self, sid: int, num_tokens: int) -> list:
        """A sequence of `num_tokens` tokens given by count alone: unhashed blocks, no hits.
        Returns the keys evicted; raises ModelOOM with nothing changed."""
        nblocks = -(-num_tokens // self.bs)
        if nblocks > self.free + len(self.idle_stamp):
            raise ModelOOM()
        evicted = self._take(nblocks)
        keys = [self._new_anon() for _ in range(nblocks)]
        self.seqs[sid] = MSeq([], keys, None, 0, [float("inf")] * nblocks, count=num_tokens)
        self.queries += num_tokens
        return evicted

    def append_count(self, sid: int, n: int) -> list:
        """Grow a sequence opened by count by n tokens: new blocks unhashed."""
        seq = self.seqs[sid]
        need = -(-(seq.count + n) // self.bs) - len(seq.keys)
        if need > self.free + len(self.idle_stamp):
            raise ModelOOM()
        evicted = self._take(need)
        seq.keys += [self._new_anon() for _ in range(need)]
        seq.count += n
        return evicted

    def close(self, sid: int) -> None:
        seq = self.seqs.pop(sid)
        for k in reversed(seq.keys):
            if isinstance(k, int):
                self.anon[k] -= 1
                if self.anon[k] == 0:
                    del self.anon[k]
                continue
            self.refs[k] -= 1
            if self.refs[k] == 0:
                self.stamp += 1
                self.idle_stamp[k] = self.stamp

    def reset_prefix(self) -> int:
        n = len(self.refs)
        renamed = {}
        for seq in self.seqs.values():
            for i, k in enumerate(seq.keys):
                if not isinstance(k, int):
                    if k not in renamed:
                        renamed[k] = self._new_anon()
                        self.anon[renamed[k]] = self.refs[k]
                    seq.keys[i] = renamed[k]
        self.refs.clear()
        self.idle_stamp.clear()
        return n
