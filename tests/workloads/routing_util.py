"""Helpers for the routing tests: small Mooncake traces and a cluster whose state the test sets."""

from __future__ import annotations

import json

import numpy as np

from workloads.mooncake import parse_mooncake
from workloads.routing.policies import Cluster, RouteRequest


def trace_of(rows) -> object:
    """A MooncakeTrace from (timestamp_ms, input_length, output_length, hash_ids) rows."""
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids})
             for t, n, o, ids in rows]
    return parse_mooncake(lines, source="test")


def random_rows(seed: int, requests: int = 120, max_blocks: int = 12):
    """Conversation-like rows: each request extends a random earlier prompt's prefix (or starts
    fresh), so equal ids at a position always mean an equal prefix, as in Mooncake traces."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    next_id = 0
    rows = []
    t = 0
    for _ in range(requests):
        if prompts and rng.random() < 0.7:
            base = prompts[int(rng.integers(len(prompts)))]
            keep = int(rng.integers(0, len(base) + 1))
            ids = base[:keep]
        else:
            ids = []
        extra = int(rng.integers(0 if ids else 1, max_blocks - len(ids) + 1)) if len(ids) < max_blocks else 0
        if not ids and extra == 0:
            extra = 1
        ids = ids + list(range(next_id, next_id + extra))
        next_id += extra
        prompts.append(ids)
        last = int(rng.integers(1, 513))
        rows.append((t, 512 * (len(ids) - 1) + last, int(rng.integers(1, 50)), ids))
        t += int(rng.integers(0, 2000))
    return rows


def request(blocks, tokens=None, index=0, arrival=0.0, output=10) -> RouteRequest:
    tokens = 512 * len(blocks) if tokens is None else tokens
    return RouteRequest(index, arrival, list(blocks), tokens, output)


class FakeCluster(Cluster):
    """A cluster whose matches, loads and KV usage the test writes directly."""

    def __init__(self, n: int, matches=None, requests=None, tokens=None, routed=None,
                 waiting=None, usage=None, now: float = 0.0) -> None:
        self.n = n
        self.now = now
        self._matches = list(matches or [0] * n)
        self.requests = list(requests or [0] * n)
        self.tokens = list(tokens or [0] * n)
        self.routed = list(routed or [0] * n)
        self.waiting = list(waiting or [0] * n)
        self.usage = list(usage or [0.0] * n)

    def matches(self, req):
        return self._matches

    def kv_usage(self, r):
        return self.usage[r]


def agent_rows(seed: int, requests: int = 300):
    """An agent-style trace unlike the Mooncake conversations: five system prompts of 1 to 6
    blocks that sessions start from, a hot 4-block prompt asked short questions (a quarter of
    the requests: high matches that pile onto its holders until the load is imbalanced), prompts
    repeated verbatim, and one-off prompts that share nothing. Each session grows turn by turn;
    the last block of every prompt is a fresh, partial one, as in Mooncake traces (a block id
    always has one length)."""
    rng = np.random.default_rng(seed)
    counter = iter(range(1 << 30))

    def fresh(k):
        return [next(counter) for _ in range(k)]

    systems = [fresh(int(rng.integers(1, 7))) for _ in range(5)]
    hot = fresh(4)
    sessions: list[list[int]] = []
    rows = []
    t = 0
    for _ in range(requests):
        u = rng.random()
        if rows and u < 0.1:  # the same prompt again
            rows.append((t, *rows[int(rng.integers(len(rows)))][1:]))
            t += int(rng.integers(0, 400))
            continue
        if u < 0.35:
            full = hot
        elif u < 0.45:
            full = fresh(int(rng.integers(0, 8)))  # shares nothing
        elif u < 0.6 or not sessions:
            sessions.append(systems[int(rng.integers(len(systems)))] + fresh(int(rng.integers(0, 3))))
            full = sessions[-1]
        else:
            j = int(rng.integers(len(sessions)))
            sessions[j] = sessions[j] + fresh(int(rng.integers(1, 4)))
            full = sessions[j]
        ids = full + fresh(1)
        tokens = 512 * len(full) + int(rng.integers(1, 513))
        rows.append((t, tokens, int(rng.integers(1, 400)), ids))
        t += int(rng.integers(0, 400))
    return rows
