"""Live mode: the replicas are real prefix-caching pools (allocator `PrefixPool`s), one per
replica, and each request routed is opened on the chosen pool and closed at once, so its blocks
stay cached and idle, as `kvevents.trace_source` does for one pool.

The policies are the ones of the other modes; `PoolCluster` is what they see:

- `matches(req)`: the leading trace blocks of `req` found in each pool's hash index (the pools'
  real cache contents; a pool block stands for one 512-token trace block, and a partial last
  block is never cached, as in an engine).
- Load is cumulative, as in sequence mode (requests close at once, so nothing is in flight):
  `requests` / `routed` / `waiting` count the requests routed to a replica, `tokens` their
  prompt + output tokens; the KV usage is the pool's used blocks over its blocks.

The caller feeds it one request at a time (`offer`, the policy's `route`, `serve`), so it can
pace the trace and switch the policy between two requests.
"""

from __future__ import annotations

from allocator import InvalidRequest
from allocator.errors import PrefixOutOfMemory

from ..mooncake import MooncakeTrace
from .policies import BLOCK_TOKENS, Cluster, RouteRequest, prefix_run


def pool_hashes(trace: MooncakeTrace, i: int) -> list[int]:
    """Request i's pool block hashes for pools of 512 tokens per block (one per trace block)."""
    return trace.block_hashes(i, BLOCK_TOKENS)


class PoolCluster(Cluster):
    """N prefix-caching pools of `BLOCK_TOKENS` tokens per block as the replicas."""

    def __init__(self, pools: list) -> None:
        if not pools:
            raise InvalidRequest("a live cluster needs at least one pool")
        for p in pools:
            if getattr(p, "tokens_per_block", None) != BLOCK_TOKENS or not hasattr(p, "open_sequence"):
                raise InvalidRequest(f"live replicas are prefix-caching pools of {BLOCK_TOKENS} "
                                     "tokens per block")
        self.pools = list(pools)
        n = self.n = len(pools)
        self.now = 0.0
        self.requests = [0] * n
        self.tokens = [0] * n
        self.routed = self.requests
        self.waiting = self.requests
        self.input_tokens = [0] * n
        self.hit_tokens = [0] * n
        self.refused = [0] * n
        self._offered = (-1, [])
        self._matched_for = -1
        self._matches: list[int] = []

    def offer(self, req: RouteRequest, hashes: list[int]) -> None:
        """The request about to be routed and its pool block hashes."""
        self._offered = (req.index, hashes)
        self.now = req.arrival_s

    def _hashes(self, req: RouteRequest) -> list[int]:
        index, hashes = self._offered
        if index != req.index:
            raise InvalidRequest(f"request {req.index} was not offered before routing")
        return hashes

    def matches(self, req: RouteRequest) -> list[int]:
        if self._matched_for != req.index:
            hashes = self._hashes(req)
            self._matches = [prefix_run(hashes, p.core.index) for p in self.pools]
            self._matched_for = req.index
        return self._matches

    def kv_usage(self, r: int) -> float:
        p = self.pools[r]
        return p.used_blocks / p.num_blocks

    def serve(self, req: RouteRequest, r: int) -> int:
        """Open `req` on pool r and close it; returns its cached tokens (0 when the pool could
        not hold it: counted in `refused`)."""
        pool = self.pools[r]
        self._matched_for = -1  # the pool changes
        self.requests[r] += 1
        self.tokens[r] += req.tokens + req.output_tokens
        self.input_tokens[r] += req.tokens
        try:
            info = pool.open_sequence(block_hashes=self._hashes(req), num_tokens=req.tokens)
        except (PrefixOutOfMemory, InvalidRequest):
            self.refused[r] += 1
            return 0
        pool.close_sequence(info.id)
        self.hit_tokens[r] += info.cached_tokens
        return info.cached_tokens

    def figures(self) -> list[dict]:
        """Per replica: requests, prompt and hit tokens, hit ratio, refused, blocks used and cached."""
        out = []
        for r, p in enumerate(self.pools):
            prompt = self.input_tokens[r]
            out.append({"replica": r, "requests": self.requests[r], "prompt_tokens": prompt,
                        "hit_tokens": self.hit_tokens[r],
                        "hit_ratio": self.hit_tokens[r] / prompt if prompt else 0.0,
                        "refused": self.refused[r], "used_blocks": p.used_blocks,
                        "cached_blocks": len(p.core.index), "num_blocks": p.num_blocks})
        return out
