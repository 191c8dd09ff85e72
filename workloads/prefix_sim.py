"""Serving simulation with prefix caching: the Mooncake trace through the serving simulator on a
finite pool, with prefix caching on (`PrefixStrategy` on an `allocator.PrefixPool`) and off (the
plain `paged` strategy on a `PagedPool` of the same size), side by side.

What caching changes is the prefill: a request whose prompt prefix is cached computes only the
rest (`prefill_tokens` per request, the time-to-first-token proxy), so admissions stall the batch
for less time, the queue drains faster and throughput rises. What it costs is memory: cached
idle blocks are evicted on demand, so they never block an admission, but shared blocks of
running requests stay held. Definitions of the shared figures (queueing delay, throughput,
preemptions): `workloads/report.py`. Run timings are printed by the CLI, never stored.
"""

from __future__ import annotations

import numpy as np

from allocator import PagedPool, PrefixPool, get_model

from .mooncake import ATTRIBUTION, MooncakeTrace, expand, sub_blocks
from .report import strategy_report
from .simulator import PagedStrategy, PrefixStrategy, SimConfig, Simulator

MODES = ("prefix", "no-prefix")
DEFAULT_MAX_LEN = 131_072  # the trace's prompts reach 126,195 tokens: a 128k-context model
DEFAULT_POOL_TOKENS = 1_000_000  # about 122 GiB of llama-3-8b KV: one large accelerator's worth


SIM_ROWS = [
    ("mode", "Prefix caching", "{}"),
    ("hit_ratio", "Hit ratio", "{:.1%}"),
    ("prefill_tokens_per_request_mean", "Prefill tok/req (mean)", "{:,.0f}"),
    ("prefill_tokens_per_request_p50", "p50", "{:,.0f}"),
    ("prefill_tokens_per_request_p99", "p99", "{:,.0f}"),
    ("throughput_rps", "Req/s", "{:.2f}"),
    ("queueing_delay_p50_s", "Queue p50 (s)", "{:.1f}"),
    ("queueing_delay_p99_s", "Queue p99 (s)", "{:.1f}"),
    ("latency_p50_s", "Latency p50 (s)", "{:.1f}"),
    ("preemptions", "Preemptions", "{:,}"),
]


def markdown(sim: dict) -> str:
    """The serving comparison as a Markdown section."""
    c = sim["config"]
    head = "| " + " | ".join(h for _, h, _ in SIM_ROWS) + " |"
    rule = "|---|" + "---:|" * (len(SIM_ROWS) - 1)
    rows = [head, rule]
    for m in MODES:
        row = sim["modes"][m]
        rows.append("| " + " | ".join(("on" if row[k] == "prefix" else "off") if k == "mode"
                                      else f.format(row[k]) for k, _, f in SIM_ROWS) + " |")
    on, off = sim["modes"]["prefix"], sim["modes"]["no-prefix"]
    return "\n".join([
        "## Serving with prefix caching",
        "",
        f"The same requests through the serving simulator on one {c['pool_tokens']:,}-token pool "
        f"({c['pool_gib']:.0f} GiB of {c['model']} KV, {c['tokens_per_block']}-token blocks, LRU), "
        f"prefix caching on and off; prefill {c['prefill_token_s'] * 1e6:g} µs per computed "
        f"token, decode step {c['step_base_s'] * 1000:g} ms + {c['step_seq_s'] * 1000:g} ms per "
        f"running request, at most {c['max_batch']} running, max length {c['max_len']:,}.",
        "",
        *rows,
        "",
        f"Caching computes {sim['prefill_saved']:.1%} fewer prefill tokens ({on['prefill_tokens']:,} "
        f"instead of {off['prefill_tokens']:,}, recomputation after preemptions included), a "
        f"time-to-first-token proxy. Its hit ratio ({on['hit_ratio']:.1%}) is counted at each "
        "request's first admission; unlike the one-at-a-time capacity curve, running requests "
        "hold part of the pool here and only idle blocks stay cached. Queueing and latency are "
        "in simulated seconds.",
        "",
        load_text(sim),
        "",
    ])


def load_text(sim: dict) -> str:
    """Whether the trace overloads the simulated accelerator's prefill, in one sentence."""
    offered = sim["offered_prefill_tokens_per_s"]
    capacity = 1 / sim["config"]["prefill_token_s"]
    if not offered:
        return ""
    verdict = ("more than it can prefill even before decoding, so the queue grows for the whole "
               "trace and the delays above are mostly backlog"
               if offered > capacity else "within its prefill capacity")
    return (f"Load: the trace's arrivals bring {offered:,.0f} prompt tokens/s to a simulated "
            f"accelerator that prefills {capacity:,.0f} tokens/s: {verdict}. Mooncake serves this "
            "trace with many prefill nodes; `--sim-prefill-tokens-per-s` and `--sim-pool-tokens` size the "
            "simulated one.")


