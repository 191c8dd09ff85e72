"""The `cache_aware` routers of SGLang's gateway and of vLLM's router, decision for decision.

Follows sgl-project/sglang `sgl-model-gateway/src/policies/cache_aware.rs` (`select_worker`,
`select_worker_min_load`) and `tree.rs` (`insert`, `prefix_match`, `evict_tenant_by_size`), and
vllm-project/router `src/policies/cache_aware.rs` and `src/tree.rs` (a fork of the same code).
Held to the real binaries, `sglang-router` 0.3.2 and `vllm-router` 0.1.17, by
`tests/workloads/test_routers_real.py` (docs/ROUTING.md, "Held to the real routers"):

- The router keeps one approximate radix tree for all workers, built from its own routing
  history (never from the engines' caches). Each node records, per worker ("tenant"), when that
  worker last used it; a worker's tree size is the characters (vLLM: tokens) of its nodes.
- Loads are the requests in flight per worker. A request is *imbalanced* when
  `max_load - min_load > balance_abs_threshold` AND `max_load > min_load *
  balance_rel_threshold`; then it goes to the least loaded worker (the first in the router's
  order on a tie) and the tree still records it there.
- Otherwise the tree's longest prefix match decides. If `matched / prompt` exceeds
  `cache_threshold`, the request goes to a holder of the deepest matched node: SGLang takes the
  node's cached tenant, its oldest holder (the tenant that created it; a split copies it);
  vLLM 0.1.17 takes the least loaded of the node's holders, the first in the router's order on
  a tie (measured on the binary: on the first 1,000 requests of the bundled trace at N = 4 the
  oldest-holder rule agrees with it on 357, this one on all; the source revisions of
  vllm-project/router read for this still return the cached tenant).
  Else it goes to the least loaded worker, the first on a tie (`min_by_key` over the workers'
  `load()`; the old router's "smallest tree" rule is gone). Either way the tree records the
  request at the chosen worker.
- Every `eviction_interval_secs` each worker's share of the tree is cut to `max_tree_size` by
  evicting that worker's least recently used leaves (both binaries, measured: a budget between
  two workers' shares evicts only the larger share). The units are the tree's characters:
  SGLang's are the prompt's, vLLM's are the token ids written as eight hex digits each, after a
  six-character tag (measured from its debug log: 4,096 tokens weigh 32,774), so its default
  33,554,432 is about 4.2 million tokens a worker.

Variants: `sglang_cache_aware` is `smg launch`'s defaults (0.3.2's `router_args.py`: threshold
0.3, abs 64, rel 1.5, eviction every 60 s, 67,108,864 characters); `sglang_cache_aware_code` the
Rust `CacheAwareConfig::default()` (`policies/mod.rs`: 0.5 / 32 / 1.1, 30 s, 10,000);
`vllm_cache_aware` `vllm-router`'s defaults (0.1.17: 0.3 / 64 / 1.5, every 120 s, 33,554,432).

NOTE: modelled at trace-block granularity. A node is one 512-token trace block weighing
`tokens * units_per_token`: SGLang's tree holds the prompt's text (CHARS_PER_TOKEN characters a
token, so `max_tree_size` keeps its meaning), vLLM's the token ids its workers' `/tokenize`
returns (VLLM_UNITS_PER_TOKEN hex digits a token; measured: with every token id equal, vLLM's
router sees every prompt as a full match). The match rate is the matched share of the
prompt's tokens (vLLM counts whole tokens; SGLang characters). The real trees split nodes at
any character; a match that stops inside a node still takes that node's tenants, which at
block level are the holders of the deepest matched block as long as two different blocks
differ at their first character. That holds for the texts the real-router test sends to
SGLang; in vLLM's hex keys the first tokens of two blocks share leading digits, so a match can
stop inside a sibling block's node and take its holders, a subset of the matched block's
(never seen to change a decision on the bundled trace). Real prompts whose blocks share
leading text match further in the real trees. The real trees also evict whole nodes (a
request's unshared tail is one node), the model one block at a time. Details
kept from the source: nodes a worker joins on the way down get timestamp 0 and only the
request's last node gets a fresh epoch; nodes created by one insert share one epoch (the source
creates a single leaf, later split with copied timestamps); one match in eight refreshes the
matched node's timestamp (`epoch & 0x7 == 0`). Eviction runs at trace time, the real routers'
on the wall clock (the same when a trace is replayed at its own pace).
"""

from __future__ import annotations

import heapq

from .policies import BLOCK_TOKENS, Cluster, Policy, RouteRequest, argmin_first

CHARS_PER_TOKEN = 4  # about four characters of English text per token (the tree stores text)
VLLM_UNITS_PER_TOKEN = 8  # vLLM's tree key: each token id as eight hex digits

