"""The prefix-cache capacity report: JSON, Markdown beside the Mooncake paper's figures, a PNG.

The report dict comes from `prefix_curve.capacity_curve`; this module only renders it, so the
same run always writes the same files (run timings are printed by the CLI and the bench, never
stored).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import prefix_sim
from .prefix_curve import BOUND, ratio_at

LABELS = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "s3fifo": "S3-FIFO", BOUND: "Bélády MIN"}
COLOURS = {"lru": "#264653", "fifo": "#e9c46a", "lfu": "#f4a261", "s3fifo": "#2a9d8f", BOUND: "#111111"}
WEIGHTING_NAMES = {"token_weighted": "weighted by tokens (this report)",
                   "block_weighted": "weighted by 512-token blocks",
                   "request_mean": "mean over requests of each request's ratio"}


def _tokens(n: int | None) -> str:
    if n is None:
        return "∞"
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{unit}"
    return f"{n:,}"


def paper_comparison(report: dict) -> dict:
    """The paper's two figures next to ours, with the weighting closest to its 40%."""
    paper = report["paper"]
    best = report["max_hit_ratio"]
    weights = {k: v for k, v in report.get("max_hit_ratio_weightings", {}).items()
               if k in WEIGHTING_NAMES}
    closest = min(weights, key=lambda k: abs(weights[k] - paper["cache_ratio"])) if weights else None
    local = paper["local_cache_tokens"]
    at_local = {p: ratio_at(report, local, p) for p in report["policies"]}
    shares = {p: (v / best if best else 0.0) for p, v in at_local.items() if v is not None}
    return {"max_hit_ratio": best, "paper_cache_ratio": paper["cache_ratio"],
            "closest_weighting": closest, "weightings": weights,
            "local_cache_tokens": local, "at_local_cache": at_local, "share_of_max_at_local": shares}


def gap_text(report: dict) -> str:
    cmp = paper_comparison(report)
    w = cmp["weightings"]
    text = (f"With the curve's definition (token-weighted, hit = min(cached prefix, prompt)) the "
            f"infinite-capacity maximum is {cmp['max_hit_ratio']:.1%} against the paper's "
            f"{cmp['paper_cache_ratio']:.0%}.")
    if w:
        text += (" The paper does not define its \"cache ratio\"; on this trace the same cache "
                 "gives " + ", ".join(f"{v:.1%} {WEIGHTING_NAMES[k]}" for k, v in w.items()) +
                 f". The closest to 40% is the {WEIGHTING_NAMES[cmp['closest_weighting']]}.")
        buckets = report["max_hit_ratio_weightings"].get("by_prompt_length", [])
        if buckets:
            text += (" Per request, the reusable share depends on the prompt's length: " + ", ".join(
                f"{b['mean_ratio']:.0%} for {b['requests']:,} prompts of "
                + (f"{b['min_tokens']:,}-{b['max_tokens']:,}" if b["max_tokens"] else f"{b['min_tokens']:,}+")
                + " tokens" for b in buckets) + "; a mean over requests weighs the many short "
                "prompts as much as the few long ones, which carry most tokens.")
    text += (" Other possible causes we cannot check: the released trace's hash ids are remapped "
             "and may merge or split blocks the paper's system saw, and the paper's system may "
             "count reuse it found by other means than exact 512-token prefix matches.")
    return text


def local_cache_text(report: dict) -> str:
    cmp = paper_comparison(report)
    shares = cmp["share_of_max_at_local"]
    online = {p: v for p, v in shares.items() if p != BOUND}
    if not shares:
        return (f"The curve has no point at {cmp['local_cache_tokens']:,} tokens; rerun with it in "
                "--capacity-tokens to compare with the paper's local-cache statement.")
    parts = ", ".join(f"{LABELS.get(p, p)} {cmp['at_local_cache'][p]:.1%} ({s:.0%} of the maximum)"
                      for p, s in shares.items())
    text = f"At {cmp['local_cache_tokens']:,} tokens: {parts}."
    if online:
        under = [p for p, s in online.items() if s < 0.5]
        verdict = ("consistent with" if len(under) == len(online) else
                   "partly consistent with" if under else "NOT consistent with")
        text += (" The paper says a 3M-token local cache reaches under 50% of the maximum hit "
                 f"ratio in most workloads: this trace is {verdict} it ({len(under)} of "
                 f"{len(online)} online policies under half).")
    if BOUND in shares:
        text += (f" Bélády's MIN, which knows the future, reaches {shares[BOUND]:.0%} of the "
                 "maximum with the same memory: the shortfall is the policies' (which blocks they "
                 "keep), not the capacity's.")
    return text


