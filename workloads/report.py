"""Replay reports: where the KV memory went, per strategy, as JSON, Markdown and a PNG chart.

Definitions (all time-averaged over the replay, from the first arrival to the last completion;
a "slot" is one token's KV; memory is reported in the model's bytes, tokens * bytes_per_token):

- `token_state_share`: slot-seconds holding a computed token / allocated slot-seconds.
- `reserved_share`: allocated slots the request will still fill before it completes (reserved
  for its future tokens, not yet used) / allocated.
- `internal_waste_share`: allocated slots the request will never fill (over-reservation beyond
  its final length; for paged, the tail of its last block) / allocated.
  The three shares above partition allocated memory and sum to 1.
- `external_waste_share`: free slot-seconds during the intervals when the head of the queue
  waits because no free extent is large enough although the free total would suffice (its
  admission failed with an OOM of cause "fragmentation") / pool capacity slot-seconds. Free
  memory while the head waits for lack of memory in total is not counted: it is merely too little.
- `pool_token_state_share`: token-state slot-seconds / pool capacity slot-seconds (how much of the
  whole pool did useful work), and `memory_utilization`: allocated / capacity.
- `throughput_rps`: completed requests / simulated seconds; `queueing_delay_s` p50/p99: first
  admission minus arrival; `latency_s` p50/p99: completion minus arrival.
- Run timings (`Simulator.wall_s`) are deliberately not part of the report: the same replay
  must write the same files. The CLI and the bench print them instead.
- `ooms`: failed pool calls by cause, as the pool counted them (admissions retried after a
  change, and growths); `blocked_admissions` / `failed_growths` split them by where they arose.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from allocator import get_model

from .simulator import Simulator
from .trace import ATTRIBUTION

VLLM_CLAIM = (
    "Kwon et al., SOSP 2023 (vLLM): in existing systems that reserve contiguous KV memory only "
    "20.4%-38.2% of KV memory holds token states (Fig. 2: Orca max 20.4%, pow2 26.8%, oracle "
    "38.2%); with paging the waste is under 4%."
)
HEADLINE = [
    ("strategy", "Strategy", "{}"),
    ("token_state_share", "Token states", "{:.1%}"),
    ("reserved_share", "Reserved", "{:.1%}"),
    ("internal_waste_share", "Internal waste", "{:.1%}"),
    ("external_waste_share", "External waste", "{:.1%}"),
    ("throughput_rps", "Req/s", "{:.2f}"),
    ("queueing_delay_p50_s", "Queue p50 (s)", "{:.2f}"),
    ("queueing_delay_p99_s", "Queue p99 (s)", "{:.1f}"),
    ("mean_batch", "Mean batch", "{:.1f}"),
    ("preemptions", "Preemptions", "{}"),
    ("ooms_total", "OOMs (cap/frag)", "{}"),
]


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def strategy_report(sim: Simulator) -> dict:
    """The figures of one finished replay, as plain JSON values."""
    ig, c, cfg = sim.integrals, sim.counters, sim.cfg
    bpt = get_model(cfg.model).bytes_per_token
    served = [r for r in sim.requests if r.admitted_at is not None]
    waits = [r.admitted_at - r.arrival for r in served]
    done = [r.finished_at - r.arrival for r in served if r.finished_at is not None]
    ooms = {"capacity": sim.pool.counters["ooms_capacity"],
            "fragmentation": sim.pool.counters["ooms_fragmentation"]}
    seconds = ig.seconds
    return {
        "strategy": cfg.strategy,
        "token_state_share": _ratio(ig.token_states, ig.allocated),
        "reserved_share": _ratio(ig.reserved, ig.allocated),
        "internal_waste_share": _ratio(ig.internal, ig.allocated),
        "external_waste_share": _ratio(ig.external, ig.capacity),
        "pool_token_state_share": _ratio(ig.token_states, ig.capacity),
        "memory_utilization": _ratio(ig.allocated, ig.capacity),
        "mean_allocated_bytes": _ratio(ig.allocated, seconds) * bpt,
        "mean_token_state_bytes": _ratio(ig.token_states, seconds) * bpt,
        "requests": sim.total,
        "completed": c.completed,
        "rejected_too_long": c.rejected_too_long,
        "simulated_seconds": seconds,
        "throughput_rps": _ratio(c.completed, seconds),
        "tokens_per_s": _ratio(sum(r.final - r.prompt for r in served if r.finished_at is not None), seconds),
        "queueing_delay_p50_s": _pct(waits, 50),
        "queueing_delay_p99_s": _pct(waits, 99),
        "queueing_delay_mean_s": float(np.mean(waits)) if waits else 0.0,
        "latency_p50_s": _pct(done, 50),
        "latency_p99_s": _pct(done, 99),
        "mean_batch": _ratio(ig.batch, seconds),
        "preemptions": c.preemptions,
        "recomputed_tokens": c.recomputed_tokens,
        "ooms": ooms,
        "ooms_total": f"{ooms['capacity']}/{ooms['fragmentation']}",
        "blocked_admissions": dict(c.blocked_admissions),
        "failed_growths": dict(c.failed_growths),
        "moved_bytes": sim.strategy.moved_tokens * bpt,
        "pool_moves": sim.pool.counters["moves"],
        "steps": c.steps,
    }


def build_report(sims: list[Simulator], trace_summary: dict | None = None) -> dict:
    """The whole report: config, per-strategy figures, the vLLM claim and the attribution."""
    cfg = sims[0].cfg
    geometry = get_model(cfg.model)
    tokens = cfg.capacity_tokens()
    return {
        "trace": trace_summary or {},
        "model": geometry.to_dict(),
        "pool": {
            "tokens": tokens,
            "bytes": tokens * geometry.bytes_per_token,
            "gib": tokens * geometry.bytes_per_token / (1 << 30),
            "tokens_per_block": cfg.tokens_per_block,
            "max_len": cfg.max_length(),
            "simulated_bytes_per_token": cfg.sim_bytes_per_token,
        },
        "timing": {
            "step_base_s": cfg.step_base_s,
            "step_seq_s": cfg.step_seq_s,
            "prefill_token_s": cfg.prefill_token_s,
            "max_batch": cfg.max_batch,
        },
        "strategies": {s.cfg.strategy: strategy_report(s) for s in sims},
        "claim": VLLM_CLAIM,
        "finding": finding(sims),
        "memory_note": (
            f"Pools were simulated at {cfg.sim_bytes_per_token} byte(s) per token through the real allocator; memory "
            f"figures are scaled to the model's {geometry.bytes_per_token} bytes per token."
        ),
        "attribution": ATTRIBUTION,
    }


PAPER_TOKEN_SHARES = {  # Kwon et al. 2023, Fig. 2 (OPT-13B, max length 2048, ShareGPT-like load)
    "contiguous-max": 0.204, "contiguous-pow2": 0.268, "contiguous-oracle": 0.382, "paged": 0.963,
}


def finding(sims: list[Simulator]) -> str:
    """One honest sentence per strategy: the replay's token-state share next to the paper's."""
    shares = {s.cfg.strategy: strategy_report(s)["token_state_share"] for s in sims}
    parts = [f"{name} {share:.1%} (paper: {PAPER_TOKEN_SHARES.get(name):.1%})"
             for name, share in shares.items()]
    text = "Token-state share of allocated KV memory on this replay: " + "; ".join(parts) + "."
    if "paged" in shares:
        waste = 1 - shares["paged"]
        text += (f" Paging wastes {waste:.1%}: {'consistent with' if waste < 0.04 else 'NOT consistent with'}"
                 " the paper's under-4%.")
    contiguous = [v for k, v in shares.items() if k.startswith("contiguous")]
    if contiguous:
        inside = [v for v in contiguous if 0.204 <= v <= 0.382]
        text += (f" {len(inside)} of {len(contiguous)} contiguous strategies fall inside 20.4%-38.2%."
                 " Differences from the paper's setup: the paper's figures count external"
                 " fragmentation in the denominator and used a 2,048-token max length; this"
                 " replay uses the model's max length, real Azure lengths and an exact-length oracle.")
    return text


# -- output ------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    rows = list(report["strategies"].values())
    head = "| " + " | ".join(h for _, h, _ in HEADLINE) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(HEADLINE))) + "|"
    lines = [head, rule]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[k]) for k, _, fmt in HEADLINE) + " |")
    pool, model, t = report["pool"], report["model"], report.get("trace", {})
    out = [
        "# KV memory on a replayed trace",
        "",
        f"{t.get('requests', '?')} requests from `{t.get('source', '?')}` "
        f"({rows[0]['rejected_too_long'] if rows else 0} longer than the max length skipped); model {model['name']} "
        f"({model['bytes_per_token'] // 1024} KiB per token); pool {pool['gib']:.1f} GiB = "
        f"{pool['tokens']:,} tokens; {pool['tokens_per_block']}-token blocks for paged; max length "
        f"{pool['max_len']:,} tokens.",
        "",
        *lines,
        "",
        "Shares of allocated KV memory (token states + reserved + internal waste = 100%), "
        "time-averaged; external waste is free memory stranded by fragmentation while a request "
        "waits, as a share of the pool. OOMs are failed pool calls by cause (capacity/fragmentation).",
        "",
        f"**Claim.** {report['claim']}",
        "",
        f"**Finding.** {report['finding']}",
        "",
        f"*Method.* {report['memory_note']} Step time {report['timing']['step_base_s'] * 1000:g} ms + "
        f"{report['timing']['step_seq_s'] * 1000:g} ms per running request; prefill "
        f"{report['timing']['prefill_token_s'] * 1e6:g} µs per context token; at most "
        f"{report['timing']['max_batch']} running requests. Definitions: `workloads/report.py`.",
        "",
        "---",
        f"{report['attribution']}",
        "",
    ]
    return "\n".join(out)


def chart(report: dict, path: str | Path) -> None:
    """A stacked bar per strategy: token states / reserved / internal waste, plus external."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(report["strategies"].values())
    names = [r["strategy"] for r in rows]
    parts = [
        ("token_state_share", "token states", "#2a9d8f"),
        ("reserved_share", "reserved, not yet used", "#e9c46a"),
        ("internal_waste_share", "internal waste", "#e76f51"),
    ]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    bottom = np.zeros(len(rows))
    for key, label, colour in parts:
        vals = np.array([r[key] for r in rows]) * 100
        ax.bar(names, vals, bottom=bottom, label=label, color=colour)
        for i, v in enumerate(vals):
            if v >= 6:
                ax.text(i, bottom[i] + v / 2, f"{v:.0f}%", ha="center", va="center", fontsize=8)
        bottom += vals
    ax.axhspan(20.4, 38.2, color="grey", alpha=0.15, label="vLLM paper: contiguous 20.4-38.2%")
    ax.set_ylabel("% of allocated KV memory (time-averaged)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("Where allocated KV memory goes")
    x = np.arange(len(rows))
    ax2.bar(x - 0.2, [max(r["queueing_delay_p50_s"], 1e-3) for r in rows], 0.4, label="p50", color="#8ab17d")
    ax2.bar(x + 0.2, [max(r["queueing_delay_p99_s"], 1e-3) for r in rows], 0.4, label="p99", color="#264653")
    ax2.set_yscale("log")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("queueing delay (simulated s, log)")
    ax2.tick_params(axis="x", labelsize=7, rotation=20)
    ax2.legend(fontsize=7)
    ax2.set_title("Waiting for memory")
    fig.text(0.01, 0.01, report["attribution"], fontsize=5.5, color="#555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, out_dir: str | Path, png: bool = True) -> list[Path]:
    """Write report.json, report.md and (optionally) report.png into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    paths[1].write_text(markdown(report))
    if png:
        chart(report, out / "report.png")
        paths.append(out / "report.png")
    return paths