VARIANTS = {
    # sglang-router 0.3.2 (`smg launch`): router_args.py and the CLI defaults
    "sglang_cache_aware": dict(cache_threshold=0.3, balance_abs_threshold=64,
                               balance_rel_threshold=1.5, eviction_interval_s=60.0,
                               max_tree_size=67_108_864),
    # the Rust `CacheAwareConfig::default()` (policies/mod.rs)
    "sglang_cache_aware_code": dict(cache_threshold=0.5, balance_abs_threshold=32,
                                    balance_rel_threshold=1.1, eviction_interval_s=30.0,
                                    max_tree_size=10_000),
    # vllm-router 0.1.17: router_args.py and the CLI defaults; its tree holds the token ids,
    # eight hex digits a token
    "vllm_cache_aware": dict(cache_threshold=0.3, balance_abs_threshold=64,
                             balance_rel_threshold=1.5, eviction_interval_s=120.0,
                             max_tree_size=33_554_432, holder="least_loaded",
                             units_per_token=VLLM_UNITS_PER_TOKEN),
}


ROOT = -1


class _Node:
    __slots__ = ("parent", "children", "tenants", "below", "chars")

    def __init__(self, parent: int, chars: int) -> None:
        self.parent = parent
        self.children: set[int] = set()
        self.tenants: dict[int, int] = {}  # worker -> last access epoch; insertion order = age
        self.below: dict[int, int] = {}  # worker -> children it holds (0: a leaf for it)
        self.chars = chars


class ApproxTree:
    """The gateway's multi-tenant prefix tree over trace blocks.

    Invariants (`check`): a node's parent lists it as a child; `sizes[t]` is the sum of `chars`
    over the nodes worker t holds; `held[t]` is exactly those nodes; `below[t]` counts the
    node's children worker t holds (so leaf tests are O(1)); a node with no tenant and no child
    does not exist.
    """

    def __init__(self, n: int, units_per_token: int = CHARS_PER_TOKEN) -> None:
        self.units_per_token = units_per_token
        self.nodes: dict[int, _Node] = {ROOT: _Node(ROOT, 0)}
        self.sizes = [0] * n
        self.held: list[set[int]] = [set() for _ in range(n)]
        self.epoch = 0

    def _next_epoch(self) -> int:
        e = self.epoch
        self.epoch += 1
        return e

    def prefix_match(self, req: RouteRequest) -> tuple[int, _Node | None]:
        """(matched tokens, the deepest matched node or None when nothing matched). The node's
        `tenants` are its holders, oldest first."""
        nodes, prev, matched = self.nodes, ROOT, 0
        blocks = req.blocks
        for k, b in enumerate(blocks):
            node = nodes.get(b)
            if node is None or node.parent != prev:
                break
            matched = req.prefix_tokens(k + 1)
            prev = b
        curr = nodes[prev]
        tenant = next(iter(curr.tenants), -1)
        e = self._next_epoch()
        if e & 0x7 == 0 and tenant in curr.tenants:
            curr.tenants[tenant] = e
        return matched, (curr if prev != ROOT and curr.tenants else None)

    def insert(self, req: RouteRequest, t: int) -> None:
        """Record that worker t served `req` (the source's `Tree::insert`)."""
        nodes, held, prev = self.nodes, self.held[t], ROOT
        nodes[ROOT].tenants.setdefault(t, 0)
        blocks = req.blocks
        for k, b in enumerate(blocks):
            node = nodes.get(b)
            if node is None or node.parent != prev:
                self._grow(req, k, prev, t)
                return
            if t not in node.tenants:
                node.tenants[t] = 0
                self.sizes[t] += node.chars
                held.add(b)
                below = nodes[prev].below
                below[t] = below.get(t, 0) + 1
            prev = b
        nodes[prev].tenants[t] = self._next_epoch()

    def _grow(self, req: RouteRequest, start: int, prev: int, t: int) -> None:
        e = self._next_epoch()
        nodes, held, blocks = self.nodes, self.held[t], req.blocks
        unit = self.units_per_token
        full = BLOCK_TOKENS * unit
        last = len(blocks) - 1
        added = 0
        for k in range(start, len(blocks)):
            b = blocks[k]
            if b in nodes:  # an id seen under another prefix: the tree keeps its first place
                break
            chars = full if k < last else (req.tokens - BLOCK_TOKENS * last) * unit
            node = _Node(prev, chars)
            node.tenants[t] = e
            nodes[b] = node
            parent = nodes[prev]
            parent.children.add(b)
            parent.below[t] = parent.below.get(t, 0) + 1
            added += chars
            held.add(b)
            prev = b
        self.sizes[t] += added

    def _is_leaf(self, b: int, t: int) -> bool:
        return not self.nodes[b].below.get(t)

    def _drop(self, b: int, t: int) -> None:
        """Worker t leaves node b (a leaf of its share); a node nobody holds goes."""
        nodes = self.nodes
        node = nodes[b]
        del node.tenants[t]
        self.held[t].discard(b)
        self.sizes[t] -= node.chars
        parent = node.parent
        nodes[parent].below[t] -= 1
        if not node.children and not node.tenants:
            nodes[parent].children.discard(b)
            del nodes[b]

    def evict(self, max_chars: int) -> None:
        """Cut each worker's share to `max_chars` characters, least recently used leaves first
        (the source's `evict_tenant_by_size`)."""
        nodes = self.nodes
        for t, size in enumerate(self.sizes):
            if size <= max_chars:
                continue
            held = self.held[t]
            heap = []
            for b in held:
                node = nodes[b]
                if not node.below.get(t):
                    heap.append((node.tenants[t], b))
            heapq.heapify(heap)
            while heap and self.sizes[t] > max_chars:
                _, b = heapq.heappop(heap)
                node = nodes[b]
                if t not in node.tenants or not self._is_leaf(b, t):
                    continue
                self._drop(b, t)
                parent = node.parent
                if parent != ROOT and t in nodes[parent].tenants and self._is_leaf(parent, t):
                    heapq.heappush(heap, (nodes[parent].tenants[t], parent))

    def evict_shared(self, max_units: int) -> None:
        """Cut the tree to `max_units` over all workers together (the sum of their shares),
        evicting the least recently used leaf of any worker first."""
        nodes = self.nodes
        if sum(self.sizes) <= max_units:
            return
        heap = [(nodes[b].tenants[t], t, b) for t, held in enumerate(self.held) for b in held
                if not nodes[b].below.get(t)]
        heapq.heapify(heap)
        total = sum(self.sizes)
        while heap and total > max_units:
            _, t, b = heapq.heappop(heap)
            node = nodes[b]
            if t not in node.tenants or not self._is_leaf(b, t):
                continue
            total -= node.chars
            self._drop(b, t)
            parent = node.parent
            if parent != ROOT and t in nodes[parent].tenants and self._is_leaf(parent, t):
                heapq.heappush(heap, (nodes[parent].tenants[t], t, parent))

    def check(self) -> list[str]:
        problems = []
        sizes = [0] * len(self.sizes)
        for b, node in self.nodes.items():
            if b == ROOT:
                continue
            if b not in self.nodes[node.parent].children:
                problems.append(f"node {b}: missing from its parent {node.parent}'s children")
            if not node.children and not node.tenants:
                problems.append(f"node {b}: neither tenant nor child")
            for t in node.tenants:
                sizes[t] += node.chars
                if b not in self.held[t]:
                    problems.append(f"node {b}: held by {t} but not in held[{t}]")
        for b, node in self.nodes.items():
            for t in range(len(self.sizes)):
                want = sum(1 for c in node.children if t in self.nodes[c].tenants)
                if node.below.get(t, 0) != want:
                    problems.append(f"node {b}: below[{t}] {node.below.get(t, 0)} != {want}")
        if sizes != self.sizes:
            problems.append(f"sizes {self.sizes} != recount {sizes}")
        return problems


