// Compare view: the same scenario on two or three pools of equal size, side by side, so that
// external fragmentation visibly forms on the contiguous arena and not on the paged pool.

import { ApiError, pool as poolApi, pools as poolsApi } from "./api.js";
import uPlot from "../vendor/uplot/uPlot.esm.js";
import { feedPool } from "./feed.js";
import { createHeatmap } from "./heatmap.js";
import { escapeHtml } from "./dom.js";
import { PoolModel, formatBytes, parseSize, pct } from "./model.js";
import { PANEL_REFRESH_MS, renderAlerts } from "./panels.js";
import { scatterFails, usesCache, usesPrefix } from "./vocab.js";

const SPARK_HEIGHT = 90;

/** A small utilization / external-fragmentation chart for one pane. @param {HTMLElement} box */
function sparkline(box) {
  const axis = { stroke: "#8b95a7", grid: { stroke: "#1f2632" }, ticks: { show: false }, font: "10px system-ui" };
  const plot = new uPlot(
    {
      width: Math.max(200, box.clientWidth),
      height: SPARK_HEIGHT,
      legend: { show: false },
      cursor: { show: false },
      scales: { x: { time: true }, y: { range: [0, 1] } },
      axes: [{ ...axis, show: false }, { ...axis, size: 36, values: (_u, t) => t.map((v) => `${Math.round(v * 100)}%`) }],
      series: [
        {},
        { label: "utilization", stroke: "#4fc3f7", fill: "rgba(79,195,247,0.10)", width: 1.5, points: { show: false } },
        { label: "external frag", stroke: "#ef5350", width: 1.5, points: { show: false } },
      ],
    },
    [[], [], []],
    box,
  );
  // the grid decides the pane's width only after every pane exists
  const ro = new ResizeObserver(() => plot.setSize({ width: Math.max(200, box.clientWidth), height: SPARK_HEIGHT }));
  ro.observe(box);
  return { setData: (d) => plot.setData(d), destroy: () => (ro.disconnect(), plot.destroy()) };
}

/** @param {string} strategy */
const poolNameFor = (strategy) => `cmp-${strategy}`;
/** A scenario that opens sequences compares prefix caching on and off on two paged pools. */
const PREFIX_PANES = [
  { name: "cmp-prefix-on", strategy: "paged", prefix: true },
  { name: "cmp-prefix-off", strategy: "paged", prefix: false },
];

/**
 * @param {HTMLElement} grid
 * @param {{status: (msg: string, kind?: string) => void}} env
 */
