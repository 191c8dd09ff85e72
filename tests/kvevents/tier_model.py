"""A plain model of the fleet's storage tiers that the compiled index is held to.

Per engine and tier, a table from the engine's hashes to (key, copies), keys structural as in
fleet_model.py: a block's key is (parent key, lora, its token ids), one stored without token ids
is ("engine hash", hash, lora) unless the engine holds that hash on another tier (then it is
that block: vLLM's offloading connector announces a block it has no payload for by its hash
alone), a chain whose parent the engine holds on no tier hangs under ("orphan", engine, parent
hash). Tiers are tried in kvevents.tiers.TIERS order. A remove names its tier; a clear without a
medium empties every tier of the engine, one with a medium that tier.
"""

from __future__ import annotations

from kvevents.tiers import TIERS, tier_of


class TierModel:
    def __init__(self, engines: list[str]) -> None:
        self.tables = {e: {t: {} for t in TIERS} for e in engines}  # e -> tier -> hash -> [key, n]
        self.block_size: dict[tuple[str, str], int] = {}  # (engine, tier) -> its first block size

    def _resolve(self, e: str, tier: str, h: int):
        """The key engine e's hash h has on another tier than `tier` (None: none)."""
        for t in TIERS:
            if t != tier and h in self.tables[e][t]:
                return self.tables[e][t][h][0]
        return None

    def apply(self, e: str, ev) -> None:
        if ev.kind == "cleared":
            for t in TIERS if ev.medium is None else [tier_of(ev.medium)]:
                if t is not None:
                    self.tables[e][t].clear()
            return
        tier = tier_of(ev.medium)
        if tier is None:
            return  # a medium that is no tier: not indexed
        t = self.tables[e][tier]
        if ev.kind == "removed":
            for h in ev.block_hashes:
                if h in t:
                    t[h][1] -= 1
                    if not t[h][1]:
                        del t[h]
            return
        tokens, bs = ev.token_ids, ev.block_size
        if bs is not None and (bs < 0 or (bs == 0 and (tokens or tier == "gpu"))):
            return  # malformed
        if tokens and (not bs or len(tokens) != len(ev.block_hashes) * bs):
            return  # malformed
        if bs and self.block_size.setdefault((e, tier), bs) != bs:
            return  # another block size than this tier's first: counted, not indexed
        if ev.parent is None:
            pk = None
        elif ev.parent in t:
            pk = t[ev.parent][0]
        else:
            pk = self._resolve(e, tier, ev.parent) or ("orphan", e, ev.parent)
        for i, h in enumerate(ev.block_hashes):
            if tokens:
                key = (pk, ev.lora_id, tuple(tokens[i * bs:(i + 1) * bs]))
            else:
                key = self._resolve(e, tier, h) or ("engine hash", h, ev.lora_id)
            if h in t:
                t[h][1] += 1
            else:
                t[h] = [key, 1]
            pk = key

    def held(self, e: str, tier: str) -> set:
        return {v[0] for v in self.tables[e][tier].values()}

    def blocks(self, e: str) -> dict[str, int]:
        return {t: len(self.tables[e][t]) for t in TIERS}

    def keys_of(self, tokens, bs, lora=None) -> list:
        keys, pk = [], None
        for i in range(len(tokens) // bs):
            pk = (pk, lora, tuple(tokens[i * bs:(i + 1) * bs]))
            keys.append(pk)
        return keys

    def weighted(self, keys: list, weights: dict[str, float]) -> dict[str, float]:
        """llm-d's LongestPrefixScorer: per engine holding block 0 on some tier, its run from
        block 0 on any tier, each block weighing its best tier's weight (1.0 when not named)."""
        out = {}
        for e in self.tables:
            held = {t: self.held(e, t) for t in TIERS}
            score, n = 0.0, 0
            for k in keys:
                ws = [weights.get(t, 1.0) for t in TIERS if k in held[t]]
                if not ws:
                    break
                score += max(ws)
                n += 1
            if n:
                out[e] = score
        return out

    def tiered(self, keys: list) -> dict[str, dict[str, int]]:
        """Dynamo's walk down the tiers: per engine, {tier: blocks matched there}, the GPU's its
        leading run, each lower tier's the run from where the tiers above left off (an engine
        that matched nothing above a tier enters it only where it holds block 0)."""
        out = {}
        for e in self.tables:
            pos, started, row = 0, False, {}
            for t in TIERS:
                held = self.held(e, t)
                if not started and not (keys and keys[0] in held):
                    continue
                started = True
                n = 0
                while pos + n < len(keys) and keys[pos + n] in held:
                    n += 1
                row[t] = n
                pos += n
            out[e] = row
        return out
