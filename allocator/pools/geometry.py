"""Model geometry: how many bytes one token's keys and values take, and model presets."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest, positive_int

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """KV layout of one model: bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * dtype."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "fp16"
    max_tokens: int = 8192

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "layers": self.layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "max_tokens": self.max_tokens,
            "bytes_per_token": self.bytes_per_token,
        }


MODEL_PRESETS: dict[str, ModelGeometry] = {
    # 32 layers * 8 KV heads * 128 dims * 2 (K,V) * 2 bytes = 128 KiB per token.
    "llama-3-8b": ModelGeometry("llama-3-8b", 32, 8, 128, "fp16", 8192),
    "llama-3-70b": ModelGeometry("llama-3-70b", 80, 8, 128, "fp16", 8192),
    "mistral-7b": ModelGeometry("mistral-7b", 32, 8, 128, "fp16", 32768),
    "qwen2-7b": ModelGeometry("qwen2-7b", 28, 4, 128, "bf16", 32768),
    "opt-13b": ModelGeometry("opt-13b", 40, 40, 128, "fp16", 2048),
    # A toy geometry so that token-sized demo pools stay small on a CPU: 64 bytes per token.
    "tiny": ModelGeometry("tiny", 2, 2, 4, "fp16", 16384),
}


def get_model(name: str) -> ModelGeometry:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown model {name!r}; choose one of {sorted(MODEL_PRESETS)}"
        ) from None


def size_in_bytes(nbytes: int | None, tokens: int | None, bytes_per_token: int | None) -> int:
    """Resolve a request given in bytes or in tokens to bytes. Raises InvalidRequest."""
    if (nbytes is None) == (tokens is None):
        raise InvalidRequest("give exactly one of 'bytes' or 'tokens'")
    if tokens is not None:
        if not bytes_per_token:
            raise InvalidRequest("this pool has no model geometry; give 'bytes' instead of 'tokens'")
        nbytes = positive_int(tokens, "'tokens'") * bytes_per_token
    return positive_int(nbytes, "'bytes'")
