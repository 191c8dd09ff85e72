"""PrefixPool semantics one at a time: vLLM's rules, the event contract, bad input, bytes."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from support.kvtest_util import pool_snapshot

from allocator import (
    SHARED,
    Conflict,
    InvalidRequest,
    NotFound,
    PrefixOutOfMemory,
    create_pool,
)
from allocator.pools.blockmap import CACHED, FREE, USED
from allocator.prefix.prefix import block_hash, root_hash

BS = 4


def make(num_blocks=8, policy="lru", block_bytes=32):
    return create_pool("paged", num_blocks=num_blocks, block_bytes=block_bytes, tokens_per_block=BS,
                       device="cpu", prefix_caching={"policy": policy})


def events(pool, kind):
    return [e for e in pool.events.after(0) if e["type"] == kind]


def chain(tokens, salt=None):
    h, out = root_hash(salt), []
    for i in range(len(tokens) // BS):
        h = block_hash(h, tokens[i * BS:(i + 1) * BS])
        out.append(h)
    return out


def test_shared_prefix_is_reused_not_copied_and_shown_shared():
    pool = make()
    a = pool.open_sequence(tokens=list(range(10)))
    b = pool.open_sequence(tokens=list(range(8)) + [99, 98])
    assert a.cached_tokens == 0 and b.cached_tokens == 8
    assert b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    st = pool.blockmap.state
    assert [st[x] for x in a.blocks] == [SHARED, SHARED, USED]
    assert pool.block_info(a.blocks[0])["refcount"] == 2
    assert pool.prefix_stats()["blocks"] == {"free": 4, "private": 2, "shared": 2, "cached": 0, "allocations": 0}
    assert pool.check() == []


def test_close_keeps_full_blocks_cached_and_frees_partial_tail_first():
    pool = make()
    a = pool.open_sequence(tokens=list(range(10)))
    pool.close_sequence(a.id)
    st = pool.blockmap.state
    assert [st[x] for x in a.blocks] == [CACHED, CACHED, FREE]
    assert pool.eviction_order() == [a.blocks[1], a.blocks[0]]  # tail before head
    assert pool.used_blocks == 0
    assert pool.check() == []


def test_new_blocks_take_free_first_then_evict_in_lru_order_with_removed_event():
    pool = make(num_blocks=4)
    a = pool.open_sequence(tokens=list(range(8)))  # 2 blocks, cached
    b = pool.open_sequence(tokens=list(range(100, 108)))
    pool.close_sequence(a.id)
    pool.close_sequence(b.id)
    hit = pool.open_sequence(tokens=list(range(8)))  # a is hit again: b is now least recent
    assert hit.cached_tokens == 8
    c = pool.open_sequence(tokens=[5] * 6)
    removed = events(pool, "removed")
    assert removed[-1]["blocks"] == [b.blocks[1], b.blocks[0]]
    assert removed[-1]["block_hashes"] == chain(list(range(100, 108)))[::-1]
    assert removed[-1]["reason"] == "evicted"
    assert sorted(c.blocks) == sorted(b.blocks)
    assert pool.check() == []


def test_out_of_memory_only_when_every_block_is_held_and_nothing_changes():
    pool = make(num_blocks=4)
    a = pool.open_sequence(tokens=list(range(12)))
    before = (pool.events.last_seq, pool.blockmap.states_np().tolist())
    with pytest.raises(PrefixOutOfMemory) as info:
        pool.open_sequence(tokens=[9] * 8)
    d = info.value.details()
    assert (d["needed_blocks"], d["available_blocks"], d["held_blocks"], d["cached_blocks"]) == (2, 1, 3, 0)
    assert pool.blockmap.states_np().tolist() == before[1]
    assert [e["type"] for e in pool.events.after(before[0])] == ["oom"]
    pool.close_sequence(a.id)  # 3 cached blocks now reclaimable
    pool.open_sequence(tokens=[9] * 16)
    assert pool.check() == []


def test_stored_event_follows_the_contract_and_chains_from_its_parent():
    pool = make()
    a = pool.open_sequence(tokens=list(range(6)), salt="t1")
    pool.append(a.id, tokens=[6, 7, 8])
    stored = events(pool, "stored")
    hashes = chain(list(range(9)), "t1")
    assert stored[0]["blocks"] == a.blocks[:1]
    assert stored[0]["block_hashes"] == hashes[:1] and stored[0]["parent_block_hash"] is None
    assert stored[0]["token_ids"] == [0, 1, 2, 3] and stored[0]["block_size"] == BS
    assert stored[0]["seq_id"] == a.id
    assert stored[1]["block_hashes"] == hashes[1:2]
    assert stored[1]["parent_block_hash"] == hashes[0]
    assert stored[1]["token_ids"] == [4, 5, 6, 7]
    assert all(0 <= h < 2**64 for e in stored for h in e["block_hashes"])
    opened = events(pool, "open")[0]
    assert (opened["seq_id"], opened["num_tokens"], opened["cached_tokens"], opened["blocks"]) == (a.id, 6, 0, a.blocks)
    appended = events(pool, "append")[0]
    assert appended["num_tokens"] == 9 and appended["blocks"] == pool.sequence(a.id).blocks[2:]
    pool.close_sequence(a.id)
    assert events(pool, "close")[0]["blocks"] == pool.events.after(0)[-1]["blocks"]


def test_salt_separates_caches():
    pool = make()
    pool.close_sequence(pool.open_sequence(tokens=list(range(8)), salt="a").id)
    assert pool.open_sequence(tokens=list(range(8)), salt="b").cached_tokens == 0
    assert pool.open_sequence(tokens=list(range(8)), salt="a").cached_tokens == 8


def test_block_hashes_from_the_caller_match_across_sequences():
    pool = make()
    a = pool.open_sequence(block_hashes=[11, 12, 13], num_tokens=10)  # 2 full + 1 partial hash
    assert len(a.blocks) == 3
    b = pool.open_sequence(block_hashes=[11, 12, 99], num_tokens=12)
    assert b.cached_tokens == 8
    stored = events(pool, "stored")
    assert stored[0]["token_ids"] is None and stored[0]["block_hashes"] == [11, 12]
    pool.append(a.id, num_tokens=2, block_hashes=[13])
    assert events(pool, "stored")[-1]["block_hashes"] == [13]
    assert events(pool, "stored")[-1]["parent_block_hash"] == 12
    assert pool.check() == []


@pytest.mark.parametrize("kwargs, message", [
    ({}, "give 'tokens'"),
    ({"tokens": []}, "empty"),
    ({"tokens": [1, -2]}, "tokens[1]"),
    ({"tokens": [1, 2.0]}, "tokens[1]"),
    ({"tokens": [True]}, "tokens[0]"),
    ({"tokens": "abc"}, "list of integers"),
    ({"tokens": [1], "block_hashes": [1]}, "not both"),
    ({"tokens": [1, 2], "num_tokens": 3}, "disagrees"),
    ({"block_hashes": [1], "num_tokens": 9}, "one hash per full block"),
    ({"block_hashes": [1, 2, 3], "num_tokens": 4}, "one hash per full block"),
    ({"block_hashes": [2**64], "num_tokens": 4}, "block_hashes[0]"),
    ({"block_hashes": [-1], "num_tokens": 4}, "block_hashes[0]"),
    ({"num_tokens": 0}, "positive"),
    ({"num_tokens": 2**62}, "positive"),
    ({"num_tokens": 2**64}, "positive"),
    ({"tokens": [1], "salt": 5}, "salt"),
    ({"tokens": [1], "next_use": [1, 2]}, "one number per block"),
    ({"tokens": [1], "next_use": [float("nan")]}, "next_use[0]"),
])
def test_bad_open_is_refused_with_a_message_and_changes_nothing(kwargs, message):
    pool = make()
    seq = pool.events.last_seq
    with pytest.raises(InvalidRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        pool.open_sequence(**kwargs)
    assert pool.events.last_seq == seq and pool.used_blocks == 0 and pool.check() == []


def test_bad_append_is_refused_and_changes_nothing():
    pool = make()
    a = pool.open_sequence(tokens=[1, 2, 3])
    h = pool.open_sequence(block_hashes=[5], num_tokens=4)
    for seq_id, kwargs in [(a.id, {"num_tokens": 2}), (a.id, {"tokens": [1, "x"]}),
                           (h.id, {"tokens": [1]}), (h.id, {"num_tokens": 4, "block_hashes": []}),
                           (a.id, {"tokens": []})]:
        with pytest.raises(InvalidRequest):
            pool.append(seq_id, **kwargs)
    with pytest.raises(NotFound):
        pool.append(12345, tokens=[1])
    assert pool.sequence(a.id).num_tokens == 3 and pool.check() == []


def snapshot(pool) -> tuple:
    """What a refused open or append must leave as it was (the oom event and counter aside)."""
    seqs = {sid: pool.sequence(sid) for sid in pool.sequence_ids()}
    return pool_snapshot(pool), seqs, pool.prefix_stats()["blocks"], dict(pool.core.index)


def refused(pool, call, error):
    before, oom_seq = snapshot(pool), pool.events.last_seq
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert snapshot(pool) == before
    assert [e["type"] for e in pool.events.after(oom_seq)] in ([], ["oom"])
    assert pool.check() == []
    # judged before anything of the request's size is built (2**34 tokens once built 4 GiB)
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse it"
    return info.value


@pytest.mark.parametrize("num_tokens", [33, 2**32, 2**34, 2**40, 2**62 - 1])
def test_a_sequence_larger_than_the_pool_is_refused_before_its_blocks_are_built(num_tokens):
    pool = make(num_blocks=8)
    pool.close_sequence(pool.open_sequence(tokens=list(range(8))).id)  # 2 idle cached blocks
    held = pool.open_sequence(tokens=[7, 7, 7, 7, 7])
    err = refused(pool, lambda: pool.open_sequence(num_tokens=num_tokens), PrefixOutOfMemory)
    d = err.details()
    assert (d["needed_blocks"], d["available_blocks"], d["held_blocks"], d["cached_blocks"]) == (
        -(-num_tokens // BS), 6, 2, 2)
    # a prompt longer than the pool, its first blocks cached: the same numbers as a full match
    err = refused(pool, lambda: pool.open_sequence(tokens=list(range(8)) + [1] * 28), PrefixOutOfMemory)
    assert err.details()["needed_blocks"] == 9 - 2
    pool.close_sequence(held.id)
    assert pool.open_sequence(num_tokens=32).num_tokens == 32 and pool.check() == []


@pytest.mark.parametrize("opened", [{"block_hashes": [11, 12], "num_tokens": 10}, {"num_tokens": 10}])
def test_an_append_past_the_pool_is_refused_and_check_stays_clean(opened):
    pool = make(num_blocks=16)
    seq = pool.open_sequence(**opened)
    for n in (2**34, 2**40, 2**62 - 1 - 10):
        err = refused(pool, lambda n=n: pool.append(seq.id, num_tokens=n), PrefixOutOfMemory)
        assert err.details()["needed_blocks"] == -(-(10 + n) // BS) - 3
    for n in (2**62, 2**63, 2**64, -(2**40)):
        refused(pool, lambda n=n: pool.append(seq.id, num_tokens=n), InvalidRequest)
    with pytest.raises(ValueError, match="below 2\\*\\*62"):  # the core guards its own sums
        pool.core.append(pool._seqs[seq.id], None, 2**62, None)
    assert pool.append(seq.id, num_tokens=6).num_tokens == 16
    assert pool.requested_total == 16 // BS * 32 and pool.check() == []


def test_an_append_of_a_count_to_a_sequence_of_token_ids_is_refused():
    pool = make()
    seq = pool.open_sequence(tokens=[1, 2, 3])
    refused(pool, lambda: pool.append(seq.id, num_tokens=2**40), InvalidRequest)


def test_reset_prefix_cache_clears_every_hash_and_frees_idle_blocks():
    pool = make()
    a = pool.open_sequence(tokens=list(range(8)))
    b = pool.open_sequence(tokens=list(range(100, 108)))
    pool.close_sequence(b.id)
    assert pool.reset_prefix_cache() == 4
    cleared = events(pool, "cleared")[0]
    assert sorted(cleared["blocks"]) == sorted(a.blocks + b.blocks)
    assert pool.prefix_stats()["blocks"]["cached"] == 0
    assert pool.open_sequence(tokens=list(range(8))).cached_tokens == 0  # held blocks unshared
    pool.close_sequence(a.id)
    assert pool.check() == []


def test_belady_evicts_the_block_used_furthest_in_the_future():
    pool = make(num_blocks=4, policy="belady")
    for base, nu in ((0, 5.0), (100, float("inf")), (200, 1.0)):
        s = pool.open_sequence(tokens=list(range(base, base + 4)), next_use=[nu])
        pool.close_sequence(s.id)
    order = [int(pool.core.hash_np[b]) for b in pool.eviction_order()]
    assert order == [chain(list(range(b, b + 4)))[0] for b in (100, 0, 200)]


def test_plain_allocations_share_the_pool_and_evict_cached_blocks():
    pool = make(num_blocks=4)
    s = pool.open_sequence(tokens=list(range(12)))
    pool.close_sequence(s.id)
    aid = pool.allocate(4 * 32)
    assert len(events(pool, "removed")[-1]["blocks"]) == 3
    pool.write(aid, b"x" * 100)
    assert pool.read(aid, 100) == b"x" * 100
    pool.free(aid)
    with pytest.raises(Conflict):
        pool.defragment()
    assert pool.check() == []


def test_check_names_a_broken_reference_count():
    pool = make()
    a = pool.open_sequence(tokens=list(range(8)))
    pool.core.refcnt_np[a.blocks[0]] = 3
    assert any(f"block {a.blocks[0]} has reference count 3" in p for p in pool.check())


def test_reset_frees_sequences_and_allocations():
    pool = make()
    pool.open_sequence(tokens=list(range(9)))
    pool.allocate(10)
    assert pool.reset() == 2
    assert pool.used_blocks == 0 and pool.sequence_ids() == [] and pool.check() == []


def test_bytes_survive_long_random_churn_with_tokens_and_hashes():
    """A chat-like workload far larger than the pool: every miss writes bytes derived from the
    block's hash, every hit checks them, so a block evicted and reused is never served stale."""
    rng = random.Random(7)
    pool = make(num_blocks=24, block_bytes=64)
    systems = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    seen = 0
    hits = 0
    open_ids: list[int] = []
    for step in range(400):
        if open_ids and (len(open_ids) > 3 or rng.random() < 0.4):
            pool.close_sequence(open_ids.pop(rng.randrange(len(open_ids))))
            continue
        tokens = rng.choice(systems) + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        use_hashes = step % 3 == 0
        hashes = chain(tokens)
        try:
            if use_hashes:
                info = pool.open_sequence(block_hashes=hashes, num_tokens=len(tokens)) if hashes else None
            else:
                info = pool.open_sequence(tokens=tokens)
        except PrefixOutOfMemory:
            continue
        if info is None:
            continue
        open_ids.append(info.id)
        for e in pool.events.after(seen):
            if e["type"] == "stored":
                for b, h in zip(e["blocks"], e["block_hashes"]):
                    pool.storage.write([b], h.to_bytes(8, "little") * 8)
        seen = pool.events.last_seq
        for i in range(info.cached_tokens // BS):
            hits += 1
            assert pool.storage.read([info.blocks[i]], 64) == hashes[i].to_bytes(8, "little") * 8
        assert pool.check() == []
    assert hits > 100 and pool.prefix_stats()["evicted"] > 20