class CacheAware(Policy):
    """The `cache_aware` policy of SGLang's gateway and of vLLM's router (see the module
    docstring for the rules; `holder` picks among a matched node's workers: "oldest" or
    "least_loaded"; `eviction` is "per_worker", what both routers do, or "shared", one budget
    for the whole tree, which the real-router test uses to show it can tell the two apart)."""

    name = "sglang_cache_aware"

    def __init__(self, n: int, seed: int = 0, *, name: str = "sglang_cache_aware",
                 cache_threshold: float,
                 balance_abs_threshold: int, balance_rel_threshold: float,
                 eviction_interval_s: float, max_tree_size: int, holder: str = "oldest",
                 units_per_token: int = CHARS_PER_TOKEN, eviction: str = "per_worker") -> None:
        super().__init__(n, seed)
        self.name = name
        if holder not in ("oldest", "least_loaded"):
            raise ValueError(f"holder must be oldest or least_loaded, got {holder!r}")
        if eviction not in ("per_worker", "shared"):
            raise ValueError(f"eviction must be per_worker or shared, got {eviction!r}")
        self.eviction = eviction
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        self.holder = holder
        self.tree = ApproxTree(n, units_per_token)
        self._next_eviction = eviction_interval_s
        self.last_match_rate = 0.0

    def imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def route(self, req: RouteRequest, cluster: Cluster) -> int:
        if self.eviction_interval_s > 0 and cluster.now >= self._next_eviction:
            if self.eviction == "shared":
                self.tree.evict_shared(self.max_tree_size)
            else:
                self.tree.evict(self.max_tree_size)
            steps = int((cluster.now - self._next_eviction) // self.eviction_interval_s) + 1
            self._next_eviction += steps * self.eviction_interval_s
        loads = cluster.requests
        if self.imbalanced(loads):
            pick = argmin_first(loads)
            self.rule = f"imbalanced (max {max(loads)}, min {min(loads)}): least loaded"
            self.kind = "imbalance"
        else:
            matched, node = self.tree.prefix_match(req)
            rate = matched / req.tokens
            self.last_match_rate = rate
            if rate > self.cache_threshold and node is not None:
                holders = node.tenants
                if self.holder == "oldest":
                    pick = next(iter(holders))
                else:  # the least loaded holder, the first in the router's order on a tie
                    pick = min(holders, key=lambda t: (loads[t], t))
                self.rule = f"match {rate:.0%} > {self.cache_threshold:g}: best match"
                self.kind = "match"
            else:
                pick = argmin_first(loads)
                self.rule = f"match {rate:.0%} <= {self.cache_threshold:g}: least loaded"
                self.kind = "low_match"
        self.tree.insert(req, pick)
        return pick
