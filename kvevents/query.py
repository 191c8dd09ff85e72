"""The answers the routers' indexers give, over a Fleet: Dynamo's standalone indexer
(`python -m dynamo.indexer`) and llm-d's kv-cache indexer (`GetPodScores`).

Dynamo (ai-dynamo 1.x, `lib/kv-router/src/services/indexer/server.rs`, checked against the
1.6.1 wheel): one indexer per (model_name, routing_group); `/query` hashes the token ids at the
indexer's block size and answers

    {"scores": {instance: {dp_rank: tokens}}, "frequencies": [],
     "instances": {instance: {"longest_matched", "gpu", "dp": {dp_rank: tokens}, "cpu", "disk"}}}

in matched tokens (blocks x block size). `scores` is the device tier's match, only for the
workers that match a block there; `instances` also counts the lower tiers (Dynamo's
`lib/kv-router/src/indexer/lower_tier_indexers.rs` and `services/overlap.rs`): a worker's match
goes on in its host-pinned (kvscope's `cpu`) blocks from where its device match ended, then in
its disk and external ones, and `cpu` / `disk` are cumulative through the tiers above them
(Mooncake's indexer RFC, kvcache-ai/Mooncake #1403); a worker that matched nothing above a tier
starts there at block 0 when it holds the first block. A fleet is one routing group
("default"); an engine answers for the model it serves and, when the fleet does not know its
model, for any.

llm-d (`pkg/kvcache/kvblock_scorer.go`, LongestPrefixScorer): per pod, the longest run of the
prompt's blocks from block 0 that the pod holds on any tier, each block weighted by the best
tier it holds it in (`gpu` 1.0, `cpu` 0.8 by default, a tier not named 1.0); every pod that
holds block 0 is in the answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from allocator.errors import InvalidRequest, NotFound, TooLarge

from . import tiers
from .tiers import weights_of

DEFAULT_GROUP = "default"
DEFAULT_MODEL = "default"  # the partition of engines whose model the fleet does not know
LLMD_WEIGHTS = tiers.LLMD_WEIGHTS
MAX_DUMP_BLOCKS = 1 << 18  # (engine, block) pairs one /dump lists


# -- Dynamo's standalone indexer ---------------------------------------------------------------------
def partition(ids: dict, model_name: str, routing_group: str = DEFAULT_GROUP) -> list[str]:
    """The engines (of `Fleet.identities()`) answering for (model_name, routing_group), as
    Dynamo's indexer of that pair: those serving `model_name`, and those whose model the fleet
    does not know. Raises NotFound (as Dynamo's 404 "no indexer for model=... routing_group=...")."""
    names = [n for n, (_w, _r, model) in ids.items() if model in (None, model_name)]
    if routing_group != DEFAULT_GROUP or not names:
        raise NotFound("indexer", f"model={model_name} routing_group={routing_group}")
    return names


def dynamo_answer(blocks: dict[str, int], names: Iterable[str], ids: dict, sizes: dict,
                  lower: dict[str, dict[str, int]] | None = None) -> dict:
    """Dynamo's ScoreResponse from each engine's matched device blocks (`scores`: tokens per
    instance and rank) and the blocks its match went on with in the tiers below (`lower`, as
    `Fleet.match_tiered` gives them: `instances`' cumulative `cpu` and `disk`)."""
    lower = lower or {}
    host, disk, ext = lower.get("cpu", {}), lower.get("disk", {}), lower.get("external", {})
    scores: dict[str, dict[str, int]] = {}
    instances: dict[str, dict] = {}
    for name in names:
        n = blocks.get(name, 0)
        bs = sizes.get(name) or 0
        cpu = n + host.get(name, 0)
        low = cpu + disk.get(name, 0) + ext.get(name, 0)
        if low <= 0 or not bs:
            continue
        worker, rank, _model = ids[name]
        inst, dp = str(worker), str(rank)
        if n > 0:
            scores.setdefault(inst, {})[dp] = max(n * bs, scores.get(inst, {}).get(dp, 0))
        s = instances.setdefault(inst, {"longest_matched": 0, "gpu": 0, "dp": {}, "cpu": 0, "disk": 0})
        s["dp"][dp] = max(n * bs, s["dp"].get(dp, 0))
        s["gpu"] = max(s["gpu"], n * bs)
        s["cpu"] = max(s["cpu"], cpu * bs)
        s["disk"] = max(s["disk"], low * bs)
        s["longest_matched"] = max(s["gpu"], s["cpu"], s["disk"])
    return {"scores": scores, "frequencies": [], "instances": instances}


def dynamo_query(fleet, token_ids: list[int], model_name: str, routing_group: str = DEFAULT_GROUP,
                 lora_name: str | None = None) -> dict:
    """`POST /query`: the prompt matched on every engine of the partition. Call where changes
    run. Raises NotFound (no such partition) or InvalidRequest (a LoRA by name on engines that
    index LoRAs by id)."""
    ids = fleet.identities()
    names = partition(ids, model_name, routing_group)
    sizes = fleet.block_sizes()
    keyed = fleet.hash_keyed()
    if lora_name:
        by_id = sorted(n for n in names if n not in keyed)
        if by_id:
            raise InvalidRequest(
                f"lora_name: engines {by_id[:8]} index a LoRA's blocks by its lora_id (vLLM's wire), "
                "not by name; ask POST /api/fleets/{fleet}/match with lora_id for them")
    if not any(sizes.get(n) for n in names):
        raise InvalidRequest("no engine's block size is known yet (none has stored a block, and "
                             "none was given 'block_size'): the prompt cannot be cut into blocks")
    blocks, lower = fleet.match_tiered(token_ids, None, lora_name)
    return dynamo_answer(blocks, names, ids, sizes, lower)


def dynamo_query_by_hash(fleet, block_hashes: list[int], model_name: str,
                         routing_group: str = DEFAULT_GROUP) -> dict:
    """`POST /query_by_hash`: a chain of Dynamo's block hashes (tokens_hash) matched on the
    partition's engines keyed by them. Raises NotFound, or InvalidRequest when none of them is
    (engines keyed by token ids know their blocks by tokens, not by Dynamo's hash of them)."""
    ids = fleet.identities()
    names = partition(ids, model_name, routing_group)
    keyed = fleet.hash_keyed()
    if not any(n in keyed for n in names):
        raise InvalidRequest(
            "query_by_hash: no engine here is keyed by Dynamo's tokens_hash (wire 'dynamo'); "
            f"engines {sorted(names)[:8]} are keyed by their token ids: POST .../dynamo/query "
            "with token_ids instead")
    blocks, lower = fleet.match_tiered_hashes(block_hashes)
    return dynamo_answer(blocks, [n for n in names if n in keyed], ids, fleet.block_sizes(), lower)


# Dynamo's ListenerStatus from an engine's stream state.
LISTENER_STATUS = {"live": "active", "connected": "active", "connecting": "pending",
                   "unreachable": "pending", "disconnected": "pending", "refused": "failed",
                   "recorded": "paused"}
STATUS_ORDER = ("failed", "pending", "active", "paused")  # Dynamo's aggregate: the first present


def dynamo_workers(fleet, model_name: str | None = None, routing_group: str | None = None) -> list[dict]:
    """`GET /workers`: one entry per instance, its DP ranks' endpoints and listeners (status
    aggregated as Dynamo does: failed > pending > active > paused). Call where changes run."""
    if routing_group not in (None, DEFAULT_GROUP):
        return []
    ids = fleet.identities()
    out: dict[str, dict] = {}
    for row in fleet.engines():
        worker, rank, model = ids[row["name"]]
        if model_name is not None and model not in (None, model_name):
            continue
        w = out.get(str(worker))
        if w is None:
            w = out[str(worker)] = {
                "instance_id": worker, "source": "nats" if str(row["endpoint"] or "").startswith(
                    ("nats://", "tls://")) else "zmq", "status": "paused",
                "model_name": model or DEFAULT_MODEL, "routing_group": DEFAULT_GROUP,
                "block_size": row["block_size"] or row["configured_block_size"],
                "endpoints": {}, "listeners": {}}
        state = row["stream"].get("state", "recorded")
        listener = {"endpoint": row["endpoint"], "status": LISTENER_STATUS.get(state, "pending")}
        if row["stream"].get("last_error") and listener["status"] != "active":
            listener["last_error"] = row["stream"]["last_error"]
        if row["endpoint"]:
            w["endpoints"][str(rank)] = row["endpoint"]
        w["listeners"][str(rank)] = listener
        statuses = {x["status"] for x in w["listeners"].values()}
        w["status"] = next(s for s in STATUS_ORDER if s in statuses)
    return list(out.values())


def dump_snapshot(fleet) -> tuple:
    """What `dump_json` needs, copied where changes run: per partition its engines, their
    identities, block sizes and what they hold. Raises TooLarge past MAX_DUMP_BLOCKS."""
    ids = fleet.identities()
    names = list(ids)
    held = fleet.held_blocks(names)
    if held > MAX_DUMP_BLOCKS:
        raise TooLarge(f"the fleet holds {held:,} blocks across its engines; /dump lists at most "
                       f"{MAX_DUMP_BLOCKS:,} (GET /api/fleets/{{fleet}}/blocks maps any number)")
    tables, parents = fleet.held_tables(names)
    return ids, fleet.block_sizes(), tables, parents


def dump_json(job: tuple) -> dict:
    """`GET /dump`: {"model:routing_group": {"block_size", "events": [RouterEvent]}}, each
    engine's blocks as stored events in chains, every parent before its children (blocks whose
    parents form a cycle last). `block_hash` and `parent_hash` are the engine's own hashes;
    `tokens_hash` is the index's content key of the block (it keeps keys, not the tokens or
    Dynamo's hashes of them): who holds which chain is exact, the content hashes are kvscope's."""
    ids, sizes, tables, parents = job
    out: dict[str, dict] = {}
    for name, table in tables.items():
        worker, rank, model = ids[name]
        part = out.setdefault(f"{model or DEFAULT_MODEL}:{DEFAULT_GROUP}",
                              {"block_size": sizes.get(name), "events": []})
        if part["block_size"] is None:
            part["block_size"] = sizes.get(name)
        for chain, parent in _chains(table, parents):
            part["events"].append({
                "worker_id": worker, "storage_tier": "device", "residency_domain": "worker",
                "event": {"event_id": 0, "dp_rank": rank, "data": {"stored": {
                    "parent_hash": parent, "start_position": None,
                    "blocks": [{"block_hash": h, "tokens_hash": table[h], "mm_extra_info": None}
                               for h in chain]}}}})
    return out


def _chains(table: dict[int, int], parents: dict[int, int]) -> list[tuple[list[int], int | None]]:
    """One engine's blocks (hash -> key) as (chain of hashes, parent hash) runs, depth first:
    a run goes on through a block's first child; its other children start runs of their own."""
    hash_of = {k: h for h, k in table.items()}
    kids: dict[int, list[int]] = {}
    roots = []
    for h, k in table.items():
        ph = hash_of.get(parents.get(k, 0))
        if ph is None or ph == h:
            roots.append(h)
        else:
            kids.setdefault(ph, []).append(h)
    out, seen = [], set()
    stack = [(h, None) for h in reversed(roots)]
    while stack:
        h, parent = stack.pop()
        chain = []
        while h is not None and h not in seen:
            seen.add(h)
            chain.append(h)
            more = kids.get(h, ())
            stack.extend((c, h) for c in reversed(more[1:]))
            h = more[0] if more else None
        if chain:
            out.append((chain, parent))
    for h in table:  # parents in a cycle: never reached from a root
        if h not in seen:
            seen.add(h)
            out.append(([h], None))
    return out


def dump_bytes(job: tuple) -> bytes:
    return json.dumps(dump_json(job)).encode()


# -- llm-d's GetPodScores --------------------------------------------------------------------------
def llmd_scores(fleet, tokens: list[int], model_name: str | None = None,
                pods: list[str] | None = None, weights: dict[str, float] | None = None) -> dict[str, float]:
    """{pod: score}: each engine's longest cached prefix of `tokens` from block 0 on any tier,
    each block weighted by the best tier it holds it in (`weights` per tier, any name
    `kvevents.tiers` maps; llm-d's by default, a tier not named 1.0). Pods that do not hold the
    prompt's first block are not in the answer; `pods` (none: every engine) and `model_name`
    narrow it. Raises InvalidRequest on bad weights, before any work. Call where changes run."""
    try:
        w = weights_of(weights)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    ids = fleet.identities()
    names = [n for n, (_w, _r, model) in ids.items()
             if (model_name is None or model in (None, model_name)) and (not pods or n in pods)]
    if not names:
        return {}
    if fleet.index.tiers:
        scores = fleet.match_weighted(tokens, w)
        return {n: scores[n] for n in names if n in scores}
    blocks = fleet.match_tokens(tokens)  # the GPU alone: blocks x its weight
    gpu = w.get("gpu", 1.0)
    return {n: blocks[n] * gpu for n in names if blocks.get(n, 0) > 0}
