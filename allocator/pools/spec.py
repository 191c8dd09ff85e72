"""PoolSpec: a pool request parsed once into typed, validated values that know their geometry.

Every way of making a pool (the REST create, the default pool, scenarios, benchmarks) goes
through `PoolSpec.parse` and then `build()`, so defaults (`tokens_per_block` 16), the geometry
(num_blocks x block_bytes), the options each strategy takes and the size checks live here once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..cache.cache import KVCache
from ..errors import InvalidRequest, TooLarge, positive_int
from ..history.history import DEFAULT_HISTORY_BYTES, History
from ..prefix.prefix import PrefixPool
from ..vocab import (
    DEFAULT_TOKENS_PER_BLOCK,
    FITS,
    POLICIES,
    PREFIX_POLICIES,
    STRATEGIES,
    STRATEGY_INFO,
)
from .geometry import ModelGeometry, get_model


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """The KV cache a pool is created with: its budget (None: the whole pool) and policy."""

    capacity_bytes: int | None = None
    policy: str = "lru"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A validated pool request. Invariants: `strategy` is in the vocabulary; `num_blocks` and
    `block_bytes` are positive ints; `block_bytes == tokens_per_block * model.bytes_per_token`
    when both a model and tokens_per_block are set; `fit` / `tiers` are set only for the
    strategy that takes them."""

    strategy: str
    num_blocks: int
    block_bytes: int
    name: str = "pool"
    device: str = "auto"
    model: ModelGeometry | None = None
    tokens_per_block: int | None = None
    fit: str | None = None
    tiers: tuple[dict, ...] | None = None
    event_capacity: int = 10_000
    cache: CacheSpec | None = None
    prefix_policy: str | None = None  # set: a prefix-caching paged pool (prefix/prefix.py)
    history_bytes: int | None = None  # set: the pool keeps a History of that budget; None: none

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @classmethod
    def parse(
        cls,
        strategy: str = "paged",
        *,
        num_blocks: int | None = None,
        capacity_bytes: int | None = None,
        block_bytes: int | None = None,
        tokens_per_block: int | None = None,
        model: str | ModelGeometry | None = None,
        device: str | None = "auto",
        fit: str | None = None,
        tiers: list[dict] | tuple[dict, ...] | None = None,
        name: str = "pool",
        event_capacity: int = 10_000,
        cache: dict | CacheSpec | None = None,
        prefix_caching: dict | None = None,
        history: bool = False,
        history_bytes: int | None = None,
    ) -> PoolSpec:
        """Size by `num_blocks` or `capacity_bytes`; block size by `block_bytes` or by
        `tokens_per_block` (default 16) with a `model` geometry. `history` True (or a
        `history_bytes` budget): the pool keeps its event history (History, a budget of
        DEFAULT_HISTORY_BYTES unless given); without, none. Raises InvalidRequest."""
        info = STRATEGY_INFO.get(strategy) if isinstance(strategy, str) else None
        if info is None:
            raise InvalidRequest(f"unknown strategy {strategy!r}; choose one of {list(STRATEGIES)}")
        geometry = get_model(model) if isinstance(model, str) else model
        prefix_policy = _prefix_policy(prefix_caching, strategy, tokens_per_block, geometry)
        if prefix_policy is not None and tokens_per_block is None:
            tokens_per_block = DEFAULT_TOKENS_PER_BLOCK
        if block_bytes is None:
            if geometry is None:
                raise InvalidRequest("give 'block_bytes', or 'model' (with optional 'tokens_per_block')")
            if tokens_per_block is None:
                tokens_per_block = DEFAULT_TOKENS_PER_BLOCK
            positive_int(tokens_per_block, "tokens_per_block")
            block_bytes = tokens_per_block * geometry.bytes_per_token
        elif tokens_per_block is not None and geometry is not None:
            if block_bytes != tokens_per_block * geometry.bytes_per_token:
                raise InvalidRequest("block_bytes disagrees with tokens_per_block * bytes_per_token; give one")
        positive_int(block_bytes, "block_bytes")
        if (num_blocks is None) == (capacity_bytes is None):
            raise InvalidRequest("give exactly one of 'num_blocks' or 'capacity_bytes'")
        if capacity_bytes is not None:
            positive_int(capacity_bytes, f"capacity_bytes (at least one block of {block_bytes} bytes)",
                         minimum=block_bytes)
            num_blocks = capacity_bytes // block_bytes
        positive_int(num_blocks, "num_blocks")
        if tokens_per_block is not None:  # also beside block_bytes, where it only labels the pool
            positive_int(tokens_per_block, "tokens_per_block")

        fit = _option(info.options, "fit", fit, default="first", of=strategy)
        if fit is not None and fit not in FITS:
            raise InvalidRequest(f"unknown fit {fit!r}; choose one of {list(FITS)}")
        tiers = _option(info.options, "tiers", tiers, default=None, of=strategy)
        return cls(strategy, num_blocks, block_bytes, name=name,
                   device="auto" if device is None else device, model=geometry,
                   tokens_per_block=tokens_per_block, fit=fit,
                   tiers=tuple(tiers) if isinstance(tiers, (list, tuple)) else tiers, event_capacity=event_capacity,
                   cache=_cache_spec(cache), prefix_policy=prefix_policy,
                   history_bytes=_history_bytes(history, history_bytes))

    def check_caps(self, max_blocks: int, max_bytes: int) -> None:
        """Raises TooLarge when the pool would pass a server's caps (before any memory is taken)."""
        if self.num_blocks > max_blocks:
            raise TooLarge(f"{self.num_blocks} blocks exceeds the cap of {max_blocks}")
        if self.capacity_bytes > max_bytes:
            raise TooLarge(f"{self.capacity_bytes} bytes exceeds the cap of {max_bytes}")

    def pool_class(self) -> type:
        """The strategy's Pool subclass, from its vocabulary entry (`module:Class`); with prefix
        caching, the PrefixPool."""
        if self.prefix_policy is not None:
            return PrefixPool
        module, _, cls = STRATEGY_INFO[self.strategy].impl.partition(":")
        return getattr(importlib.import_module(f"allocator.{module}"), cls)

    def build(self):
        """The pool (and its cache and history, when the spec has them). Raises InvalidRequest."""
        options = {}
        if self.fit is not None:
            options["fit"] = self.fit
        if self.tiers is not None:
            options["tiers"] = list(self.tiers)
        if self.prefix_policy is not None:
            options["policy"] = self.prefix_policy
        pool = self.pool_class()(
            self.num_blocks, self.block_bytes, name=self.name, device=self.device, model=self.model,
            tokens_per_block=self.tokens_per_block, event_capacity=self.event_capacity, **options)
        if self.cache is not None:
            KVCache(pool, self.cache.capacity_bytes, self.cache.policy)
        if self.history_bytes:  # after the cache: the first keyframe holds the cache's figures
            History(pool, self.history_bytes)
        return pool


