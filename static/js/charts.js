// Time-series charts (vendored uPlot) over the model's stats history, or over columns rebuilt
// from the pool's history (series.js) while the timeline shows the past or a recording.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { scatterFails } from "./vocab.js";

/** Charts redraw at most this often; stats arrive ~4/s and uPlot's setData redraws everything. */
export const CHART_REFRESH_MS = 500;
const CHART_HEIGHT = 130;

const AXIS = { stroke: "#8b95a7", grid: { stroke: "#1f2632", width: 1 }, ticks: { stroke: "#1f2632" }, font: "11px system-ui, sans-serif" };
const pctAxis = { ...AXIS, size: 44, values: (_u, ticks) => ticks.map((v) => `${Math.round(v * 100)}%`) };

/** Before two samples exist uPlot would span years: show the last minute instead. */
function liveRange(_u, min, max) {
  if (min == null || max == null || !Number.isFinite(min) || !Number.isFinite(max)) {
    const now = Date.now() / 1000;
    return [now - 60, now];
  }
  return max - min < 1 ? [max - 60, max + 1] : [min, max];
}

const EXT_LABEL = "external frag";
const SCATTER_LABEL = "free scatter (harmless here)";

/** Chart definitions: which history columns (see model.HISTORY_SERIES) each one shows. */
const CHARTS = [
  {
    id: "memory",
    title: "Memory",
    cols: [1, 2, 3],
    series: [
      { label: "utilization", stroke: "#4fc3f7", fill: "rgba(79,195,247,0.10)", width: 1.5 },
      { label: "internal frag", stroke: "#ffb74d", width: 1.5 },
      { label: EXT_LABEL, stroke: "#ef5350", width: 1.5 },
    ],
    range: [0, 1],
    axis: pctAxis,
  },
  {
    id: "cache",
    title: "Cache",
    cols: [5, 4],
    series: [
      { label: "hit rate", stroke: "#66bb6a", width: 1.5, scale: "pct" },
      { label: "evictions/s", stroke: "#ba68c8", width: 1.5, scale: "rate" },
    ],
    dual: true,
  },
  {
    id: "ooms",
    title: "OOMs (total)",
    cols: [6, 7],
    series: [
      { label: "capacity", stroke: "#90a4ae", width: 1.5, paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "fragmentation", stroke: "#ef5350", width: 1.5, paths: uPlot.paths.stepped({ align: 1 }) },
    ],
  },
];

/**
 * @param {HTMLElement} root
 * @param {import("./model.js").PoolModel} model
 */
