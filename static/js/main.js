// Wiring: one pool's stream -> model -> heatmap / charts / panels; controls; views.

import { api, fetchEvents, getToken, listPools, poolPath } from "./api.js";
import { createCharts } from "./charts.js";
import { createCompare } from "./compare.js";
import { createControls, promptToken } from "./controls.js";
import { PROTOCOL_VERSION } from "./frames.js";
import { createHeatmap, escapeHtml } from "./heatmap.js";
import { PoolModel, formatBytes } from "./model.js";
import { numbersHtml, renderAlerts, renderLog, selectedTypes } from "./panels.js";
import { createPoolSocket } from "./socket.js";

/** Panels (numbers, log, alerts) re-render at most this often; the map has its own rAF loop. */
const PANEL_REFRESH_MS = 250;

const $ = (sel) => /** @type {HTMLElement} */ (document.querySelector(sel));
const body = document.body;
const page = {
  protocol: Number(body.dataset.protocol || PROTOCOL_VERSION),
  tokenRequired: body.dataset.tokenRequired === "true",
  version: body.dataset.version || "",
};

const params = new URLSearchParams(window.location.search);
let poolName = params.get("pool") || "default";
let model = new PoolModel();
/** @type {ReturnType<typeof createPoolSocket>|null} */
let socket = null;
/** @type {ReturnType<typeof createHeatmap>|null} */
let heatmap = null;
/** @type {ReturnType<typeof createCharts>|null} */
let charts = null;
let panelTimer = 0;
let logDirty = true;

const controls = createControls({
  getPool: () => poolName,
  getModel: () => model,
  onPoolCreated: (name) => refreshPools(name),
  onPoolDeleted: () => refreshPools("default"),
  onTokenChanged: () => {
    if (socket) socket.reconnect();
    compare.reconnect();
  },
});
const compare = createCompare($("#compare-grid"), { status: (m, k) => setStatus($("#compare-status"), m, k) });

function setStatus(el, msg, kind = "info") {
  el.textContent = msg;
  el.dataset.kind = kind;
}

function setConn(state, detail) {
  const el = $("#conn");
  el.dataset.state = state;
  const label = { open: "live", connecting: "connecting", reconnecting: "reconnecting…", auth: "token needed", missing: "no such pool", closed: "closed" }[state] || state;
  /** @type {HTMLElement} */ (el.querySelector("span")).textContent = detail && state !== "open" ? `${label} (${detail})` : label;
  if (state === "auth") promptToken().then((ok) => ok && socket && socket.reconnect());
  $("#token-btn").hidden = !(page.tokenRequired || state === "auth" || getToken());
}

function schedulePanels() {
  if (panelTimer) return;
  panelTimer = window.setTimeout(renderPanels, PANEL_REFRESH_MS);
}

function renderPanels() {
  panelTimer = 0;
  $("#numbers").innerHTML = numbersHtml(model.stats, model.evictionsPerSec());
  renderAlerts($("#alerts"), model.alerts());
  if (logDirty) {
    renderLog($("#log"), model.events, selectedTypes($("#event-filters")));
    logDirty = false;
  }
  const c = model.stats && model.stats.cache;
  const badge = $("#policy-badge");
  badge.hidden = !c;
  if (c && c.policy) badge.textContent = `cache ${c.policy} · ${formatBytes(c.capacity_bytes)}`;
  controls.showProgress(model.workload);
}

function onJson(msg) {
  switch (msg.type) {
    case "hello":
      if (msg.protocol !== page.protocol) controls.status(`server speaks stream protocol ${msg.protocol}, page expects ${page.protocol}: reload`, "err");
      model.applyHello(msg);
      describePool();
      heatmap && heatmap.relayout();
      backfill(model.gapUpTo(msg.last_event_seq)); // events missed while disconnected
      break;
    case "resync":
      backfill(model.gapUpTo(msg.last_event_seq)); // the server dropped our backlog
      break;
    case "events":
      model.applyEvents(msg.events || [], msg.skipped || 0);
      logDirty = true;
      break;
    case "stats":
      model.applyStats(msg.stats);
      charts && charts.update();
      break;
    case "order":
      model.applyOrder(msg);
      heatmap && heatmap.schedule();
      break;
    case "progress":
      model.applyProgress(msg.workload);
      break;
    case "closed":
      controls.status(`stream closed: ${msg.reason}`, "err");
      break;
    default:
      break;
  }
  schedulePanels();
}

/**
 * Fetch the events of a hole in the log and slot them in; a failed fetch leaves a "skipped" row.
 * @param {import("./model.js").EventGap|null} gap
 */