def _option(takes: tuple[str, ...], what: str, value, default, of: str):
    """A strategy-specific option: kept for the strategy that takes it; for another one the
    default (or nothing) passes and anything else is refused rather than silently ignored."""
    if what in takes:
        return default if value is None else value
    if value is not None and value != default:
        raise InvalidRequest(f"'{what}' applies only to strategy "
                             f"{[s for s, i in STRATEGY_INFO.items() if what in i.options]}, not {of!r}")
    return None


def _prefix_policy(prefix_caching, strategy: str, tokens_per_block, geometry) -> str | None:
    """The eviction policy of a prefix-caching pool, or None without prefix caching."""
    if prefix_caching is None:
        return None
    if strategy != "paged":
        raise InvalidRequest(f"prefix caching needs the paged strategy, not {strategy!r}")
    if not isinstance(prefix_caching, dict) or set(prefix_caching) - {"policy"}:
        raise InvalidRequest('prefix_caching must be an object like {"policy": "lru"}')
    if tokens_per_block is None and geometry is None:
        raise InvalidRequest("prefix caching needs 'tokens_per_block' (or a 'model', 16 by default)")
    policy = prefix_caching.get("policy") or "lru"
    if policy not in PREFIX_POLICIES:
        raise InvalidRequest(f"unknown prefix-cache policy {policy!r}; choose one of {list(PREFIX_POLICIES)}")
    return policy


def _history_bytes(history, history_bytes) -> int | None:
    """The history budget a create asks for (None: no history)."""
    if history.__class__ is not bool:
        raise InvalidRequest(f"'history' must be true or false, not {history!r}")
    if history_bytes is None or history_bytes == 0:
        return DEFAULT_HISTORY_BYTES if history else None
    positive_int(history_bytes, "history_bytes")
    return history_bytes


def _cache_spec(cache: dict | CacheSpec | None) -> CacheSpec | None:
    if cache is None or isinstance(cache, CacheSpec):
        return cache
    if not isinstance(cache, dict):
        raise InvalidRequest("'cache' must be an object {capacity_bytes?, policy?}")
    policy = cache.get("policy") or "lru"
    if policy not in POLICIES:
        raise InvalidRequest(f"unknown policy {policy!r}; choose one of {list(POLICIES)}")
    capacity = cache.get("capacity_bytes")
    if capacity is not None:
        positive_int(capacity, "cache capacity_bytes")
    return CacheSpec(capacity, policy)


__all__ = ["CacheSpec", "PoolSpec"]
