"""A small, obviously correct fleet index that the compiled one is held to.

Blocks are keyed structurally: a block's key is the tuple (parent key, lora, its token ids), the
root's key is None; a block stored without token ids is keyed ("engine hash", hash, lora); a
chain whose parent the engine does not hold hangs under ("orphan", engine, parent hash). Each
engine maps its hashes to (key, copies); an engine holds a key while one of its hashes maps there.
"""

from __future__ import annotations


class FleetModel:
    def __init__(self) -> None:
        self.tables: dict[str, dict[int, list]] = {}  # engine -> hash -> [key, copies]
        self.recomputes: dict[str, int] = {}
        self.recompute_tokens: dict[str, int] = {}
        self.block_size: dict[str, int | None] = {}

    def add(self, name: str) -> None:
        self.tables[name] = {}
        self.recomputes[name] = self.recompute_tokens[name] = 0
        self.block_size[name] = None

    def holders(self, key) -> set[str]:
        return {e for e, t in self.tables.items() if any(v[0] == key for v in t.values())}

    def store(self, e: str, hashes, parent, tokens, bs, lora=None) -> None:
        t = self.tables[e]
        if parent is None:
            pk = None
        elif parent in t:
            pk = t[parent][0]
        else:
            pk = ("orphan", e, parent)
        if bs and self.block_size[e] is None:
            self.block_size[e] = bs
        for i, h in enumerate(hashes):
            key = (pk, lora, tuple(tokens[i * bs:(i + 1) * bs])) if tokens else ("engine hash", h, lora)
            if h in t:
                t[h][1] += 1
            else:
                held = self.holders(key)
                if held and e not in held:
                    self.recomputes[e] += 1
                    self.recompute_tokens[e] += bs or 0
                t[h] = [key, 1]
            pk = key

    def remove(self, e: str, hashes) -> None:
        t = self.tables[e]
        for h in hashes:
            if h in t:
                t[h][1] -= 1
                if not t[h][1]:
                    del t[h]

    def clear(self, e: str) -> None:
        self.tables[e].clear()

    def keys_of(self, tokens, bs, lora=None) -> list:
        keys, pk = [], None
        for i in range(len(tokens) // bs):
            pk = (pk, lora, tuple(tokens[i * bs:(i + 1) * bs]))
            keys.append(pk)
        return keys

    def walk(self, keys) -> dict[str, int]:
        out = {}
        for e, t in self.tables.items():
            held = {v[0] for v in t.values()}
            n = 0
            while n < len(keys) and keys[n] in held:
                n += 1
            out[e] = n
        return out

    def match(self, tokens, lora=None) -> dict[str, int]:
        out = dict.fromkeys(self.tables, 0)
        for e in self.tables:
            bs = self.block_size[e]
            if bs:
                out[e] = self.walk(self.keys_of(tokens, bs, lora))[e]
        return out

    def match_hashes(self, e: str, hashes) -> dict[str, int]:
        t = self.tables[e]
        keys = []
        for h in hashes:
            if h not in t:
                break
            keys.append(t[h][0])
        return self.walk(keys)

    def stats(self) -> dict:
        holders: dict = {}
        for e, t in self.tables.items():
            for v in t.values():
                holders.setdefault(v[0], set()).add(e)
        return {
            "unique_blocks": len(holders),
            "duplicated_blocks": sum(1 for s in holders.values() if len(s) >= 2),
            "duplicate_copies": sum(len(s) - 1 for s in holders.values()),
            "cross_engine_recomputes": sum(self.recomputes.values()),
            "recompute_tokens": sum(self.recompute_tokens.values()),
        }


def add_at(fleet, wanted: dict[str, int], **kw) -> None:
    """Add the engines of `wanted` to a FleetIndex under the ids it names (the index hands out
    the lowest free id: placeholders fill the ids below, then go). `kw[name]`: that engine's
    keyword arguments for `add`."""
    pads = {i: f"pad-{i}" for i in range(max(wanted.values()) + 1)}
    for pad in pads.values():
        fleet.add(pad)
    for i in wanted.values():
        fleet.discard(pads.pop(i))
    for name, i in sorted(wanted.items(), key=lambda x: x[1]):
        assert fleet.add(name, **kw.get(name, {})).eid == i
    for pad in pads.values():
        fleet.discard(pad)
