"""vLLM 0.33.0's BlockPool, run from its PyPI wheel in this process, for same-run comparisons.

`load()` returns the real `vllm.v1.core.block_pool` module (with `kv_cache_utils`,
`kv_cache_metrics` and `vllm/utils/math_utils.py` from the same wheel) or None when the wheel is
not available. Only those four files are executed; what they import from the rest of vLLM
(config, logger, multimodal, kv_events, request, metrics, hashing) is replaced by the small
torch-free stubs in `bench/vllm_stubs.py`, which define only the names those imports bind. The
code under measurement is vLLM's own, unmodified.

The wheel is looked for in $KVSCOPE_WHEEL_CACHE or ~/.cache/kvscope/wheels, else downloaded
there with `pip download --no-deps vllm==0.33.0`; without network it is skipped with a message.

Drivers (`VllmDriver`) use the pool as vLLM's KV-cache manager does: `get_new_blocks(n)` for a
request, `free_blocks` of its blocks in reverse order (tail first, so the tail is evicted
first), and with prefix caching on, `cache_full_blocks` with precomputed block hashes so that
every later allocation of a cached block evicts its hash. Other benches import this module.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from bench import vllm_stubs

VERSION = "0.33.0"
WHEEL_GLOB = f"vllm-{VERSION}-*.whl"
FILES = {
    "vllm.utils.math_utils": "vllm/utils/math_utils.py",
    "vllm.v1.core.kv_cache_metrics": "vllm/v1/core/kv_cache_metrics.py",
    "vllm.v1.core.kv_cache_utils": "vllm/v1/core/kv_cache_utils.py",
    "vllm.v1.core.block_pool": "vllm/v1/core/block_pool.py",
}

_loaded: dict[str, object] = {}
why_missing = ""


def wheel_dir() -> Path:
    return Path(os.environ.get("KVSCOPE_WHEEL_CACHE", Path.home() / ".cache" / "kvscope" / "wheels"))


def find_wheel(download: bool = True) -> Path | None:
    """The cached vLLM wheel, downloading it once if allowed and possible."""
    global why_missing
    folder = wheel_dir()
    found = sorted(folder.glob(WHEEL_GLOB))
    if found:
        return found[0]
    if download:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
               f"vllm=={VERSION}"]
        try:
            subprocess.run(cmd, check=True, timeout=600, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            why_missing = f"vllm=={VERSION} wheel not in {folder} and `pip download` failed ({exc})"
            return None
        found = sorted(folder.glob(WHEEL_GLOB))
    if not found:
        why_missing = f"vllm=={VERSION} wheel not found in {folder}"
    return found[0] if found else None


def extract(wheel: Path) -> Path:
    """The four source files, extracted once next to the wheel."""
    root = wheel.parent / f"vllm-{VERSION}-src"
    if not all((root / rel).exists() for rel in FILES.values()):
        with zipfile.ZipFile(wheel) as zf:
            for rel in FILES.values():
                zf.extract(rel, root)
    return root


def load(download: bool = True):
    """vLLM's block_pool module (real code, stubbed imports), or None (see `why_missing`)."""
    if "block_pool" in _loaded:
        return _loaded["block_pool"]
    wheel = find_wheel(download)
    if wheel is None:
        return None
    root = extract(wheel)
    if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "__kvscope_stub__", False):
        raise RuntimeError("a real vllm is imported in this process; run the bench without it")
    vllm_stubs.install()
    for name, rel in FILES.items():
        spec = importlib.util.spec_from_file_location(name, root / rel)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    _loaded["block_pool"] = sys.modules["vllm.v1.core.block_pool"]
    _loaded["kv_cache_utils"] = sys.modules["vllm.v1.core.kv_cache_utils"]
    return _loaded["block_pool"]


class HashedRequest:
    """What `cache_full_blocks` reads of a vLLM Request (events off): its block hashes."""

    __slots__ = ("block_hashes",)

    def __init__(self, block_hashes: list[bytes]) -> None:
        self.block_hashes = block_hashes


class VllmDriver:
    """A vLLM BlockPool driven like vLLM's KV-cache manager: allocate = get_new_blocks(n) (plus
    cache_full_blocks with precomputed hashes when caching), free = free_blocks(reversed)."""

    def __init__(self, num_blocks: int, caching: bool = False, block_size: int = 16) -> None:
        bp = load()
        if bp is None:
            raise RuntimeError(why_missing)
        # +1: vLLM reserves block 0 as its null block.
        self.pool = bp.BlockPool(num_blocks + 1, enable_caching=caching, hash_block_size=block_size)
        self.block_size = block_size
        self.caching = caching
        self._next_hash = 0

    def hashes(self, n: int) -> HashedRequest:
        """A request whose n full blocks have fresh (never seen) 32-byte hashes."""
        start = self._next_hash
        self._next_hash += n
        return HashedRequest([i.to_bytes(32, "little") for i in range(start, start + n)])

    def allocate(self, n: int, request: HashedRequest | None = None) -> list:
        blocks = self.pool.get_new_blocks(n)
        if request is not None:
            self.pool.cache_full_blocks(request, blocks, 0, n, self.block_size, 0)
        return blocks

    def free(self, blocks: list) -> None:
        self.pool.free_blocks(reversed(blocks))
