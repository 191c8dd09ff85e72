"""The routing report: route_report.json (`{"results": [row, ...]}`), route_report.md and
route_report.png (hit ratio against imbalance per policy; TTFT CDFs in serving mode)."""

from __future__ import annotations

import json
from pathlib import Path

from ..mooncake import ATTRIBUTION

# (key, header, format) of the Markdown table; serving rows add SERVING_COLUMNS.
COLUMNS = [
    ("policy", "Policy", "{}"),
    ("replicas", "N", "{}"),
    ("capacity_tokens", "Capacity (tokens)", "{:,}"),
    ("hit_ratio", "Hit ratio", "{:.1%}"),
    ("imbalance", "Imbalance", "{:.2f}"),
    ("duplicated_blocks", "Duplicated blocks", "{:,}"),
    ("pooled_bound_hit_ratio", "Pooled bound", "{:.1%}"),
    ("of_pooled_bound", "Of pooled bound", "{:.0%}"),
    ("infinite_bound_hit_ratio", "Infinite bound", "{:.1%}"),
]
SERVING_COLUMNS = [
    ("available_hit_ratio", "Available hit", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.2f}"),
    ("throughput_rps", "Req/s", "{:.2f}"),
]
# Drawing limits: the CDF panel stays readable with this many curves.
MAX_CDF_CURVES = 12
MAX_BOUND_LINES = 4  # the hit-ratio panel draws each (N, C)'s pooled bound up to this many


def public_rows(rows: list[dict]) -> list[dict]:
    """The rows as written to JSON (the TTFT CDF points stay: they are what the chart draws)."""
    return [dict(r) for r in rows]


def _cell(row: dict, key: str, fmt: str) -> str:
    if key not in row:
        return ""
    return "—" if row[key] is None else fmt.format(row[key])


def markdown(rows: list[dict], trace: dict, png: bool = True) -> str:
    cols = COLUMNS + (SERVING_COLUMNS if any(r["mode"] == "serving" for r in rows) else [])
    head = "| " + " | ".join(h for _, h, _ in cols) + " |"
    rule = "|---|" + "---:|" * (len(cols) - 1)
    lines = [head, rule]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, k, f) for k, _, f in cols) + " |")
    mode = rows[0]["mode"] if rows else "sequence"
    what = ("Sequence mode: requests in arrival order over N LRU caches of 512-token blocks, "
            "no time; load-aware policies see the work routed so far."
            if mode == "sequence" else
            "Serving mode: the trace at its timestamps through N simulated replicas (prefill of "
            "uncached tokens, decode, queueing); TTFT in simulated seconds.")
    return "\n".join([
        "# Routing report",
        "",
        f"Input: {trace.get('source', '?')}, {trace.get('requests', 0):,} requests. {what}",
        "Hit ratio: prompt tokens found cached, over prompt tokens. Imbalance: the busiest "
        "replica's input tokens over the mean. Duplicated blocks: distinct blocks cached on two "
        "or more replicas at the end. Pooled bound: Bélády's MIN over one cache of all N "
        "replicas' blocks (N x C), the most any routing of these requests over N replicas of C "
        "could hit; of pooled bound: the hit ratio over it. Infinite bound: a cache that never "
        "evicts (docs/ROUTING.md, Bounds).",
        "",
        *lines,
        "",
        *(["![hit ratio against imbalance](route_report.png)", ""] if png else []),
        ATTRIBUTION,
        "",
    ])


def chart(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    serving = [r for r in rows if r.get("ttft_cdf_s")]
    fig, axes = plt.subplots(1, 2 if serving else 1, figsize=(13 if serving else 7, 5))
    ax = axes[0] if serving else axes
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>pPX*h"
    for k, p in enumerate(policies):
        pts = [r for r in rows if r["policy"] == p]
        ax.scatter([r["imbalance"] for r in pts], [r["hit_ratio"] for r in pts], label=p,
                   marker=markers[k % len(markers)], s=40, color=colors[k % len(colors)])
    bounds = {(r["replicas"], r["capacity_tokens"]): r["pooled_bound_hit_ratio"]
              for r in rows if "pooled_bound_hit_ratio" in r}
    if len(bounds) <= MAX_BOUND_LINES:  # more would hide the points
        for (n, cap), b in bounds.items():
            ax.axhline(b, color="0.6", linestyle=":", linewidth=1)
            ax.annotate(f"pooled bound N={n} x {cap:,}", (0, b), xycoords=("axes fraction", "data"),
                        xytext=(4, 2), textcoords="offset points", fontsize=7, color="0.45")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("imbalance (max / mean input tokens per replica, log scale)")
    ax.set_ylabel("hit ratio")
    ax.set_title("Reuse against load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if serving:
        # one curve per policy, all at the largest N and capacity of the sweep
        n = max(r["replicas"] for r in serving)
        cap = max(r["capacity_tokens"] for r in serving if r["replicas"] == n)
        cdf = axes[1]
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for r in [r for r in serving if (r["replicas"], r["capacity_tokens"]) == (n, cap)][:MAX_CDF_CURVES]:
            xs = r["ttft_cdf_s"]
            ys = [i / (len(xs) - 1) for i in range(len(xs))]
            k = policies.index(r["policy"])
            cdf.plot(xs, ys, label=r["policy"], color=colors[k % len(colors)],
                     linestyle="-" if k < len(colors) else "--")
        cdf.set_xscale("symlog", linthresh=0.1)
        cdf.set_xlabel("TTFT (simulated s)")
        cdf.set_ylabel("fraction of requests")
        cdf.set_title(f"TTFT CDF, N={n}, {cap:,} tokens per replica")
        cdf.grid(alpha=0.3)
        cdf.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_route_report(rows: list[dict], trace: dict, out_dir: str | Path,
                       png: bool = True) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "route_report.json", out / "route_report.md"]
    paths[0].write_text(json.dumps({"results": public_rows(rows)}, indent=1) + "\n")
    paths[1].write_text(markdown(rows, trace, png))
    if png:
        paths.append(chart(rows, out / "route_report.png"))
    return paths