export function createCompare(grid, env) {
  /** @type {{name:string, strategy:string, model:PoolModel, socket:any, heatmap:any, spark:any, peakExt:number, prefix?:boolean, numbers:HTMLElement, alerts:HTMLElement, verdict:HTMLElement, conn:HTMLElement}[]} */
  let panes = [];
  let timer = 0;
  const form = /** @type {HTMLFormElement} */ (document.getElementById("f-compare"));

  function teardown() {
    for (const p of panes) {
      p.socket.close();
      p.heatmap.destroy();
      p.spark.destroy();
    }
    panes = [];
    grid.innerHTML = "";
  }

  function render() {
    timer = 0;
    for (const p of panes) {
      const s = p.model.stats;
      const w = p.model.workload;
      const o = (s && s.ooms) || { capacity: 0, fragmentation: 0 };
      if (s) p.peakExt = Math.max(p.peakExt, s.external_fragmentation || 0);
      const cols = p.model.history.toArrays();
      p.spark.setData([cols[0], cols[1], cols[3]]);
      // Where scattered free space never fails a request (paged): show it, but as what it is.
      const paged = s ? s.scatter_fails === false : !scatterFails(p.strategy);
      const extCls = (v) => (paged ? "calm" : v >= 0.5 ? "hot" : "");
      p.numbers.innerHTML = s
        ? `<span><label>util</label><b>${pct(s.utilization)}</b></span>
           <span><label>${paged ? "scatter (never fails)" : "ext frag"}</label><b class="${extCls(s.external_fragmentation)}">${pct(s.external_fragmentation)}</b></span>
           <span><label>${paged ? "peak scatter" : "peak ext frag"}</label><b class="${extCls(p.peakExt)}">${pct(p.peakExt)}</b></span>
           <span><label>largest free</label><b>${formatBytes(s.largest_free_bytes)}</b></span>
           <span><label>OOM cap / frag</label><b class="${o.fragmentation ? "hot" : ""}">${o.capacity} / ${o.fragmentation}</b></span>
           <span><label>int frag</label><b>${pct(s.internal_fragmentation)}</b></span>
           <span><label>free extents</label><b>${s.free_extent_count ?? "—"}</b></span>
           ${p.prefix === undefined ? "" : `<span><label>prefix hit</label><b class="prefix-hit">${s.prefix ? pct(s.prefix.hit_ratio) : "off: every prompt computed"}</b></span>`}
           <span><label>workload</label>${w && w.state === "failed"
             ? `<b class="small hot" title="${escapeHtml(w.error || "")}">failed ${w.done}/${w.total}: ${escapeHtml(w.error || "unknown error")}</b>`
             : `<b class="small">${w ? `${w.state} ${w.done}/${w.total}` : "—"}</b>`}</span>`
        : `<span class="muted">waiting for stats…</span>`;
      const fragOom = p.model.alerts().some((a) => a.code === "oom-fragmentation");
      p.verdict.hidden = fragOom || !s;
      if (!fragOom && s) {
        const ended = w && w.state !== "running" && w.state !== "failed";
        p.verdict.className = `cmp-verdict ${paged || o.fragmentation === 0 && ended ? "ok" : "wait"}`;
        p.verdict.textContent = paged
          ? "No OOM with memory free, ever: any free block serves any request."
          : ended ? "No OOM with memory free in this run."
          : w && w.state === "failed" ? "No OOM with memory free before the workload failed." : "No OOM with memory free so far.";
      }
      renderAlerts(p.alerts, p.model.alerts().filter((a) => a.code === "oom-fragmentation"));
    }
  }

  function scheduleRender() {
    if (!timer) timer = window.setTimeout(render, PANEL_REFRESH_MS);
  }

  /** @param {string} strategy @param {string} [poolName] @param {boolean} [prefix] */
  function openPane(strategy, poolName, prefix) {
    const name = poolName || poolNameFor(strategy);
    const box = document.createElement("section");
    box.className = "panel compare-pane";
    box.dataset.pool = name;
    box.innerHTML = `<div class="panel-head"><h2>${name}</h2><span class="conn small" data-state="connecting"><i></i><span></span></span></div>
      <div class="cmp-alerts"></div><div class="cmp-verdict" hidden></div><div class="cmp-numbers"></div>
      <div class="cmp-spark"><span class="hint"><i class="sw util"></i> utilization <i class="sw frag"></i> ${scatterFails(strategy) ? "external fragmentation" : "free-space scatter (harmless here)"}</span></div>
      <div class="cmp-map"></div>`;
    grid.appendChild(box);
    const model = new PoolModel();
    const heatmap = createHeatmap(/** @type {HTMLElement} */ (box.querySelector(".cmp-map")), model, {
      compact: true,
      fetchAllocation: (id) => poolApi(name).allocation(id),
    });
    const conn = /** @type {HTMLElement} */ (box.querySelector(".conn"));
    // the panes have no log, but missed oom/defragment events decide their banner: feedPool backfills them
    const socket = feedPool(name, model, {
      onMessage: (msg) => {
        if (msg.type === "hello") heatmap.relayout();
        scheduleRender();
      },
      onFrame: () => heatmap.schedule(),
      onBackfill: scheduleRender,
      onState: (st) => {
        conn.dataset.state = st;
      },
    });
    const spark = sparkline(/** @type {HTMLElement} */ (box.querySelector(".cmp-spark")));
    panes.push({
      name,
      strategy,
      model,
      socket,
      heatmap,
      spark,
      peakExt: 0,
      prefix,
      numbers: /** @type {HTMLElement} */ (box.querySelector(".cmp-numbers")),
      alerts: /** @type {HTMLElement} */ (box.querySelector(".cmp-alerts")),
      verdict: /** @type {HTMLElement} */ (box.querySelector(".cmp-verdict")),
      conn,
    });
  }

  /**
   * What the form asks for, checked before anything is created or deleted.
   * @returns {{pools: {name: string, strategy: string}[], workload: {kind: string, name: string, speed: number, seed: number}}}
   */
  function readForm() {
    const f = /** @type {any} */ (form);
    const size = parseSize(f.block_bytes.value);
    if (!size || !("bytes" in size)) throw new Error(`not a block size: ${f.block_bytes.value}`);
    const numBlocks = Number(f.num_blocks.value);
    if (!Number.isInteger(numBlocks) || numBlocks < 1) throw new Error(`not a block count: ${f.num_blocks.value}`);
    const speed = Number(f.speed.value);
    if (!(speed > 0)) throw new Error(`not a speed: ${f.speed.value}`);
    const seed = Number(f.seed.value);
    if (!Number.isInteger(seed)) throw new Error(`not a seed: ${f.seed.value}`);
    const workload = { kind: "scenario", name: f.name.value, speed, seed };
    if (usesPrefix(workload.name)) {
      const pools = PREFIX_PANES.map((p) => ({
        name: p.name,
        strategy: p.strategy,
        num_blocks: numBlocks,
        block_bytes: size.bytes,
        tokens_per_block: 16,
        ...(p.prefix ? { prefix_caching: { policy: "lru" } } : {}),
      }));
      return { pools, workload };
    }
    /** @type {string[]} */
    const strategies = Array.from(form.querySelectorAll("input[name=strategy]:checked"), (el) => /** @type {HTMLInputElement} */ (el).value);
    if (!strategies.length) throw new Error("tick at least one strategy");
    const pools = strategies.map((strategy) => ({
      name: poolNameFor(strategy),
      strategy,
      num_blocks: numBlocks,
      block_bytes: size.bytes,
      // the cache's capacity defaults to the whole pool, so every pool serves the same entries
      ...(usesCache(workload.name) ? { cache: {} } : {}),
    }));
    return { pools, workload };
  }

  async function setupAndRun() {
    const { pools, workload } = readForm();
    teardown();
    const existing = new Set(await poolsApi.names());
    for (const body of pools) {
      if (existing.has(body.name)) await poolApi(body.name).delete(); // a fresh pool per run
      await poolsApi.create(body);
      openPane(body.strategy, body.name, usesPrefix(workload.name) ? Boolean(body.prefix_caching) : undefined);
    }
    await Promise.all(pools.map((p) => poolApi(p.name).startWorkload(workload)));
    return `running ${workload.name} (seed ${workload.seed}) on ${pools.map((p) => p.name).join(", ")}`;
  }

  async function each(label, fn) {
    try {
      await Promise.all(panes.map((p) => fn(p)));
      env.status(`${label}: done`, "ok");
    } catch (err) {
      env.status(`${label}: ${/** @type {Error} */ (err).message}`, "err");
    }
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    env.status("setting up…");
    try {
      env.status(await setupAndRun(), "ok");
    } catch (err) {
      env.status(`compare: ${/** @type {Error} */ (err).message}`, "err");
    }
  });
  document.getElementById("b-compare-defrag")?.addEventListener("click", () =>
    each("defragment", (p) => poolApi(p.name).defragment()),
  );
  document.getElementById("b-compare-stop")?.addEventListener("click", () =>
    each("stop", (p) => poolApi(p.name).stopWorkload().catch((e) => (e instanceof ApiError && e.status === 404 ? null : Promise.reject(e)))),
  );

  return {
    show() {
      for (const p of panes) p.heatmap.relayout();
    },
    reconnect() {
      for (const p of panes) p.socket.reconnect();
    },
    /** Read-only summary for tests: per pool, the latest stats numbers and painted cells. */
    summary() {
      return panes.map((p) => ({
        pool: p.name,
        strategy: p.strategy,
        connection: p.socket.state,
        stats: p.model.stats,
        peakExternalFragmentation: p.peakExt,
        workload: p.model.workload,
        painted: p.heatmap.paintedCounts(),
        alerts: p.model.alerts().map((a) => a.code),
      }));
    },
  };
}