def markdown(report: dict, png: bool = True) -> str:
    pols = report["policies"]
    caps = report["capacities_tokens"]
    best = report["max_hit_ratio"]
    t = report["trace"]
    head = "| capacity (tokens) | " + " | ".join(LABELS.get(p, p) for p in pols) + " |"
    rule = "|---:|" + "---:|" * len(pols)
    rows = [head, rule]
    for c in caps:
        cells = []
        for p in pols:
            v = ratio_at(report, c, p)
            cells.append("" if v is None else f"{v:.1%}")
        rows.append(f"| {_tokens(c)} ({c:,}) | " + " | ".join(cells) + " |")
    rows.append("| ∞ (maximum) | " + " | ".join(f"{best:.1%}" for _ in pols) + " |")
    checks = report["checks"]
    check_lines = [
        f"- Bélády MIN >= every policy at every capacity: **{'yes' if checks['belady_bounds_policies'] else 'NO'}**"
        + ("" if checks["belady_bounds_policies"] else f" ({'; '.join(checks['belady_beaten_at'])})"),
        f"- LRU non-decreasing in capacity: **{'yes' if checks['lru_non_decreasing'] else 'NO'}**",
        f"- every point at or below the maximum: **{'yes' if checks['all_below_max'] else 'NO'}**",
    ]
    paper = report["paper"]
    cmp = paper_comparison(report)
    out = [
        "# Prefix-cache hit ratio vs capacity and eviction policy",
        "",
        f"{t['requests']:,} requests from `{t['source']}` ({t['input_tokens_total']:,} prompt tokens, "
        f"{t['blocks']:,} blocks of {t['block_tokens']} tokens, {t['distinct_blocks']:,} distinct), "
        f"replayed in arrival order, one at a time, on the allocator's prefix cache with "
        f"{report['tokens_per_block']}-token blocks. Hit ratio = {report['definition']}.",
        "",
        *rows,
        "",
        *(["![hit ratio vs capacity](prefix_report.png)", ""] if png else []),
        *check_lines,
        "",
        "## Against the paper",
        "",
        "| | Mooncake paper | kvscope on the released trace |",
        "|---|---|---|",
        f"| maximum (infinite cache) | \"cache ratio\" {paper['cache_ratio']:.0%} (Table 2) | "
        f"{best:.1%} token-weighted; "
        + "; ".join(f"{v:.1%} {WEIGHTING_NAMES[k].split(' (')[0]}" for k, v in cmp["weightings"].items()
                    if k != "token_weighted") + " |",
        f"| {paper['local_cache_tokens']:,}-token local cache | under 50% of the maximum in most "
        f"workloads | "
        + ("; ".join(f"{LABELS.get(p, p)} {s:.0%} of max" for p, s in cmp["share_of_max_at_local"].items())
           or "not measured") + " |",
        "",
        gap_text(report),
        "",
        local_cache_text(report),
        "",
        *([prefix_sim.markdown(report["serving"])] if "serving" in report else []),
        f"*Bélády's MIN.* {report['bound_note']}",
        "",
        "*Method.* `workloads/prefix_curve.py`: each request opens a sequence named by its block "
        "hashes on a paged pool of capacity / tokens_per_block blocks with prefix caching, takes "
        "min(cached tokens, prompt) as its hit and closes (blocks released tail first); new "
        "blocks evict idle cached ones by the pool's policy. A prompt longer than the pool opens "
        "its first pool-sized part. FIFO orders blocks by when they were stored, a prompt's head "
        "first (as a prefill fills them).",
        "",
        "---",
        report["attribution"],
        "",
    ]
    return "\n".join(out)


def chart(report: dict, path: str | Path) -> None:
    """Hit ratio vs capacity (log x), one line per policy, the maximum dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = report["capacities_tokens"]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for p in report["policies"]:
        ys = [ratio_at(report, c, p) for c in caps]
        ax.plot(caps, [y * 100 for y in ys], marker="o", ms=4, label=LABELS.get(p, p),
                color=COLOURS.get(p), lw=2.2 if p == BOUND else 1.5)
    best = report["max_hit_ratio"] * 100
    ax.axhline(best, ls="--", color="#555", lw=1.2, label=f"maximum (infinite cache) {best:.1f}%")
    paper = report["paper"]
    ax.axhline(paper["cache_ratio"] * 100, ls=":", color="#b5179e", lw=1,
               label=f"paper's cache ratio {paper['cache_ratio']:.0%}")
    if caps[0] <= paper["local_cache_tokens"] <= caps[-1]:
        ax.axvline(paper["local_cache_tokens"], ls=":", color="#999", lw=1)
        ax.text(paper["local_cache_tokens"] * 1.08, 1, "3M-token local cache", fontsize=7, color="#666")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens, log scale)")
    ax.set_ylabel("prefix hit ratio (% of prompt tokens)")
    ax.set_ylim(0, max(45, best + 5))
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7.5, loc="upper left")
    t = report["trace"]
    ax.set_title(f"Prefix cache on {t['source']} ({t['requests']:,} requests, "
                 f"{report['tokens_per_block']}-token blocks)", fontsize=10)
    fig.text(0.01, 0.01, report["attribution"], fontsize=5.5, color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_prefix_report(report: dict, out_dir: str | Path, png: bool = True) -> list[Path]:
    """Write prefix_report.json, prefix_report.md and (optionally) prefix_report.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "prefix_report.json", out / "prefix_report.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(markdown(report, png))
    if png:
        chart(report, out / "prefix_report.png")
        paths.append(out / "prefix_report.png")
    return paths
