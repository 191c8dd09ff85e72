"""Prometheus metrics: pool gauges read at scrape time, and request latency from a tiny middleware.

Pool numbers come from a custom Collector that reads each pool's stats when /metrics is scraped,
so the hot path updates nothing. Request latency is one histogram observed by a pure-ASGI
middleware (no BaseHTTPMiddleware: it would add a task and a stream copy per request).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The request histogram's labels take bounded values whatever a client sends: a method outside
# these is `other`, a path no route matched `unmatched` (never the raw path), a status outside
# 100..599 `other`. The other families are labelled by pools, fleets and engines, which the
# server's caps bound, and by fixed names (block states, OOM causes, eviction reasons, storage
# tiers).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
                           "CONNECT"})
OTHER = "other"
UNMATCHED = "unmatched"


def request_labels(method: str, route, status: int) -> tuple[str, str, str]:
    """The (method, route, status) label values of one request, each from a bounded set."""
    path = getattr(route, "path", None)
    return (method if method in KNOWN_METHODS else OTHER,
            path if isinstance(path, str) and path else UNMATCHED,
            str(status) if isinstance(status, int) and 100 <= status <= 599 else OTHER)


class PoolCollector:
    """Reads every pool of a registry at scrape time."""

    def __init__(self, registry) -> None:
        self.registry = registry

    def describe(self):
        return []

    def collect(self):
        blocks = GaugeMetricFamily("kvscope_blocks", "Blocks by state", labels=["pool", "state"])
        util = GaugeMetricFamily("kvscope_utilization", "Used blocks / total blocks", labels=["pool"])
        internal = GaugeMetricFamily("kvscope_internal_fragmentation",
                                     "1 - requested / allocated bytes", labels=["pool"])
        external = GaugeMetricFamily("kvscope_external_fragmentation",
                                     "1 - largest free extent / free total", labels=["pool"])
        largest = GaugeMetricFamily("kvscope_largest_free_bytes", "Largest free extent in bytes",
                                    labels=["pool"])
        ooms = CounterMetricFamily("kvscope_ooms", "Out-of-memory failures", labels=["pool", "cause"])
        evictions = CounterMetricFamily("kvscope_evictions", "Cache evictions", labels=["pool", "reason"])
        hits = CounterMetricFamily("kvscope_cache_hits", "Cache hits", labels=["pool"])
        misses = CounterMetricFamily("kvscope_cache_misses", "Cache misses", labels=["pool"])
        for handle in self.registry:
            pool, name = handle.pool, handle.name
            stats = pool.stats()
            for state, count in stats["blocks_by_state"].items():
                blocks.add_metric([name, state], count)
            util.add_metric([name], stats["utilization"])
            internal.add_metric([name], stats["internal_fragmentation"])
            external.add_metric([name], stats["external_fragmentation"])
            largest.add_metric([name], stats["largest_free_bytes"])
            for cause, n in stats["ooms"].items():
                ooms.add_metric([name, cause], n)
            cache = pool.cache
            if cache is not None:
                for reason, n in cache.evictions.items():
                    evictions.add_metric([name, reason], n)
                hits.add_metric([name], cache.hits)
                misses.add_metric([name], cache.misses)
        yield from (blocks, util, internal, external, largest, ooms, evictions, hits, misses)
        yield from prefix_metrics(self.registry)


# vLLM's names for the same block-time distributions (seconds), under the kvscope_ prefix.
BLOCK_HISTOGRAMS = {"lifetime": "kv_block_lifetime_seconds",
                    "idle_before_evict": "kv_block_idle_before_evict_seconds",
                    "reuse_gap": "kv_block_reuse_gap_seconds"}


def prefix_metrics(registry):
    """Prefix-caching pools: token-weighted queries and hits (vLLM's prefix_cache_queries /
    prefix_cache_hits), blocks by state, and the block lifetime / idle / reuse-gap histograms."""
    queries = CounterMetricFamily("kvscope_prefix_cache_queries", "Prompt tokens looked up in the "
                                  "prefix cache", labels=["pool"])
    hits = CounterMetricFamily("kvscope_prefix_cache_hits", "Prompt tokens served from the prefix "
                               "cache", labels=["pool"])
    evicted = CounterMetricFamily("kvscope_prefix_cache_evictions", "Cached blocks evicted",
                                  labels=["pool"])
    blocks = GaugeMetricFamily("kvscope_prefix_blocks", "Blocks of a prefix-caching pool by state "
                               "(free, private, shared, cached, allocations)", labels=["pool", "state"])
    hists = {k: HistogramMetricFamily("kvscope_" + name, f"Block {k.replace('_', ' ')} in seconds",
                                      labels=["pool"]) for k, name in BLOCK_HISTOGRAMS.items()}
    for handle in registry:
        stats_of = getattr(handle.pool, "prefix_stats", None)
        if stats_of is None:
            continue
        name, s = handle.name, stats_of()
        queries.add_metric([name], s["queries"])
        hits.add_metric([name], s["hits"])
        evicted.add_metric([name], s["evicted"])
        for state, n in s["blocks"].items():
            blocks.add_metric([name, state], n)
        for key, fam in hists.items():
            h = s["histograms"][key]
            cumulative, buckets = 0, []
            for bound, count in zip([*h["bounds"], float("inf")], h["counts"]):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            fam.add_metric([name], buckets, h["sum"])
    yield from (queries, hits, evicted, blocks, *hists.values())


class FleetCollector:
    """Reads every fleet at scrape time (on the event loop, where fleet changes run)."""

    def __init__(self, fleets) -> None:
        self.fleets = fleets

    def describe(self):
        return []

    def collect(self):
        fam = {
            "unique": GaugeMetricFamily("kvscope_fleet_unique_blocks", "Distinct blocks cached "
                                        "across the fleet", labels=["fleet"]),
            "dup": GaugeMetricFamily("kvscope_fleet_duplicated_blocks", "Distinct blocks cached "
                                     "on two or more engines", labels=["fleet"]),
            "copies": GaugeMetricFamily("kvscope_fleet_duplicate_copies", "Extra copies of "
                                        "blocks cached on more than one engine", labels=["fleet"]),
            "rec": CounterMetricFamily("kvscope_fleet_cross_engine_recomputes", "Blocks an engine "
                                       "stored while another engine already held them",
                                       labels=["fleet"]),
            "tok": CounterMetricFamily("kvscope_fleet_recompute_tokens", "Tokens of those blocks",
                                       labels=["fleet"]),
            "cached": GaugeMetricFamily("kvscope_fleet_engine_cached_blocks", "Blocks an engine "
                                        "holds on the GPU", labels=["fleet", "engine", "server"]),
            "tiers": GaugeMetricFamily("kvscope_fleet_engine_blocks", "Blocks an engine holds per "
                                       "storage tier (gpu, cpu, disk, external: the tiers its "
                                       "fleet's engines have used)", labels=["fleet", "engine", "tier"]),
            "tier_unique": GaugeMetricFamily("kvscope_fleet_tier_unique_blocks", "Distinct blocks "
                                             "cached across the fleet per storage tier",
                                             labels=["fleet", "tier"]),
            "lag": GaugeMetricFamily("kvscope_fleet_engine_lag_seconds", "Seconds since the "
                                     "engine's last batch arrived", labels=["fleet", "engine"]),
            "errors": CounterMetricFamily("kvscope_fleet_engine_errors", "Bad input from the "
                                          "engine's stream (batches and events)",
                                          labels=["fleet", "engine"]),
        }
        for handle in self.fleets or ():
            fleet, name = handle.fleet, handle.name
            s = fleet.stats()
            fam["unique"].add_metric([name], s["unique_blocks"])
            fam["dup"].add_metric([name], s["duplicated_blocks"])
            fam["copies"].add_metric([name], s["duplicate_copies"])
            fam["rec"].add_metric([name], s["cross_engine_recomputes"])
            fam["tok"].add_metric([name], s["recompute_tokens"])
            for tier, t in s["tiers"].items():  # tier names: a fixed set (kvevents/tiers.py)
                fam["tier_unique"].add_metric([name, tier], t["unique_blocks"])
            for row in fleet.engines():
                fam["cached"].add_metric([name, row["name"], row["server"]], row["cached_blocks"])
                for tier, n in row["tiers"].items():
                    fam["tiers"].add_metric([name, row["name"], tier], n)
                lag = row["stream"].get("lag_s")
                if lag is not None:
                    fam["lag"].add_metric([name, row["name"]], lag)
                fam["errors"].add_metric([name, row["name"]], row["stream"].get("error_count", 0)
                                         + row["malformed_events"])
        yield from fam.values()


class Metrics:
    """The per-app Prometheus registry (tests build many apps in one process)."""

    def __init__(self, pools, fleets=None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(PoolCollector(pools))
        self.registry.register(FleetCollector(fleets))
        self.latency = Histogram("kvscope_request_duration_seconds", "Request latency",
                                 ["method", "route", "status"], registry=self.registry,
                                 buckets=LATENCY_BUCKETS)


class LatencyMiddleware:
    """Pure-ASGI: times each HTTP request, labelled by its route template (not the raw path),
    its method and its status, each folded into a bounded set (`request_labels`)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            labels = request_labels(scope.get("method", ""), scope.get("route"), status)
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - started)


