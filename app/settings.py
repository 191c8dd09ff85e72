"""Server settings, read once from the environment (`KVSCOPE_*`) behind `get_settings()`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache

from allocator import resolve_device
from allocator.errors import InvalidRequest
from kvevents.nats_source import NatsAuth

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


def _env_list(name: str) -> tuple[str, ...] | None:
    """A comma-separated variable as a tuple of lowercase items, or None when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    return tuple(item.strip().lower().rstrip("/") for item in raw.split(",") if item.strip())


def _nats_auth() -> NatsAuth | None:
    try:
        return NatsAuth.from_env()
    except ValueError as exc:
        raise SettingsError(f"KVSCOPE_NATS_*: {exc}") from None


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
    # A recording file uploaded from the page (POST /api/recordings/upload), the one body
    # allowed past max_body: a pool's history is tens of MiB (64 MiB budget by default).
    max_upload: int = 256 * MIB
    stream_interval_s: float = 0.05
    # Security (app/http/security.py): hosts and origins besides the server's own; "*" allows any.
    # None means "derive from `host`": loopback names, plus any name when listening on all
    # interfaces (a token is then generated unless one is set; app/cli/serve.py).
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    # Sum of all pools' bytes; 0 = a fraction of the default device's memory (total_pool_cap).
    max_total_bytes: int = 0
    # Stream clients (app/stream.py): per pool, over all pools, and how long a client's socket
    # may stay unwritable before it is dropped.
    max_stream_clients: int = 64
    max_stream_clients_per_pool: int = 16
    stream_stall_s: float = 5.0
    head_timeout_s: float = 10.0  # a connection must send a complete request head this soon
    recordings_dir: str = "recordings"  # where POST .../recording writes its .kvrec files, and uploads go
    history_bytes: int = 64 * MIB  # each pool's in-memory history budget (0: no history)
    open_recordings: tuple[str, ...] = ()  # recording files served read-only (kvscope open)
    # NATS credentials for fleets following Dynamo over NATS (KVSCOPE_NATS_*; never echoed)
    nats_auth: NatsAuth | None = None

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
            max_upload=_env_int("KVSCOPE_MAX_UPLOAD", 256 * MIB),
            allowed_hosts=_env_list("KVSCOPE_ALLOWED_HOSTS"),
            allowed_origins=_env_list("KVSCOPE_ALLOWED_ORIGINS") or (),
            max_total_bytes=_env_int("KVSCOPE_MAX_TOTAL_BYTES", 0),
            max_stream_clients=_env_int("KVSCOPE_MAX_STREAM_CLIENTS", 64, 1),
            max_stream_clients_per_pool=_env_int("KVSCOPE_MAX_STREAM_CLIENTS_PER_POOL", 16, 1),
            stream_stall_s=_env_int("KVSCOPE_STREAM_STALL_MS", 5000, 100) / 1000,
            head_timeout_s=_env_int("KVSCOPE_HEAD_TIMEOUT_MS", 10_000, 100) / 1000,
            recordings_dir=os.environ.get("KVSCOPE_RECORDINGS_DIR") or "recordings",
            history_bytes=_env_int("KVSCOPE_HISTORY_BYTES", 64 * MIB),
            nats_auth=_nats_auth(),
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
        total = total_pool_cap(self)
        if blocks * self.default_block_bytes > total:
            raise SettingsError(f"the default pool's {blocks} x {self.default_block_bytes} bytes exceed the "
                                f"server's total of {total} bytes (KVSCOPE_MAX_TOTAL_BYTES)")

    def default_pool_blocks(self, device: str) -> int:
        """Blocks of the `default` pool: 4,096 x 4 KiB (16 MiB) on a CPU, 65,536 on a GPU."""
        if self.default_blocks > 0:
            return self.default_blocks
        return 65_536 if device.startswith("cuda") else 4_096


# Share of the device's memory (system RAM for a CPU) all pools together may take by default.
TOTAL_POOL_SHARE = 0.5


def device_memory_bytes(device: str) -> int:
    """Total memory of `device` ("cpu": system RAM; "cuda:N": that GPU's memory)."""
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        return int(torch.cuda.get_device_properties(index).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def total_pool_cap(settings: Settings) -> int:
    """Bytes all pools together may hold: KVSCOPE_MAX_TOTAL_BYTES, else TOTAL_POOL_SHARE of the
    default device's memory."""
    if settings.max_total_bytes > 0:
        return settings.max_total_bytes
    return int(device_memory_bytes(str(resolve_device(settings.device))) * TOTAL_POOL_SHARE)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_env()