export function createCharts(root, model) {
  root.classList.add("charts");
  /** Time (unix s) of the moment the timeline shows, drawn as a dashed line; null when live. @type {number|null} */
  let markTs = null;
  /** Columns rebuilt from the history (model.HISTORY_SERIES order) shown instead of the live samples, or null. @type {(number|null)[][]|null} */
  let past = null;
  /** The x range: the live samples' (the last minute at first), or exactly the past columns' span. */
  function xRange(u, min, max) {
    if (!past) return liveRange(u, min, max);
    if (min == null || max == null || !Number.isFinite(min) || !Number.isFinite(max)) return liveRange(u, min, max);
    return max > min ? [min, max] : [min - 1, max + 1];
  }
  /** @param {uPlot} u */
  function drawMark(u) {
    if (markTs == null) return;
    const x = u.valToPos(markTs, "x", true);
    if (!(x >= u.bbox.left && x <= u.bbox.left + u.bbox.width)) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#e6edf3";
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.restore();
  }
  const plots = CHARTS.map((def) => {
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = def.id;
    box.innerHTML = `<div class="chart-title">${def.title}</div>`;
    root.appendChild(box);
    // a single sample would make uPlot span years; show the last minute instead
    const scales = { x: { time: true, range: xRange } };
    let axes;
    if (def.dual) {
      scales.pct = { range: [0, 1] };
      scales.rate = { range: (_u, _min, max) => [0, Math.max(1, max * 1.1)] };
      axes = [AXIS, { ...pctAxis, scale: "pct" }, { ...AXIS, scale: "rate", side: 1, size: 40, grid: { show: false } }];
    } else if (def.range) {
      scales.y = { range: def.range };
      axes = [AXIS, def.axis];
    } else {
      scales.y = { range: (_u, _min, max) => [0, Math.max(1, max * 1.15)] };
      axes = [AXIS, { ...AXIS, size: 40 }];
    }
    const opts = {
      width: 300,
      height: CHART_HEIGHT,
      scales,
      axes,
      legend: { show: true, live: false },
      cursor: { show: true, points: { show: false }, drag: { x: false, y: false } },
      series: [{}, ...def.series.map((s) => ({ ...s, points: { show: false }, spanGaps: false }))],
      hooks: { draw: [drawMark] },
    };
    const plot = new uPlot(opts, [[], ...def.series.map(() => [])], box);
    return { def, plot, box };
  });

  let lastDraw = 0;
  let pending = 0;
  let labelled = "";

  /** Where scattered free space never fails a request (paged), "external frag" is only scatter; say so in the legend. */
  function label(scatterFails) {
    const text = scatterFails ? EXT_LABEL : SCATTER_LABEL;
    if (text === labelled) return;
    labelled = text;
    const labels = Array.from(plots[0].box.querySelectorAll(".u-legend .u-series .u-label"));
    const el = labels.find((l) => l.textContent === EXT_LABEL || l.textContent === SCATTER_LABEL);
    if (el) el.textContent = text;
  }

  function draw() {
    pending = 0;
    if (model.config) label(model.stats ? model.stats.scatter_fails !== false : scatterFails(model.config.strategy));
    lastDraw = performance.now();
    const cols = past || model.history.toArrays();
    for (const { def, plot } of plots) {
      plot.setData([cols[0], ...def.cols.map((c) => cols[c])]);
      if (cols[0].length < 2) {
        const [min, max] = xRange(null, cols[0][0], cols[0][0]);
        plot.setScale("x", { min, max });
      }
    }
  }

  /** Redraw soon, throttled to CHART_REFRESH_MS. */
  function update() {
    if (pending) return;
    const wait = Math.max(0, CHART_REFRESH_MS - (performance.now() - lastDraw));
    pending = window.setTimeout(() => window.requestAnimationFrame(draw), wait);
  }

  function resize() {
    for (const { plot, box } of plots) {
      const w = Math.max(200, box.clientWidth - 4);
      if (Math.abs(plot.width - w) > 2) plot.setSize({ width: w, height: CHART_HEIGHT });
    }
  }
  const ro = new ResizeObserver(resize);
  ro.observe(root);
  resize();

  return {
    update,
    /** Mark the moment the timeline shows (unix s), or null for none (live). @param {number|null} ts */
    mark(ts) {
      markTs = ts;
      for (const { plot } of plots) plot.redraw(false, false);
    },
    marked: () => markTs,
    /**
     * Draw these columns (rebuilt from the history) instead of the live samples; null: live again.
     * @param {(number|null)[][]|null} cols
     */
    showPast(cols) {
      past = cols;
      window.clearTimeout(pending);
      pending = 0;
      draw();
    },
    /** What is drawn: {source: "live"|"past", points, first, last (unix s), utilization (the newest)}. */
    summary() {
      const cols = past || model.history.toArrays();
      const n = cols[0].length;
      return { source: past ? "past" : "live", points: n, first: n ? cols[0][0] : null, last: n ? cols[0][n - 1] : null,
        utilization: n ? cols[1][n - 1] : null, utilizations: cols[1].slice() };
    },
    destroy() {
      ro.disconnect();
      for (const { plot } of plots) plot.destroy();
      root.innerHTML = "";
    },
  };
}
