"""Stub of vllm.v1.core.kv_cache_utils: the hash type of published events (as in vLLM 0.33)."""

from typing import TypeAlias

ExternalBlockHash: TypeAlias = bytes | int
