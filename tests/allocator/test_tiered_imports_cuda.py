"""Tiered pools return blocks to their own tier; the core never imports a web framework; CUDA."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from support.kvtest_util import payload

from allocator import OutOfMemory, TieredPool, create_pool

ALLOCATOR = Path(__file__).resolve().parents[2] / "allocator"
FORBIDDEN = {"fastapi", "starlette", "pydantic", "uvicorn"}


def free_per_tier(pool) -> dict[str, int]:
    return {t["name"]: t["free_blocks"] for t in pool.stats()["tiers"]}


def test_each_block_returns_to_its_own_tier() -> None:
    # 128 units of 16 bytes: small 32 x 16 B, medium 8 x 64 B, large 4 x 256 B.
    pool = create_pool("tiered", num_blocks=128, block_bytes=16, device="cpu")
    full = free_per_tier(pool)
    assert full == {"small": 32, "medium": 8, "large": 4}
    for _ in range(3):  # the seed returned every block to the small pool: this would drift
        ids = [pool.allocate(n) for n in (10, 40, 64, 200, 600)]
        assert [pool.allocation(a).tier for a in ids] == ["small", "medium", "medium", "large", "large"]
        assert pool.allocation(ids[-1]).allocated_bytes == 3 * 256  # several large blocks
        assert free_per_tier(pool) == {"small": 31, "medium": 6, "large": 0}
        for a in ids:
            pool.free(a)
        assert free_per_tier(pool) == full
        assert pool.check() == []


def test_exhausted_tier_falls_back_to_a_larger_one() -> None:
    pool = create_pool("tiered", num_blocks=128, block_bytes=16, device="cpu")
    small = [pool.allocate(16) for _ in range(32)]
    spill = pool.allocate(16)
    assert pool.allocation(spill).tier == "medium"
    assert pool.allocation(spill).allocated_bytes == 64
    pool.write(spill, payload(16, 3))
    pool.free(small[0])
    assert pool.allocation(pool.allocate(16)).tier == "small"
    assert pool.read(spill) == payload(16, 3)
    assert pool.check() == []

    strict = TieredPool(128, 16, fallback=False, device="cpu")
    for _ in range(32):
        strict.allocate(16)
    with pytest.raises(OutOfMemory) as err:
        strict.allocate(16)
    assert err.value.cause == "fragmentation"  # memory is free, in the wrong tier
    assert strict.stats()["ooms"]["fragmentation"] == 1


def test_allocator_never_imports_a_web_framework() -> None:
    files = sorted(ALLOCATOR.glob("**/*.py"))
    assert files, "allocator/ not found"
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
                names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant)]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="hardware: needs a CUDA device, none is visible")
@pytest.mark.parametrize("strategy", ["paged", "tiered", "contiguous"])
def test_cuda_pool_write_read_defragment_round_trip(strategy: str) -> None:
    pool = create_pool(strategy, num_blocks=256, block_bytes=4096, device="cuda")
    assert pool.storage.data.is_cuda
    ids = [pool.allocate(n) for n in (5000, 70_000, 4096, 12_345, 100_000, 9000)]
    for i, a in enumerate(ids):
        pool.write(a, payload(pool.allocation(a).requested_bytes, i))
    for a in ids[::2]:
        pool.free(a)
    report = pool.defragment()
    assert report.moved_blocks > 0
    for i, a in enumerate(ids):
        if a in pool:
            assert pool.read(a) == payload(pool.allocation(a).requested_bytes, i)
    assert pool.check() == []
