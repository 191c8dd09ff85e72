"""Every routing policy by name: `make_policy(name, n)`, `policy_names()`, `check_policies`.

The simple routers live in policies.py (with the base classes every policy builds on), the
engines' routers in sglang.py, vllm_kv.py, dynamo.py and llmd.py; this module is the one place
that knows them all, so none of them imports it. The names are the vocabulary's
(allocator/vocab.py `ROUTING_POLICIES`, which the request schemas take theirs from): `BUILDERS`
has one entry per name there, in the same order (tests/workloads/test_routing_policies.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from allocator import InvalidRequest
from allocator.vocab import ROUTING_POLICIES

from .dynamo import VARIANTS as DYNAMO
from .dynamo import DynamoKv
from .llmd import LlmdPrecise
from .policies import SIMPLE, Policy
from .sglang import VARIANTS as SGLANG
from .sglang import CacheAware
from .vllm_kv import VllmKvAware


def _simple(cls: type[Policy], n: int, seed: int, temperature: float) -> Policy:
    return cls(n, seed)


def _sglang(name: str, n: int, seed: int, temperature: float) -> Policy:
    return CacheAware(n, seed, name=name, **SGLANG[name])


def _vllm_kv(n: int, seed: int, temperature: float) -> Policy:
    return VllmKvAware(n, seed)


def _dynamo(name: str, n: int, seed: int, temperature: float) -> Policy:
    return DynamoKv(n, seed, temperature=temperature, **DYNAMO[name])


def _llmd(minmax: bool, n: int, seed: int, temperature: float) -> Policy:
    return LlmdPrecise(n, seed, minmax=minmax)


# name -> build(n, seed, temperature)
BUILDERS: dict[str, Callable[[int, int, float], Policy]] = {
    **{name: partial(_simple, cls) for name, cls in SIMPLE.items()},
    **{name: partial(_sglang, name) for name in SGLANG},
    VllmKvAware.name: _vllm_kv,
    **{name: partial(_dynamo, name) for name in DYNAMO},
    "llmd_precise": partial(_llmd, False),
    "llmd_precise_minmax": partial(_llmd, True),
}


def policy_names() -> list[str]:
    """Every policy name `make_policy` accepts, variants included (the vocabulary's)."""
    return list(ROUTING_POLICIES)


def make_policy(name: str, n: int, seed: int = 0, temperature: float = 0.0) -> Policy:
    """The policy called `name` for `n` replicas (`temperature`: Dynamo's softmax temperature).
    Raises InvalidRequest naming the choices."""
    build = BUILDERS.get(name)
    if build is None:
        raise InvalidRequest(f"unknown policy {name!r}; choose from {', '.join(policy_names())}")
    return build(n, seed, temperature)


def check_policies(names: list[str]) -> list[str]:
    """The names, deduplicated in order. Raises InvalidRequest for an unknown one or none."""
    known = policy_names()
    out = list(dict.fromkeys(names))
    bad = [p for p in out if p not in known]
    if bad or not out:
        raise InvalidRequest(f"unknown policy {', '.join(map(repr, bad)) or '(none given)'}; "
                             f"choose from {', '.join(known)}")
    return out
