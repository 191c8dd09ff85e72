"""Torch-free stand-ins for the vLLM modules that block_pool.py, kv_cache_utils.py and
kv_cache_metrics.py import, so the real files of the vLLM wheel run without vLLM installed.

Each stub binds only the names those imports ask for; none of them is called on the paths the
benches measure (events and metrics are off, requests carry precomputed hashes), and the ones
that could be (the event classes, KVCacheEvictionEvent) are plain containers.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass, field
from typing import Any


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__kvscope_stub__ = True
    if "." not in name or name.count(".") < 3:
        mod.__path__ = []  # a package, so its submodules import
    return mod


@dataclass
class _Event:
    """BlockStored / BlockRemoved / AllBlocksCleared / KVCacheEvent: a record of fields."""

    block_hashes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.block_hashes = kw.get("block_hashes", [])
        self.extra = kw


class _Spec:
    """Stand-in for the KV-cache spec classes (only used by functions the benches never call)."""


def _unavailable(*args: Any, **kw: Any):
    raise NotImplementedError("stubbed out of vLLM for kvscope's bench")


def install() -> None:
    """Register the stubs in sys.modules (idempotent)."""
    if "vllm" in sys.modules:
        return
    envs = _module("vllm.envs", VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True)
    mods = [
        _module("vllm", envs=envs),
        envs,
        _module("vllm.config", VllmConfig=_Spec),
        _module("vllm.logger", init_logger=logging.getLogger),
        _module("vllm.distributed"),
        _module("vllm.distributed.kv_events", MEDIUM_GPU="GPU", AllBlocksCleared=_Event,
                BlockRemoved=_Event, BlockStored=_Event, KVCacheEvent=_Event),
        _module("vllm.multimodal"),
        _module("vllm.multimodal.utils", get_mm_features_in_window=_unavailable),
        _module("vllm.utils"),
        _module("vllm.utils.hashing", xxhash=_unavailable, xxhash_cbor=_unavailable),
        _module("vllm.v1"),
        _module("vllm.v1.core"),
        _module("vllm.v1.kv_cache_interface", KVCacheConfig=_Spec, KVCacheGroupSpec=_Spec,
                KVCacheSpec=_Spec, MambaSpec=_Spec, UniformTypeKVCacheSpecs=_Spec,
                iter_layer_specs=_unavailable),
        _module("vllm.v1.kv_cache_spec_registry", KVCacheSpecRegistry=_Spec),
        _module("vllm.v1.request", Request=_Spec),
        _module("vllm.v1.utils", tensor_data=_unavailable),
        _module("vllm.v1.metrics"),
        _module("vllm.v1.metrics.stats", KVCacheEvictionEvent=_Event),
    ]
    for mod in mods:
        sys.modules[mod.__name__] = mod
