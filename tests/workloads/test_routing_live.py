"""Live mode's cluster: real prefix-caching pools as the replicas, fed one request at a time."""

from __future__ import annotations

import pytest

from allocator import InvalidRequest, create_pool
from workloads.mooncake import load_mooncake
from workloads.routing import make_policy
from workloads.routing.live import PoolCluster, pool_hashes
from workloads.routing.sequence import requests


def pools(n: int, blocks: int):
    return [create_pool("paged", num_blocks=blocks, block_bytes=64, tokens_per_block=512,
                        device="cpu", prefix_caching={"policy": "lru"}) for _ in range(n)]


def feed(cluster, trace, policy):
    picks = []
    for req in requests(trace):
        cluster.offer(req, pool_hashes(trace, req.index))
        r = policy.route(req, cluster)
        cluster.serve(req, r)
        picks.append(r)
    return picks


def test_matches_are_the_pools_cached_leading_blocks_and_hits_follow_them():
    trace = load_mooncake(limit=60)
    cluster = PoolCluster(pools(3, 4096))
    picks = feed(cluster, trace, make_policy("round_robin", 3))
    assert picks == [i % 3 for i in range(60)]
    assert cluster.requests == [20, 20, 20] and sum(cluster.refused) == 0
    # a request seen before on every replica: each replica's match is its full cached prefix
    req = next(requests(trace))
    cluster.offer(req, pool_hashes(trace, 0))
    m = cluster.matches(req)
    for r, p in enumerate(cluster.pools):
        hashes = pool_hashes(trace, 0)
        want = 0
        while want < len(hashes) and hashes[want] in p.core.index:
            want += 1
        assert m[r] == want
    assert m[0] >= len(req.blocks) - 1  # request 0 ran there (its partial last block is never cached)
    hit = cluster.serve(req, 0)
    assert hit == m[0] * 512
    figs = cluster.figures()
    assert [f["requests"] for f in figs] == [21, 20, 20]
    assert all(0 < f["cached_blocks"] <= f["num_blocks"] for f in figs)
    assert sum(f["hit_tokens"] for f in figs) == sum(cluster.hit_tokens) > 0


def test_longest_prefix_on_pools_beats_round_robin():
    trace = load_mooncake(limit=200)
    ratios = {}
    for name in ("round_robin", "longest_prefix"):
        cluster = PoolCluster(pools(4, 4096))
        feed(cluster, trace, make_policy(name, 4))
        ratios[name] = sum(cluster.hit_tokens) / sum(cluster.input_tokens)
    assert ratios["longest_prefix"] > ratios["round_robin"]


def test_a_request_larger_than_its_pool_is_refused_and_counted():
    trace = load_mooncake(limit=10)
    cluster = PoolCluster(pools(1, 2))
    feed(cluster, trace, make_policy("round_robin", 1))
    assert cluster.refused[0] > 0 and cluster.requests[0] == 10


def test_a_cluster_needs_pools_of_512_token_blocks():
    with pytest.raises(InvalidRequest):
        PoolCluster([])
    small = create_pool("paged", num_blocks=8, block_bytes=64, tokens_per_block=16, device="cpu",
                        prefix_caching={"policy": "lru"})
    with pytest.raises(InvalidRequest, match="512"):
        PoolCluster([small])
