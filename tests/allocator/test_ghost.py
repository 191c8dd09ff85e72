"""S3-FIFO's ghost (allocator/_eviction.pxi's `Ghost`, shared by the cache's S3FIFO and the prefix
pool): it remembers what the reference model's OrderedDict remembers, in the same order, and its
list of keys stays bounded however often remembered keys come back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_model import S3FIFO as ModelS3FIFO

from allocator import create_pool
from allocator.cache.policies import S3FIFO

KEYS = [f"k{i}" for i in range(30)]
ops = st.lists(st.tuples(st.sampled_from(["insert", "touch", "drop", "drop_evicted", "evict"]),
                         st.sampled_from(KEYS)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(steps=ops)
def test_ghost_remembers_what_the_model_remembers_in_its_order(steps):
    real, model = S3FIFO(), ModelS3FIFO()
    for op, key in steps:
        held = key in model.keys()
        if op == "insert" and not held:
            real.insert(key)
            model.insert(key)
        elif op == "touch" and held:
            real.touch(key)
            model.touch(key)
        elif op in ("drop", "drop_evicted") and held:
            real.remove(key, op == "drop_evicted")
            model.remove(key, op == "drop_evicted")
        elif op == "evict" and model.keys():
            victim = model.victim()
            assert real.victim() == victim
            real.remove(victim, True)
            model.remove(victim, True)
        assert real.ghost_keys() == list(model._ghost)
        assert list(real._ghost) == real.ghost_keys() and len(real._ghost) == len(model._ghost)
    assert real.check() == []


def test_a_ghost_whose_keys_keep_coming_back_stays_bounded():
    policy = S3FIFO()
    for i in range(1000):  # touched: a main queue of ~900 keys, the ghost may hold as many
        policy.insert(f"m{i}")
        policy.touch(f"m{i}")
    policy.insert("first")
    policy.victim()  # promotes touched keys to main until small holds a tenth of the keys
    assert len(policy.order()) == 1001 and policy.order()[-1] == "m999"
    policy.remove("first", True)  # evicted from small: the ghost remembers it
    ghost = policy._ghost
    for _ in range(5000):  # remembered, recalled (back into main), dropped: again and again
        policy.insert("x")
        policy.remove("x", True)
        assert "x" in ghost
        policy.insert("x")
        assert "x" not in ghost
        policy.remove("x")
        assert ghost._entries() <= 2 * 2 + 33  # it never holds more than 2 keys here
    assert policy.ghost_keys() == ["first"]
    assert policy.check() == []


def test_prefix_pool_ghost_sends_a_hash_stored_again_to_main():
    pool = create_pool("paged", num_blocks=6, block_bytes=64, device="cpu", tokens_per_block=4,
                       prefix_caching={"policy": "s3fifo"})
    for _ in range(2):  # 100 and 101 hit once: promoted to main when eviction first passes them
        pool.close_sequence(pool.open_sequence(block_hashes=[100, 101], num_tokens=8).id)
    pool.close_sequence(pool.open_sequence(block_hashes=[1, 2], num_tokens=8).id)  # small: 2, 1
    b = pool.open_sequence(block_hashes=[3, 4, 5], num_tokens=12)  # 2 free blocks, 1 evicted
    assert list(pool.core.ghost) == [2]  # main now holds 2 blocks: the ghost may keep 2 hashes
    pool.close_sequence(b.id)
    c = pool.open_sequence(block_hashes=[2], num_tokens=4)  # evicts 1 from small; 2 comes back
    assert list(pool.core.ghost) == [1]
    queue = pool.core._raw()["queue"]
    assert queue[c.blocks[0]] == 1  # filed for main (Q_MAIN) when stored
    pool.close_sequence(c.id)
    assert pool.core.eviction_order()[-1] == c.blocks[0]  # behind small, after main's two
    assert pool.check() == []
