"""Server settings, read once from the environment (`KVSCOPE_*`) behind `get_settings()`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache

from allocator import resolve_device
from allocator.errors import InvalidRequest

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


# The devices a pool may name (a create request, KVSCOPE_DEVICE, `serve --device`).
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]{1,2})?)$"


class SettingsError(ValueError):
    """An environment variable that cannot be read; the message names it."""


def _env_int(name: str, default: int, low: int = 0, high: int | None = None) -> int:
    """`name` as an int in [low, high], or `default` when unset. Raises SettingsError."""
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise SettingsError(f"{name} must be {bound}, got {value}")
    return value


def check_device(device: str, source: str) -> str:
    """`device` when it is well formed and this host has it. Raises SettingsError naming
    `source` (the variable or flag it came from)."""
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise SettingsError(f"{source} must be auto, cpu, cuda or cuda:N, got {device!r}")
    try:
        resolve_device(device)
    except InvalidRequest as exc:
        raise SettingsError(f"{source}: {exc}") from None
    return device


@dataclass(slots=True)
class Settings:
    """What the server needs to start. Caps bound what one request may ask for.

    `default_blocks` = 0 means "pick for the device": modest on a CPU, larger on a GPU.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    token: str | None = None
    default_blocks: int = 0
    default_block_bytes: int = 4 * KIB
    max_pool_bytes: int = 2 * GIB
    max_blocks: int = 4_194_304
    max_pools: int = 32
    max_batch: int = 10_000
    max_body: int = 16 * MIB
    stream_interval_s: float = 0.05
    recordings_dir: str = "recordings"  # where POST .../recording writes its .kvrec files
    history_bytes: int = 64 * MIB  # each pool's in-memory history budget (0: no history)
    open_recordings: tuple[str, ...] = ()  # recording files served read-only (kvscope open)

    @classmethod
    def from_env(cls) -> Settings:
        """Raises SettingsError naming the first variable that is not a valid number."""
        return cls(
            host=os.environ.get("KVSCOPE_HOST", "127.0.0.1"),
            port=_env_int("KVSCOPE_PORT", 8000, 0, 65535),
            device=os.environ.get("KVSCOPE_DEVICE", "auto") or "auto",
            token=os.environ.get("KVSCOPE_TOKEN") or None,
            default_blocks=_env_int("KVSCOPE_DEFAULT_BLOCKS", 0),
            default_block_bytes=_env_int("KVSCOPE_DEFAULT_BLOCK_BYTES", 4 * KIB, 1),
            max_pool_bytes=_env_int("KVSCOPE_MAX_POOL_BYTES", 2 * GIB),
            max_blocks=_env_int("KVSCOPE_MAX_BLOCKS", 4_194_304),
            max_pools=_env_int("KVSCOPE_MAX_POOLS", 32, 1),  # the default pool needs one
            max_batch=_env_int("KVSCOPE_MAX_BATCH", 10_000),
            max_body=_env_int("KVSCOPE_MAX_BODY", 16 * MIB),
            recordings_dir=os.environ.get("KVSCOPE_RECORDINGS_DIR") or "recordings",
            history_bytes=_env_int("KVSCOPE_HISTORY_BYTES", 64 * MIB),
        )

    def check_default_pool(self) -> None:
        """Raises SettingsError when the `default` pool made at startup would break the caps."""
        blocks = self.default_pool_blocks(str(resolve_device(self.device)))
        if blocks > self.max_blocks:
            raise SettingsError(f"the default pool's {blocks} blocks exceed KVSCOPE_MAX_BLOCKS={self.max_blocks}"
                                " (set KVSCOPE_DEFAULT_BLOCKS)")
        if blocks * self.default_block_bytes > self.max_pool_bytes:
            raise SettingsError(f"the default pool's {blocks} x {self.default_block_bytes} bytes exceed "
                                f"KVSCOPE_MAX_POOL_BYTES={self.max_pool_bytes} "
                                "(set KVSCOPE_DEFAULT_BLOCKS or KVSCOPE_DEFAULT_BLOCK_BYTES)")

    def default_pool_blocks(self, device: str) -> int:
        """Blocks of the `default` pool: 4,096 x 4 KiB (16 MiB) on a CPU, 65,536 on a GPU."""
        if self.default_blocks > 0:
            return self.default_blocks
        return 65_536 if device.startswith("cuda") else 4_096


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_env()
