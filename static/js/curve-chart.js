// The bundled trace's hit ratio vs capacity (GET /api/prefix/curve) as a small uPlot chart, with
// the shown prefix-caching pool marked on it: a dashed line at its capacity, its live hit ratio
// as a point. Hidden for pools without prefix caching.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { curveData, formatTokens } from "./curve.js";

const HEIGHT = 150;
const REFRESH_MS = 500;
const AXIS = { stroke: "#8b95a7", grid: { stroke: "#1f2632", width: 1 }, ticks: { stroke: "#1f2632" }, font: "11px system-ui, sans-serif" };
/** One colour per policy (vocab order), MIN in white; unknown names cycle through the rest. */
const COLORS = { lru: "#4fc3f7", fifo: "#ffb74d", lfu: "#ba68c8", s3fifo: "#66bb6a", belady: "#eceff1" };
const SPARE = ["#f06292", "#9575cd", "#4db6ac"];
const MARKER = "#ffd54f";

/** Log axes tick 1..9 × each decade: label only the decades so the labels do not overlap. */
const isDecade = (v) => v > 0 && Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-9;

/**
 * @param {HTMLElement} root  an empty element, hidden until a prefix-caching pool is shown
 * @param {{load: () => Promise<import("./curve.js").CurveReport>}} deps
 */
export function createCurveChart(root, deps) {
  root.classList.add("chart", "curve-chart");
  root.dataset.chart = "prefix-curve";
  /** @type {Promise<any>|null} */
  let loading = null;
  /** @type {import("./curve.js").CurveReport|null} */
  let report = null;
  /** @type {uPlot|null} */
  let plot = null;
  /** @type {{capacity: number, hitRatio: number|null}|null} */
  let here = null;
  let pending = 0;
  let lastDraw = 0;

  function build() {
    const r = /** @type {import("./curve.js").CurveReport} */ (report);
    const { labels, data } = curveData(r, here);
    root.innerHTML = "";
    const title = document.createElement("div");
    title.className = "chart-title";
    root.appendChild(title);
    const series = labels.map((label, i) => {
      if (i < r.policies.length) {
        const stroke = COLORS[label] || SPARE[i % SPARE.length];
        return { label, stroke, width: 1.5, spanGaps: true, points: { show: true, size: 4, fill: stroke } };
      }
      if (i === r.policies.length) return { label, stroke: "#8b95a7", width: 1, dash: [6, 4], points: { show: false } };
      return { label, stroke: MARKER, width: 1, paths: () => null, points: { show: true, space: 0, size: 9, stroke: MARKER, fill: MARKER } };
    });
    plot = new uPlot({
      width: Math.max(220, root.clientWidth - 4),
      height: HEIGHT,
      scales: { x: { time: false, distr: 3, log: 10 }, y: { range: [0, Math.max(0.05, r.max_hit_ratio * 1.15)] } },
      axes: [
        { ...AXIS, values: (_u, ticks) => ticks.map((v) => (isDecade(v) ? formatTokens(v) : "")) },
        { ...AXIS, size: 40, values: (_u, ticks) => ticks.map((v) => `${Math.round(v * 100)}%`) },
      ],
      legend: { show: true, live: false },
      cursor: { show: true, drag: { x: false, y: false } },
      series: [{ label: "capacity (tokens)" }, ...series],
      hooks: { draw: [drawMarker] },
    }, data, root);
    retitle();
  }

  /** The dashed vertical line at the pool's capacity. */
  function drawMarker(/** @type {uPlot} */ u) {
    if (!here) return;
    const x = u.valToPos(here.capacity, "x", true);
    const { top, height } = u.bbox;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = MARKER;
    ctx.lineWidth = 1;
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
    ctx.restore();
  }

  function retitle() {
    const title = root.querySelector(".chart-title");
    if (!title || !report) return;
    const hr = here && here.hitRatio != null ? `${(here.hitRatio * 100).toFixed(1)}%` : "no lookups yet";
    const where = here ? ` · this pool ${formatTokens(here.capacity)} tokens, ${hr}` : "";
    title.textContent = `Hit ratio vs capacity, ${report.trace ? "Mooncake trace" : "bundled trace"}${where}`;
    root.title = report.definition || "";
  }

  function draw() {
    pending = 0;
    lastDraw = performance.now();
    if (!report) return;
    const xs = plot ? plot.data[0] : [];
    const { data } = curveData(report, here);
    // the x column changes only when the pool's capacity does: then rebuild, else just new data
    if (!plot || data[0].length !== xs.length || data[0].some((x, i) => x !== xs[i])) {
      if (plot) plot.destroy();
      build();
    } else {
      plot.setData(data);
    }
    retitle();
  }

  function schedule() {
    if (pending) return;
    const wait = Math.max(0, REFRESH_MS - (performance.now() - lastDraw));
    pending = window.setTimeout(() => window.requestAnimationFrame(draw), wait);
  }

  function fail(/** @type {Error} */ err) {
    loading = null; // try again on the next prefix-caching pool
    root.innerHTML = "";
    const msg = document.createElement("div");
    msg.className = "chart-title";
    msg.textContent = `capacity curve unavailable: ${err.message}`;
    root.appendChild(msg);
  }

  const ro = new ResizeObserver(() => {
    if (plot && !root.hidden) {
      const w = Math.max(220, root.clientWidth - 4);
      if (Math.abs(plot.width - w) > 2) plot.setSize({ width: w, height: HEIGHT });
    }
  });
  ro.observe(root);

  return {
    /** Show the pool on the curve, or hide the chart (null: no prefix-caching pool shown). */
    update(/** @type {{capacity: number, hitRatio: number|null}|null} */ point) {
      here = point;
      root.hidden = !point;
      if (!point) return;
      if (report) schedule();
      else if (!loading) {
        loading = deps.load().then((r) => {
          report = r;
          schedule();
        }, fail);
      }
    },
    /** What is drawn, for the browser tests: series labels, points per series, the pool's point. */
    summary() {
      if (!plot || root.hidden) return null;
      const u = plot;
      return {
        series: u.series.slice(1).map((s, i) => ({ label: s.label, dashed: Array.isArray(s.dash), points: u.data[i + 1].filter((v) => v != null).length })),
        xs: Array.from(u.data[0]),
        logX: u.scales.x.distr === 3,
        here,
      };
    },
    destroy() {
      ro.disconnect();
      if (plot) plot.destroy();
      plot = null;
      root.innerHTML = "";
    },
  };
}
