"""PrefixPool: a paged pool whose sequences share full blocks named by a chained hash (vLLM's
automatic prefix caching), with reference counts and idle cached blocks evicted on demand."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from .._prefix import HIST_BOUNDS, POLICY_CODES, PrefixCore, block_hash, root_hash
from ..errors import Conflict, InvalidRequest, NotFound, PrefixOutOfMemory
from ..pools.blockmap import CACHED, FREE, NO_OWNER, PINNED, SHARED, STATE_NAMES, USED
from ..pools.pool import Pool
from ..vocab import PREFIX_POLICIES

assert set(PREFIX_POLICIES) == set(POLICY_CODES), "the vocabulary and the core disagree on policies"
MAX_SALT_CHARS = 256
# The most tokens one open or append may name (the core counts tokens in int64, and sums them).
MAX_SEQUENCE_TOKENS = 1 << 62


@dataclass(slots=True)
class SequenceInfo:
    """A plain view of one open sequence: `blocks` are its block ids in data order."""

    id: int
    num_tokens: int
    cached_tokens: int
    blocks: list[int]

    def to_dict(self) -> dict:
        return {"id": self.id, "num_tokens": self.num_tokens, "cached_tokens": self.cached_tokens,
                "blocks": self.blocks}


class PrefixPool(Pool):
    """Fixed-size blocks, shared between sequences through a hash-addressed prefix cache.

    A sequence's full blocks are named by a chained 64-bit hash (parent hash + token ids, or the
    caller's own hashes). Opening a sequence reuses the longest cached prefix (reference count
    + 1, no copy) and takes new blocks for the rest; a block that becomes full is indexed (a
    `stored` event). Closing drops references tail first: idle hashed blocks stay cached and
    evictable, unhashed ones go free. New blocks come from the free stack, then by evicting idle
    cached blocks in the policy's order (`removed` events); out of memory only when every block
    is held. Plain allocations (`allocate` / `free`) work too, each block held once.

    The bookkeeping is the compiled `PrefixCore` (allocator/_prefix.pyx); this class validates
    input, keeps the sequence records and answers `check`.

    Invariants (see `check`): each block's reference count equals the sequences holding it (1
    for a block of a plain allocation); free, idle cached (evictable) and held blocks partition
    the pool; the hash index names exactly the hashed blocks; the block map shows FREE / USED
    (one holder) / SHARED (two or more) / CACHED (idle, hashed) accordingly.

    NOTE: every cached full block of a prompt is reused, the last one included; vLLM recomputes
    the prompt's last token, so a prompt made only of cached full blocks reports one block less
    as hit there.
    """

    strategy = "paged"

    def __init__(self, num_blocks: int, block_bytes: int, *, tokens_per_block: int,
                 policy: str = "lru", **kw) -> None:
        if isinstance(tokens_per_block, bool) or not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
            raise InvalidRequest(f"tokens_per_block must be a positive integer, got {tokens_per_block!r}")
        if policy not in POLICY_CODES:
            raise InvalidRequest(f"unknown prefix-cache policy {policy!r}; choose one of {list(PREFIX_POLICIES)}")
        super().__init__(num_blocks, block_bytes, tokens_per_block=tokens_per_block, **kw)
        self.policy = policy
        self._allocs: dict[int, tuple[int, array]] = {}
        self._seqs: dict = {}  # id -> _prefix.Seq
        self._plain_blocks = 0
        self.core = PrefixCore(num_blocks, tokens_per_block, policy, self.blockmap, self.events, block_bytes)
        self.resets = 0

    # -- plain allocations -------------------------------------------------------------------
    def _reset_free_structure(self) -> None:
        if hasattr(self, "core"):
            self.core.reset_all()

    @property
    def used_blocks(self) -> int:
        """Blocks held by sequences or allocations (idle cached blocks are reclaimable)."""
        return self.num_blocks - self.core.free_top - self.core.n_evictable

    @property
    def requested_total(self) -> int:
        seq_blocks = self.used_blocks - self._plain_blocks
        return self._plain_requested + seq_blocks * self.block_bytes - (
            self.core.slack_tokens * self.block_bytes // self.tokens_per_block)

    @requested_total.setter
    def requested_total(self, value: int) -> None:
        self._plain_requested = value

    def _blocks_for(self, nbytes: int) -> int:
        return -(-nbytes // self.block_bytes)

    def _need(self, n: int) -> None:
        if n > self.core.available():
            raise self._prefix_oom(n)

    # NOTE: each event names the blocks it changed (as the history replays them) and comes
    # after everything it changed; the `removed` event of blocks evicted on the way comes after
    # it (PrefixCore._removed says why).
    def _allocate(self, aid: int, nbytes: int, state: int) -> None:
        n = self._blocks_for(nbytes)
        self._need(n)
        blocks, evicted = self.core.take(n, aid, state)
        self._allocs[aid] = (nbytes, blocks)
        self._plain_blocks += n
        self._plain_requested += nbytes
        self._last_id = aid  # Pool.allocate sets it too; a keyframe after `removed` needs it now
        self.events.record("allocate", aid, nbytes, n * self.block_bytes, n, blocks.tobytes(), state)
        if evicted is not None:
            self.core.removed(evicted, aid)

    def _extend(self, aid: int, nbytes: int) -> bool:
        requested, blocks = self._allocs[aid]
        need = self._blocks_for(requested + nbytes) - len(blocks)
        self._need(need)
        state = int(self.blockmap.state[blocks[0]])
        new = evicted = None
        if need:
            new, evicted = self.core.take(need, aid, state)
            blocks.extend(new)
            self._plain_blocks += need
        self._allocs[aid] = (requested + nbytes, blocks)
        self._plain_requested += nbytes
        self.counters["extends"] += 1
        self.events.record("extend", aid, requested + nbytes, len(blocks) * self.block_bytes, False,
                           None if new is None else new.tobytes(), None, nbytes, state)
        if evicted is not None:
            self.core.removed(evicted, aid)
        return False

    def _truncate(self, aid: int, nbytes: int) -> bytes | None:
        requested, blocks = self._allocs[aid]
        keep = self._blocks_for(nbytes)
        tail = blocks[keep:]
        if tail:
            del blocks[keep:]
            self.core.give_back(tail)
            self._plain_blocks -= len(tail)
        self._allocs[aid] = (nbytes, blocks)
        self._plain_requested += nbytes - requested
        return tail.tobytes() if tail else None

    def _release(self, aid: int) -> None:
        requested, blocks = self._allocs.pop(aid)
        self.core.give_back(blocks)
        self._plain_blocks -= len(blocks)
        self._plain_requested -= requested
        self._frees += 1
        self.events.record("free", aid, len(blocks), blocks.tobytes(), requested)

    def allocate_many(self, sizes: list[int], state: int = USED) -> list[int]:
        """`Pool.allocate_many`, with the blocks needed checked up front: a batch that would
        run out part-way is refused before it evicts any cached block (a rollback could free
        the blocks taken, but not bring the evicted prefixes back)."""
        for nbytes in sizes:
            if nbytes.__class__ is not int or nbytes <= 0:
                self._bad_size(nbytes)
        self._need(sum(self._blocks_for(nbytes) for nbytes in sizes))
        return super().allocate_many(sizes, state)

    def _block_ids(self, aid: int):
        return self._allocs[aid][1]

    def _compact(self):
        raise Conflict("a prefix-caching pool is not defragmented: its blocks are addressed by "
                       "hash and shared, and paged blocks have no external fragmentation")

    def defragment(self):
        """Refused (Conflict): see `_compact`."""
        return self._compact()

    def _free_lengths(self) -> np.ndarray:
        return self.blockmap.free_runs()[1]

    def _free_problems(self, expected_free: np.ndarray) -> list[str]:
        return []  # `check` (overridden whole) verifies the free stack against the records

    def reset(self) -> int:
        """Free everything (sequences, allocations, the prefix cache); keep the configuration."""
        freed = len(self._allocs) + len(self._seqs)
        self._seqs.clear()
        self._plain_blocks = 0
        self._plain_requested = 0
        super().reset()
        return freed

    # -- sequences ---------------------------------------------------------------------------
    def open_sequence(self, tokens=None, block_hashes=None, num_tokens=None, salt=None,
                      next_use=None) -> SequenceInfo:
        """Open a sequence of `tokens` (ids), or of `num_tokens` tokens named by `block_hashes`
        (one per full block; a trailing hash for a partial last block is accepted and ignored),
        or of `num_tokens` alone (nothing cached). Reuses the longest cached prefix.

        `salt` (str) separates caches (e.g. per tenant); `next_use` (one number per block,
        larger = needed later, inf = never) orders eviction under the `belady` policy.
        Raises InvalidRequest (bad input; nothing changes), PrefixOutOfMemory (every block held).
        """
        sid = self._last_id = self._last_id + 1  # before its events: a keyframe after them reads it
        try:
            seq = self.core.open(sid, tokens, block_hashes, num_tokens, salt, next_use)
        except ValueError as exc:  # the core validates: one pass over the input
            self._last_id = sid - 1
            raise InvalidRequest(str(exc)) from None
        except MemoryError as exc:
            self._last_id = sid - 1
            raise self._short_of_blocks(exc) from None
        self._seqs[sid] = seq
        return SequenceInfo(sid, seq.num_tokens, seq.cached_tokens, seq.blocks.tolist())

    def append(self, seq_id: int, tokens=None, num_tokens=None, block_hashes=None) -> SequenceInfo:
        """Grow sequence `seq_id` by `tokens` (a sequence opened with tokens), or by `num_tokens`
        with `block_hashes` for the blocks this fills (one opened with hashes; without them,
        nothing it fills from here on is cached). Blocks that fill up are cached.

        Raises NotFound, InvalidRequest, PrefixOutOfMemory (nothing changes on any of them).
        """
        seq = self._seq(seq_id)
        bs = self.tokens_per_block
        if seq.mode == 1:
            if tokens is None or num_tokens is not None or block_hashes is not None:
                raise InvalidRequest(f"sequence {seq_id} was opened with token ids: append 'tokens'")
            tokens = _int_list(tokens, "tokens")
            n = len(tokens)
            if n == 0:
                raise InvalidRequest("'tokens' is empty")
        else:
            if tokens is not None:
                raise InvalidRequest(f"sequence {seq_id} was opened without token ids: append 'num_tokens'"
                                     + (" with 'block_hashes'" if seq.mode == 2 else ""))
            n = _token_count(num_tokens, "num_tokens")
            if block_hashes is not None:
                if seq.mode != 2:
                    raise InvalidRequest(f"sequence {seq_id} has no hash chain to extend; "
                                         "append 'num_tokens' alone")
                block_hashes = _int_list(block_hashes, "block_hashes")
                filled = (seq.num_tokens + n) // bs - seq.num_tokens // bs
                if len(block_hashes) != filled:
                    raise InvalidRequest(f"appending {n} tokens fills {filled} blocks: give {filled} "
                                         f"block_hashes, got {len(block_hashes)}")
        try:
            self.core.append(seq, tokens, n, block_hashes)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        except MemoryError as exc:
            raise self._short_of_blocks(exc) from None
        return self._info(seq)

    def close_sequence(self, seq_id: int) -> None:
        """Drop the sequence's block references. Raises NotFound (also when closed twice)."""
        if seq_id.__class__ is not int:
            raise NotFound("sequence", seq_id)
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise NotFound("sequence", seq_id)
        self.core.close(seq)

    def sequence(self, seq_id: int) -> SequenceInfo:
        """The open sequence `seq_id`. Raises NotFound."""
        return self._info(self._seq(seq_id))

    def sequence_ids(self) -> list[int]:
        return list(self._seqs)

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash: idle cached blocks go free, held blocks stay with their
        sequences but are no longer shared with new ones (a `cleared` event). Returns how many
        hashes were dropped."""
        blocks, _ = self.core.reset_prefix()
        self.resets += 1
        return len(blocks)

    def set_next_use(self, seq_id: int, next_use) -> None:
        """Replace the Bélády keys of the sequence's blocks (one per block). Raises NotFound,
        InvalidRequest."""
        seq = self._seq(seq_id)
        self.core.set_next_use(seq.blocks, _next_use_list(next_use, len(seq.blocks)))

    def eviction_order(self, limit: int | None = None) -> list[int]:
        """Idle cached blocks in eviction order, next victim first."""
        return self.core.eviction_order(limit)

    def block_info(self, block: int) -> dict:
        """What the page's tooltip shows for one block. Raises NotFound."""
        if block.__class__ is not int or not 0 <= block < self.num_blocks:
            raise NotFound("block", block)
        core = self.core
        hashed = bool(core.hashed_np[block])
        return {
            "block": block,
            "state": STATE_NAMES[self.blockmap.state[block]],
            "refcount": int(core.refcnt_np[block]),
            "hash": f"{int(core.hash_np[block]):016x}" if hashed else None,
            "depth": int(core.depth_np[block]) if hashed else None,
            "hits": core.block_hits(block),
            "owner": int(self.blockmap.owner[block]),
        }

    # -- stats ---------------------------------------------------------------------------------
    def prefix_stats(self) -> dict:
        """Token-weighted queries and hits (vLLM's prefix_cache_queries / _hits), hit ratio,
        blocks by state (free, private, shared, cached), counters and the block-time
        histograms (seconds: lifetime and idle time at eviction, gap between reuses)."""
        core = self.core
        shared = int(np.count_nonzero(core.refcnt_np >= 2))
        return {
            "policy": self.policy,
            "tokens_per_block": self.tokens_per_block,
            "queries": core.queries,
            "hits": core.hit_tokens,
            "hit_ratio": core.hit_tokens / core.queries if core.queries else 0.0,
            "query_blocks": core.query_blocks,
            "hit_blocks": core.hit_blocks,
            "blocks": {"free": core.free_top,
                       "private": self.used_blocks - shared - self._plain_blocks,
                       "shared": shared, "cached": core.n_evictable,
                       "allocations": self._plain_blocks},
            "cached_hashes": len(core.index),
            "sequences": len(self._seqs),
            "stored": core.stored,
            "evicted": core.evicted,
            "opens": core.opens, "appends": core.appends, "closes": core.closes,
            "resets": self.resets,
            "histograms": core.histograms(),
        }

    def _extra_stats(self) -> dict:
        return {"prefix": self.prefix_stats()}

    def stats(self) -> dict:
        """The pool's stats, with `shared` blocks by state and the `prefix` section."""
        out = super().stats()
        out["blocks_by_state"]["shared"] = int(np.count_nonzero(self.blockmap.states_np() == SHARED))
        return out

    def _extra_config(self) -> dict:
        return {"prefix_caching": {"policy": self.policy}}

    # -- invariants ------------------------------------------------------------------------------
    def check(self) -> list[str]:
        """Verify every invariant; returns the problems found (empty = ok). Not for hot paths."""
        core, n, bs = self.core, self.num_blocks, self.tokens_per_block
        problems: list[str] = core.check()
        if problems:  # what follows indexes the pool by those structures: they must hold first
            return problems
        expected = np.zeros(n, np.int64)
        plain = np.zeros(n, bool)
        for aid, (requested, blocks) in self._allocs.items():
            b = np.frombuffer(blocks, np.int32)
            if b.size != self._blocks_for(requested):
                problems.append(f"allocation {aid}: {requested} bytes but {b.size} blocks")
            np.add.at(expected, b, 1)
            plain[b] = True
        slack = 0
        for sid, seq in self._seqs.items():
            b = np.frombuffer(seq.blocks, np.int32)
            if b.size != -(-seq.num_tokens // bs):
                problems.append(f"sequence {sid}: {seq.num_tokens} tokens but {b.size} blocks")
            if np.unique(b).size != b.size:
                problems.append(f"sequence {sid} holds a block twice")
            if plain[b].any():
                problems.append(f"block {int(b[plain[b]][0])} is in sequence {sid} and a plain allocation")
            np.add.at(expected, b, 1)
            slack += b.size * bs - seq.num_tokens
            if seq.mode == 1 and len(seq.pending) != seq.num_tokens % bs:
                problems.append(f"sequence {sid}: {len(seq.pending)} pending tokens, expected {seq.num_tokens % bs}")
        refcnt = core.refcnt_np.astype(np.int64)
        diff = np.flatnonzero(refcnt != expected)
        if diff.size:
            b = int(diff[0])
            problems.append(f"block {b} has reference count {refcnt[b]}, held {expected[b]} times ({diff.size} differ)")
        hashed = core.hashed_np.astype(bool)
        where = core.where_np()
        free = core.free_blocks()
        in_free = np.zeros(n, bool)
        in_free[free] = True
        if np.unique(free).size != free.size:
            problems.append("a block appears twice in the free stack")
        evictable = np.asarray(core.evictable_blocks(), dtype=np.int64)
        in_evict = np.zeros(n, bool)
        in_evict[evictable] = True
        if np.unique(evictable).size != evictable.size or evictable.size != core.n_evictable:
            problems.append(f"evictable structure holds {evictable.size} entries "
                            f"({np.unique(evictable).size} distinct), counter says {core.n_evictable}")
        idle = expected == 0
        for what, have, want in (("free stack", in_free, idle & ~hashed),
                                 ("evictable structure", in_evict, idle & hashed)):
            bad = np.flatnonzero(have != want)
            if bad.size:
                b = int(bad[0])
                problems.append(f"block {b} {'is' if have[b] else 'is not'} in the {what} "
                                f"(held {expected[b]} times, hashed {bool(hashed[b])})")
        want_where = np.where(in_free, 0, np.where(in_evict, 2, 1))
        bad = np.flatnonzero(where != want_where)
        if bad.size:
            problems.append(f"block {int(bad[0])} has location code {int(where[bad[0]])}, "
                            f"expected {int(want_where[bad[0]])}")
        if not core.heap_ok():
            problems.append("the eviction heap is out of order")
        for h, b in core.index.items():
            if not hashed[b] or int(core.hash_np[b]) != h:
                held = f"hash {int(core.hash_np[b]):016x}" if hashed[b] else "no hash"
                problems.append(f"hash {h:016x} indexes block {b}, which holds {held}")
                break
        if int(hashed.sum()) != len(core.index):
            problems.append(f"{int(hashed.sum())} blocks are hashed but the index holds {len(core.index)}")
        problems += self._check_map(expected, plain, in_evict)
        for what, have, want in (("plain blocks", self._plain_blocks, int(plain.sum())),
                                 ("slack tokens", core.slack_tokens, slack),
                                 ("used_blocks", self.used_blocks, int((expected > 0).sum()))):
            if have != want:
                problems.append(f"counter {what} is {have}, the records add up to {want}")
        return problems

    def _check_map(self, expected: np.ndarray, plain: np.ndarray, in_evict: np.ndarray) -> list[str]:
        owners = self.blockmap.owners_np()
        states = self.blockmap.states_np()
        want = np.where(expected >= 2, SHARED, np.where(expected == 1, USED,
                        np.where(in_evict, CACHED, FREE))).astype(np.uint8)
        ok = (states == want) | (plain & ((states == CACHED) | (states == PINNED)))
        bad = np.flatnonzero(~ok)
        if bad.size:
            b = int(bad[0])
            return [f"block map state of block {b} is {STATE_NAMES.get(int(states[b]), states[b])}, "
                    f"expected {STATE_NAMES[int(want[b])]} ({bad.size} differ)"]
        bad = np.flatnonzero((owners == NO_OWNER) != (states == FREE))
        if bad.size:
            b = int(bad[0])
            return [f"block {b} has state {STATE_NAMES[int(states[b])]} but owner {int(owners[b])}"]
        for aid, (_, blocks) in self._allocs.items():
            b = np.frombuffer(blocks, np.int32)
            if (owners[b] != aid).any():
                return [f"block map owner of a block of allocation {aid} is not {aid}"]
        return []

    # -- helpers -------------------------------------------------------------------------------
    def _seq(self, seq_id):
        if seq_id.__class__ is not int:
            raise NotFound("sequence", seq_id)
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise NotFound("sequence", seq_id) from None

    def _info(self, seq) -> SequenceInfo:
        return SequenceInfo(seq.id, seq.num_tokens, seq.cached_tokens, seq.blocks.tolist())

    def _short_of_blocks(self, exc: MemoryError) -> PrefixOutOfMemory:
        """The error for the core's MemoryError(needed, available): more blocks than are free or
        evictable. Any other MemoryError (the process itself out of memory) is no refusal of the
        request's size: it propagates as it is."""
        if len(exc.args) != 2:
            raise exc
        return self._prefix_oom(exc.args[0])

    def _prefix_oom(self, needed: int) -> PrefixOutOfMemory:
        core = self.core
        available = core.available()
        self.counters["ooms_capacity"] += 1
        self.events.record("oom", needed * self.block_bytes, available * self.block_bytes,
                           available * self.block_bytes, "capacity")
        return PrefixOutOfMemory(needed, available, self.block_bytes, self.used_blocks, core.n_evictable)


def _int_list(values, what: str) -> list:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise InvalidRequest(f"'{what}' must be a list of integers")
    return list(values)


def _token_count(value, what: str) -> int:
    if value.__class__ is not int or not 0 < value < MAX_SEQUENCE_TOKENS:
        raise InvalidRequest(f"'{what}' must be a positive integer below 2**62, got {value!r}")
    return value


def _next_use_list(values, nblocks: int) -> list[float]:
    values = _int_list(values, "next_use")
    if len(values) != nblocks:
        raise InvalidRequest(f"'next_use' needs one number per block ({nblocks}), got {len(values)}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise InvalidRequest(f"next_use[{i}] must be a number (inf = never), got {v!r}")
        out.append(float(v))
    return out


__all__ = ["HIST_BOUNDS", "PREFIX_POLICIES", "PrefixPool", "SequenceInfo", "block_hash", "root_hash"]