async function backfill(gap) {
  if (!gap) return;
  const forModel = model;
  let page = { events: [], last_seq: gap.upto };
  try {
    page = await fetchEvents(poolName, gap);
  } catch {
    // the hole is then reported as skipped events: nothing else to do
  }
  if (forModel !== model) return; // the user switched pools meanwhile
  model.applyBackfill(gap, page);
  logDirty = true;
  schedulePanels();
}

function describePool() {
  const c = model.config;
  if (!c) return;
  const extra = [c.strategy, c.fit ? `${c.fit}-fit` : "", `${Number(c.num_blocks).toLocaleString()} × ${formatBytes(c.block_bytes)}`, c.device].filter(Boolean);
  $("#pool-meta").textContent = extra.join(" · ");
}

function connect(name) {
  if (socket) socket.close();
  if (heatmap) heatmap.destroy();
  if (charts) charts.destroy();
  poolName = name;
  model = new PoolModel();
  heatmap = createHeatmap($("#heatmap"), model, { fetchAllocation: (id) => api("GET", `${poolPath(poolName)}/allocations/${id}`) });
  charts = createCharts($("#charts"), model);
  logDirty = true;
  renderPanels();
  socket = createPoolSocket(
    name,
    {
      onJson,
      onFrame: (frame) => {
        model.applyFrame(frame);
        heatmap && heatmap.schedule();
      },
      onState: setConn,
      onError: (err) => controls.status(`bad frame: ${err.message}`, "err"),
    },
    { token: getToken },
  );
  const url = new URL(window.location.href);
  url.searchParams.set("pool", name);
  window.history.replaceState(null, "", url);
}

async function refreshPools(select) {
  const sel = /** @type {HTMLSelectElement} */ ($("#pool-select"));
  let names = [];
  try {
    names = await listPools();
  } catch (err) {
    controls.status(`could not list pools: ${/** @type {Error} */ (err).message}`, "err");
  }
  if (select && !names.includes(select)) names.push(select);
  if (!names.includes(poolName)) names.push(poolName);
  const current = Array.from(sel.options, (o) => o.value);
  // rebuilding the options of an open <select> would close it: only touch them on a change
  if (current.join("\n") !== names.join("\n")) {
    sel.innerHTML = names.map((n) => `<option value="${escapeHtml(n)}">${escapeHtml(n)}</option>`).join("");
  }
  const target = select || poolName;
  sel.value = target;
  if (!socket || target !== poolName) connect(target);
}

$("#pool-select").addEventListener("change", (ev) => connect(/** @type {HTMLSelectElement} */ (ev.target).value));
$("#pool-select").addEventListener("focus", () => refreshPools());
$("#event-filters").addEventListener("change", () => {
  logDirty = true;
  renderPanels();
});
$("#b-clear-log").addEventListener("click", () => {
  model.clearEvents();
  logDirty = true;
  renderPanels();
});
$("#token-btn").addEventListener("click", () => promptToken().then((ok) => ok && socket && socket.reconnect()));

function showView(view) {
  document.querySelectorAll("[data-view]").forEach((b) => b.classList.toggle("on", /** @type {HTMLElement} */ (b).dataset.view === view));
  $("#view-dashboard").hidden = view !== "dashboard";
  $("#view-compare").hidden = view !== "compare";
  $("#alerts").hidden = view !== "dashboard"; // they are about the dashboard's pool, not the compared ones
  if (view === "compare") compare.show();
  else compare.hide();
  if (window.location.hash !== `#${view}`) window.history.replaceState(null, "", view === "dashboard" ? window.location.pathname + window.location.search : `#${view}`);
}
document.querySelectorAll("[data-view]").forEach((b) => b.addEventListener("click", () => showView(/** @type {HTMLElement} */ (b).dataset.view || "dashboard")));

refreshPools(poolName);
showView(window.location.hash === "#compare" ? "compare" : "dashboard");

/**
 * Read-only debug hook for the browser tests and the benchmark. Nothing here changes state.
 */
Object.defineProperty(window, "kvscope", {
  value: Object.freeze({
    get pool() {
      return poolName;
    },
    get connection() {
      return socket ? socket.state : "closed";
    },
    paintedCounts: () => (heatmap ? heatmap.paintedCounts() : null),
    paintStats: () => (heatmap ? heatmap.paintStats() : null),
    modelCounts: () => model.countStates(),
    /** Distinct owner ids on the map, ascending (the browser tests compare them to REST). */
    owners: () => Array.from(new Set(model.owner)).filter((o) => o >= 0).sort((a, b) => a - b),
    stats: () => model.stats,
    alerts: () => model.alerts(),
    events: () => model.events.slice(),
    lastFrame: () => model.lastFrame,
    compare: () => compare.summary(),
    version: page.version,
  }),
});
