"""Every routing policy by name: `make_policy(name, n)`, `policy_names()`, `check_policies`.

The simple routers live in policies.py (with the base classes every policy builds on), the
engines' routers in sglang.py, vllm_kv.py, dynamo.py and llmd.py; this module is the one place
that knows them all, so none of them imports it.
"""

from __future__ import annotations

from allocator import InvalidRequest

from .dynamo import VARIANTS as DYNAMO
from .dynamo import DynamoKv
from .llmd import LlmdPrecise
from .policies import SIMPLE, Policy
from .sglang import VARIANTS as SGLANG
from .sglang import CacheAware
from .vllm_kv import VllmKvAware


def policy_names() -> list[str]:
    """Every policy name `make_policy` accepts, variants included."""
    return [*SIMPLE, *SGLANG, "vllm_kv_aware", *DYNAMO, "llmd_precise", "llmd_precise_minmax"]


def make_policy(name: str, n: int, seed: int = 0, temperature: float = 0.0) -> Policy:
    """The policy called `name` for `n` replicas (`temperature`: Dynamo's softmax temperature).
    Raises InvalidRequest naming the choices."""
    if name in SIMPLE:
        return SIMPLE[name](n, seed)
    if name in SGLANG:
        return CacheAware(n, seed, name=name, **SGLANG[name])
    if name == VllmKvAware.name:
        return VllmKvAware(n, seed)
    if name in DYNAMO:
        return DynamoKv(n, seed, temperature=temperature, **DYNAMO[name])
    if name in ("llmd_precise", "llmd_precise_minmax"):
        return LlmdPrecise(n, seed, minmax=name == "llmd_precise_minmax")
    raise InvalidRequest(f"unknown policy {name!r}; choose from {', '.join(policy_names())}")


def check_policies(names: list[str]) -> list[str]:
    """The names, deduplicated in order. Raises InvalidRequest for an unknown one or none."""
    known = policy_names()
    out = list(dict.fromkeys(names))
    bad = [p for p in out if p not in known]
    if bad or not out:
        raise InvalidRequest(f"unknown policy {', '.join(map(repr, bad)) or '(none given)'}; "
                             f"choose from {', '.join(known)}")
    return out