def sim_config(**kw) -> SimConfig:
    """A SimConfig for the Mooncake trace: 16-token blocks, 128k max length, 1M-token pool."""
    kw.setdefault("max_len", DEFAULT_MAX_LEN)
    kw.setdefault("pool_tokens", DEFAULT_POOL_TOKENS)
    kw.setdefault("tokens_per_block", 16)
    cfg = SimConfig(strategy="paged", **kw)
    cfg.validate()
    return cfg


def prompt_hashes(trace: MooncakeTrace, tokens_per_block: int):
    """rid -> the pool block hashes of request rid's full prompt blocks (computed on demand:
    the whole trace at 16 tokens per block would be 9 million Python ints)."""
    sub_blocks(tokens_per_block)
    lengths = trace.input_length

    def hashes(rid: int) -> list[int]:
        full = int(lengths[rid]) // tokens_per_block
        return expand(trace.block_nodes(rid), tokens_per_block)[:full]

    return hashes


def build(trace: MooncakeTrace, cfg: SimConfig, mode: str) -> Simulator:
    """A simulator of `trace` with prefix caching on (`prefix`) or off (`no-prefix`)."""
    tpb, tb = cfg.tokens_per_block, cfg.sim_bytes_per_token
    blocks = cfg.capacity_tokens() // tpb
    kw = dict(device="cpu", name=mode, event_capacity=1)
    if mode == "prefix":
        pool = PrefixPool(blocks, tpb * tb, tokens_per_block=tpb, policy="lru", **kw)
        strategy = PrefixStrategy(pool, tb, cfg.max_length(), tpb, prompt_hashes(trace, tpb))
    elif mode == "no-prefix":
        pool = PagedPool(blocks, tpb * tb, **kw)
        strategy = PagedStrategy(pool, tb, cfg.max_length(), tpb)
    else:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    return Simulator(trace.to_trace(), cfg, pool=pool, strategy=strategy,
                     capacity_tokens=blocks * tpb)


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def mode_report(sim: Simulator, mode: str) -> dict:
    """The serving figures of one finished run, plus its prefill work and prefix hits."""
    base = strategy_report(sim)
    served = [r for r in sim.requests if r.admitted_at is not None]
    prompts = sum(r.prompt for r in served)
    computed = [r.computed for r in served]
    hit = sum(r.first_cached or 0 for r in served)
    keep = ("requests", "completed", "rejected_too_long", "simulated_seconds", "throughput_rps",
            "tokens_per_s", "queueing_delay_p50_s", "queueing_delay_p99_s", "queueing_delay_mean_s",
            "latency_p50_s", "latency_p99_s", "mean_batch", "preemptions", "recomputed_tokens")
    out = {"mode": mode, **{k: base[k] for k in keep}}
    out.update({
        "prompt_tokens": prompts,
        "prefill_tokens": int(sum(computed)),
        "prefill_tokens_per_request_mean": float(np.mean(computed)) if computed else 0.0,
        "prefill_tokens_per_request_p50": _pct(computed, 50),
        "prefill_tokens_per_request_p99": _pct(computed, 99),
        "prefill_seconds": float(sum(computed)) * sim.cfg.prefill_token_s,
        "hit_ratio": hit / prompts if prompts else 0.0,
    })
    if mode == "prefix":
        stats = sim.pool.prefix_stats()
        out["evicted_blocks"] = stats["evicted"]
        out["pool_hit_ratio"] = stats["hit_ratio"]
    return out


def compare(trace: MooncakeTrace, cfg: SimConfig | None = None, progress=None,
            wall: dict | None = None) -> dict:
    """Both modes to the end; `progress(label)` returns a (done, total) callback or None.
    Wall seconds per mode go into `wall` when given (never into the report)."""
    cfg = cfg or sim_config()
    runs = {}
    for mode in MODES:
        sim = build(trace, cfg, mode)
        sim.run(None if progress is None else progress(mode))
        assert sim.pool.check() == [], f"{mode}: {sim.pool.check()}"
        runs[mode] = sim
    if wall is not None:
        wall.update({m: sim.wall_s for m, sim in runs.items()})
    on, off = (mode_report(runs[m], m) for m in MODES)
    geometry = get_model(cfg.model)
    return {
        "trace": trace.summary(),
        "config": {"model": cfg.model, "pool_tokens": cfg.capacity_tokens(),
                   "pool_gib": cfg.capacity_tokens() * geometry.bytes_per_token / (1 << 30),
                   "tokens_per_block": cfg.tokens_per_block, "max_len": cfg.max_length(),
                   "max_batch": cfg.max_batch, "step_base_s": cfg.step_base_s,
                   "step_seq_s": cfg.step_seq_s, "prefill_token_s": cfg.prefill_token_s,
                   "policy": "lru"},
        "modes": {"prefix": on, "no-prefix": off},
        "prefill_saved": 1 - on["prefill_tokens"] / off["prefill_tokens"] if off["prefill_tokens"] else 0.0,
        "offered_prefill_tokens_per_s": (int(trace.input_length.sum()) / float(trace.arrival_s[-1])
                                         if len(trace) > 1 and trace.arrival_s[-1] > 0 else 0.0),
        "attribution": ATTRIBUTION,
    }
