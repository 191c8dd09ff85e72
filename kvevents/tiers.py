"""Storage tiers: where an engine holds a KV block, named the same whatever engine said it.

Engines offload KV blocks from the GPU to other media and say so in their events: vLLM's
`BlockStored` / `BlockRemoved` carry `medium` ("GPU"; "CPU" and "STORAGE" from its offloading
connectors), SGLang's the same field, Dynamo's `RouterEvent` a `storage_tier` (device |
host_pinned | disk | external). The fleet indexes each tier apart (one compiled index per tier
that some engine has used, the GPU's the fleet's own) under the names below. This module is the
one place the names are mapped; the mapping is case-insensitive.

    gpu       vLLM / SGLang "GPU" (or no medium at all), Dynamo "device"
    cpu       vLLM / SGLang "CPU", Dynamo "host_pinned"
    disk      vLLM "STORAGE" (its file-system and object-store tiers), Dynamo "disk"
    external  Dynamo "external"

and the media names Dynamo's relay reads from an engine's events (`StorageTier::from_kv_medium`,
lib/kv-router/src/protocols.rs): "DEVICE"; "CPU_PINNED", "CPU_TIER1"; "CPU_TIER2", "DISK",
"NVME"; "EXTERNAL", "NETWORK", "REMOTE", "SHARED". A medium outside the table is not indexed;
its events are counted in `other_medium`.
"""

from __future__ import annotations

TIERS = ("gpu", "cpu", "disk", "external")  # fastest first: Dynamo's walk order, the page's
PRIMARY = "gpu"
# llm-d's default backend weights (pkg/kvcache/backend.go); a tier not named weighs 1.0, as in
# llm-d's LongestPrefixScorer.
LLMD_WEIGHTS = {"gpu": 1.0, "cpu": 0.8}

_NAMES = {
    "gpu": "gpu", "device": "gpu",
    "cpu": "cpu", "host_pinned": "cpu", "cpu_pinned": "cpu", "cpu_tier1": "cpu",
    "disk": "disk", "storage": "disk", "cpu_tier2": "disk", "nvme": "disk",
    "external": "external", "network": "external", "remote": "external", "shared": "external",
}


def tier_of(medium: str | None) -> str | None:
    """The tier a medium (vLLM's / SGLang's `medium`, Dynamo's `storage_tier`) names; None: a
    medium kvscope does not know (not indexed). No medium at all is the GPU."""
    if medium is None:
        return PRIMARY
    if not isinstance(medium, str) or len(medium) > 32:
        return None
    return _NAMES.get(medium.lower())


def weights_of(weights: dict[str, float] | None) -> dict[str, float]:
    """Per-tier weights from a request (any name `tier_of` maps, e.g. llm-d's "gpu" / "cpu",
    vLLM's "STORAGE", Dynamo's "host_pinned"); None: llm-d's defaults. A tier not given weighs
    1.0, as in llm-d. Raises ValueError naming what to fix: an unknown name, two names of one
    tier, a weight that is not a finite number >= 0."""
    if weights is None:
        return dict(LLMD_WEIGHTS)
    out: dict[str, float] = {}
    given: dict[str, str] = {}
    for name, w in weights.items():
        tier = tier_of(name) if isinstance(name, str) else None
        if tier is None:
            raise ValueError(f"weights: {str(name)[:40]!r} is not a tier; the tiers are "
                             f"{', '.join(TIERS)} (vLLM's and Dynamo's medium names map to them)")
        if tier in given:
            raise ValueError(f"weights: {given[tier]!r} and {name!r} both name tier {tier!r}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float("inf"):
            raise ValueError(f"weights: {name!r} is {w!r}; a weight is a finite number >= 0")
        given[tier] = name
        out[tier] = float(w)
    return out
