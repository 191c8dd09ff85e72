"""The vocabulary (allocator/vocab.py) is the one source of names, and the core agrees with it."""

from __future__ import annotations

import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import InvalidRequest, KVCache, Pool, PoolSpec, create_pool, positive_int, vocab
from allocator.cache.policies import POLICIES as POLICY_CLASSES
from allocator.pools.blockmap import BlockMap
from allocator.pools.events import EventLog


def test_every_strategy_names_a_pool_class_that_says_it_is_that_strategy():
    for name in vocab.STRATEGIES:
        spec = PoolSpec.parse(name, num_blocks=64, block_bytes=16, device="cpu")
        cls = spec.pool_class()
        assert issubclass(cls, Pool) and cls.strategy == name
        assert spec.build().stats()["scatter_fails"] is vocab.STRATEGY_INFO[name].scatter_fails


def test_every_source_strategy_impl_names_a_pool_class_that_says_it_is_that_strategy():
    for info in vocab.SOURCE_STRATEGY_INFO.values():
        module, _, name = info.impl.partition(":")
        cls = getattr(importlib.import_module(f"allocator.{module}"), name)
        assert issubclass(cls, Pool) and cls.strategy == info.name

def test_every_policy_in_the_vocabulary_has_a_class_and_no_class_is_unnamed():
    assert set(POLICY_CLASSES) == set(vocab.POLICIES)


def test_block_state_codes_are_distinct_and_the_block_map_counts_each_name():
    codes = list(vocab.BLOCK_STATES.values())
    assert len(set(codes)) == len(codes) and vocab.BLOCK_STATES["free"] == 0
    assert set(BlockMap(8).counts()) == set(vocab.BLOCK_STATES)


def test_the_event_log_names_fields_from_the_vocabulary():
    log = EventLog(4)
    log.record("oom", 10, 5, 4, "fragmentation")
    (event,) = log.after(0)
    assert [k for k in event if k not in ("seq", "ts", "type")] == list(vocab.EVENT_KINDS["oom"].fields)
    assert {k.group for k in vocab.EVENT_KINDS.values()} <= set(vocab.EVENT_GROUPS)


def test_meta_is_plain_json_and_keeps_the_core_out():
    text = json.dumps(vocab.meta())
    assert "impl" not in text and "PagedPool" not in text
    meta = json.loads(text)
    assert list(meta["strategies"]) == list(vocab.STRATEGIES)
    assert meta["strategies"]["paged"]["scatter_fails"] is False
    assert meta["block_states"]["pinned"]["code"] == vocab.BLOCK_STATES["pinned"]


def test_stranded_free_bytes_counts_what_scatter_strands_only_where_scatter_can_fail():
    for strategy in ("contiguous", "paged"):
        pool = create_pool(strategy, num_blocks=8, block_bytes=16, device="cpu")
        ids = [pool.allocate(16) for _ in range(8)]
        pool.free(ids[1])
        pool.free(ids[4])
        pool.free(ids[5])  # free: 1 block alone, 2 together -> largest 32 of 48 free bytes
        s = pool.stats()
        assert s["free_bytes"] == 48
        assert s["stranded_free_bytes"] == (16 if strategy == "contiguous" else 0)


def test_pool_spec_knows_its_geometry_and_refuses_what_does_not_fit():
    spec = PoolSpec.parse("paged", capacity_bytes=1 << 20, model="tiny")
    assert spec.tokens_per_block == vocab.DEFAULT_TOKENS_PER_BLOCK
    assert spec.block_bytes == 16 * 64 and spec.num_blocks == (1 << 20) // spec.block_bytes
    for bad in ({"fit": "best"}, {"tiers": [{"name": "s", "units": 1, "share": 1}]},
                {"cache": {"policy": "random"}}, {"num_blocks": True}, {"num_blocks": 0}):
        with pytest.raises(InvalidRequest):
            PoolSpec.parse("paged", **{"num_blocks": 4, "block_bytes": 16, **bad})
    assert PoolSpec.parse("contiguous", num_blocks=4, block_bytes=16).fit == "first"


@pytest.mark.parametrize("value", [True, 1.0, "1", None, 0, -3])
def test_positive_int_refuses_everything_but_a_positive_int(value):
    with pytest.raises(InvalidRequest):
        positive_int(value, "x")
    assert positive_int(7, "x") == 7


@given(
    strategy=st.sampled_from(vocab.STRATEGIES),
    num_blocks=st.one_of(st.none(), st.integers(-2, 1 << 20), st.booleans()),
    capacity=st.one_of(st.none(), st.integers(-2, 1 << 26)),
    block_bytes=st.one_of(st.none(), st.integers(-2, 1 << 16)),
    tokens_per_block=st.one_of(st.none(), st.integers(-2, 64)),
    model=st.sampled_from([None, "tiny", "llama-3-8b"]),
)
@settings(max_examples=300, deadline=None)
def test_pool_spec_either_refuses_or_holds_its_invariants(strategy, num_blocks, capacity, block_bytes,
                                                         tokens_per_block, model):
    try:
        spec = PoolSpec.parse(strategy, num_blocks=num_blocks, capacity_bytes=capacity,
                              block_bytes=block_bytes, tokens_per_block=tokens_per_block, model=model)
    except InvalidRequest:
        return
    assert type(spec.num_blocks) is int and spec.num_blocks > 0
    assert type(spec.block_bytes) is int and spec.block_bytes > 0
    assert (num_blocks is None) != (capacity is None)
    if capacity is not None:
        assert spec.capacity_bytes <= capacity < spec.capacity_bytes + spec.block_bytes
    else:
        assert spec.num_blocks == num_blocks
    if block_bytes is None:
        per_block = tokens_per_block or vocab.DEFAULT_TOKENS_PER_BLOCK
        assert spec.block_bytes == per_block * spec.model.bytes_per_token
    elif spec.model is not None and tokens_per_block is not None:
        assert spec.block_bytes == tokens_per_block * spec.model.bytes_per_token
    assert spec.tokens_per_block is None or spec.tokens_per_block > 0
    assert (spec.fit is not None) == ("fit" in vocab.STRATEGY_INFO[strategy].options)


class Recorder:
    """A pool extension that records what the pool tells it."""

    def __init__(self) -> None:
        self.resets = 0

    def on_pool_reset(self) -> None:
        self.resets += 1

    def stats(self) -> dict:
        return {"resets": self.resets}


def test_a_pool_tells_its_extensions_of_resets_and_shows_their_stats_and_nothing_else():
    pool = create_pool("paged", num_blocks=8, block_bytes=16, device="cpu")
    rec = Recorder()
    pool.attach("recorder", rec)
    assert pool.cache is None and pool.stats()["recorder"] == {"resets": 0}
    pool.allocate(16)
    assert pool.reset() == 1
    assert rec.resets == 1 and pool.stats()["recorder"] == {"resets": 1}
    cache = KVCache(pool)
    cache.put("a", 16)
    pool.reset()
    assert pool.cache is cache and len(cache) == 0 and cache.check() == [] and rec.resets == 2


def test_the_old_way_of_attaching_a_cache_still_attaches_it():
    pool = create_pool("paged", num_blocks=8, block_bytes=16, device="cpu")
    rec = Recorder()
    pool.cache = rec
    assert pool.extensions == {"cache": rec} and pool.stats()["cache"] == {"resets": 0}
    pool.reset()
    assert rec.resets == 1
    pool.cache = None
    assert pool.cache is None and "cache" not in pool.stats()
