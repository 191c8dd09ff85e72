// Wiring: one pool's stream -> model -> heatmap / charts / panels; controls; views.

import { getToken, pool as poolApi, pools, prefixCurve, setToken } from "./api.js";
import { createCharts } from "./charts.js";
import { createCompare } from "./compare.js";
import { createControls, promptToken } from "./controls.js";
import { poolOnCurve } from "./curve.js";
import { createCurveChart } from "./curve-chart.js";
import { createFleetView } from "./fleet-view.js";
import { escapeHtml } from "./dom.js";
import { feedPool } from "./feed.js";
import { PROTOCOL_VERSION } from "./frames.js";
import { createHeatmap } from "./heatmap.js";
import { PoolModel, formatBytes } from "./model.js";
import { FOREST_REFRESH_MS, describeMirror, mirrorAlerts } from "./mirror.js";
import { PANEL_REFRESH_MS, numbersHtml, renderAlerts, renderLog, selectedTypes } from "./panels.js";
import { createRoutingView } from "./routing.js";
import { SERIES_POINTS, createSeriesLoader, isRecording, seriesRange } from "./series.js";
import { createTimeline } from "./timeline.js";

const $ = (sel) => /** @type {HTMLElement} */ (document.querySelector(sel));
const body = document.body;
const page = {
  protocol: Number(body.dataset.protocol || PROTOCOL_VERSION),
  tokenRequired: body.dataset.tokenRequired === "true",
  version: body.dataset.version || "",
};

const params = new URLSearchParams(window.location.search);
// A token in the address (the link `kvscope serve` prints) goes to this tab's session storage
// and out of the address bar, history and any Referer.
if (params.get("token")) {
  setToken(params.get("token"));
  params.delete("token");
  const clean = new URL(window.location.href);
  clean.searchParams.delete("token");
  window.history.replaceState(null, "", clean);
}
// "" until one is shown: without ?pool= the page shows the first pool the server lists
// (`default` unless someone deleted it), or says there is none.
let poolName = params.get("pool") || "";
let model = new PoolModel();
/** @type {ReturnType<typeof feedPool>|null} */
let socket = null;
/** @type {ReturnType<typeof createHeatmap>|null} */
let heatmap = null;
/** @type {ReturnType<typeof createCharts>|null} */
let charts = null;
/** @type {ReturnType<typeof createTimeline>|null} */
let timeline = null;
/** Keeps the charts on the stretch of history the timeline calls for (series.js). @type {ReturnType<typeof createSeriesLoader>|null} */
let seriesLoader = null;
/** The past moment shown instead of the live pool (timeline), or null when live. @type {PoolModel|null} */
let pastModel = null;
let panelTimer = 0;
let logDirty = true;
/** The bundled trace's capacity curve beside the live charts, with a prefix-caching pool on it. */
const curve = createCurveChart($("#prefix-curve"), { load: prefixCurve });

const controls = createControls({
  getPool: () => poolName,
  getModel: () => model,
  onPoolCreated: (name) => refreshPools(name),
  onPoolDeleted: () => showFirstPool(),
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

/** A mirror pool's prefix forest (GET /forest), refreshed every FOREST_REFRESH_MS while shown. */
let mirrorForest = null;
let forestAt = 0;
let forestPool = "";

function refreshForest() {
  const c = model.config;
  if (!c || c.strategy !== "mirror") {
    mirrorForest = null;
    return;
  }
  const now = Date.now();
  if (forestPool === poolName && now - forestAt < FOREST_REFRESH_MS) return;
  if (forestPool !== poolName) mirrorForest = null;
  forestAt = now;
  forestPool = poolName;
  const name = poolName;
  poolApi(name).forest().then((f) => {
    if (name === poolName) {
      mirrorForest = f;
      schedulePanels();
    }
  }).catch(() => {});
}

function renderPanels() {
  panelTimer = 0;
  const shown = pastModel || model;
  $("#numbers").innerHTML = numbersHtml(shown.stats, pastModel ? 0 : model.evictionsPerSec(), mirrorForest);
  renderAlerts($("#alerts"), model.alerts().concat(mirrorAlerts(model.stats)));
  refreshForest();
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

/** What the dashboard draws besides the model, per stream message (the model applied it already). */
function onMessage(msg) {
  switch (msg.type) {
    case "hello":
      if (model.restarted) controls.status("server restarted, history reset", "err");
      if (msg.protocol !== page.protocol) controls.status(`server speaks stream protocol ${msg.protocol}, page expects ${page.protocol}: reload`, "err");
      describePool();
      followSeries();
      heatmap && heatmap.relayout();
      curve.update(poolOnCurve(model.config, model.stats));
      break;
    case "events":
      logDirty = true;
      break;
    case "stats":
      charts && charts.update();
      curve.update(poolOnCurve(model.config, model.stats));
      break;
    case "order":
      heatmap && heatmap.schedule();
      break;
    case "closed":
      controls.status(`stream closed: ${msg.reason}`, "err");
      break;
    default:
      break;
  }
  schedulePanels();
}

function describePool() {
  const c = model.config;
  if (!c) return;
  // a mirror is read-only: app.css hides the controls that would only be refused
  body.dataset.strategy = c.strategy;
  if (c.strategy === "mirror") {
    $("#pool-meta").textContent = describeMirror(c);
    return;
  }
  const extra = [c.strategy, c.fit ? `${c.fit}-fit` : "", `${Number(c.num_blocks).toLocaleString()} × ${formatBytes(c.block_bytes)}`, c.device].filter(Boolean);
  $("#pool-meta").textContent = extra.join(" · ");
}

/** Draw the map of `shownModel` (the live model, or a past moment from the timeline). @param {PoolModel} shownModel */
function drawMap(shownModel) {
  if (heatmap) heatmap.destroy();
  heatmap = createHeatmap($("#heatmap"), shownModel, { fetchAllocation: (id) => poolApi(poolName).allocation(id) });
  shownModel.markAllDirty();
  heatmap.schedule();
}

/** Charts over the history where the timeline calls for it: an opened recording all along, a
 * live pool while scrubbed back (up to the chosen moment); the live samples otherwise. */
function followSeries() {
  if (seriesLoader && timeline) seriesLoader.want(seriesRange(timeline.state(), isRecording(model.config)));
}

/** Close the current pool's stream and drop what was drawn of it. */
function disconnect() {
  if (seriesLoader) seriesLoader.stop();
  if (socket) socket.close();
  if (heatmap) heatmap.destroy();
  if (charts) charts.destroy();
  if (timeline) timeline.destroy();
  socket = heatmap = charts = timeline = pastModel = seriesLoader = null;
  curve.update(null);
}

function connect(name) {
  disconnect();
  // chips and the selected id are allocations of the old pool: Free must not reach the new one's
  if (name !== poolName) controls.clearChips();
  poolName = name;
  model = new PoolModel();
  heatmap = createHeatmap($("#heatmap"), model, {
    fetchAllocation: (id) => poolApi(poolName).allocation(id),
    fetchBlock: (b) => poolApi(poolName).block(b),
  });
  charts = createCharts($("#charts"), model);
  const shownCharts = charts;
  seriesLoader = createSeriesLoader(
    (r) => poolApi(name).historySeries(r.from, r.to, SERIES_POINTS),
    (cols) => shownCharts.showPast(cols),
    { onError: (err) => controls.status(`charts from history: ${err.message}`, "err") },
  );
  timeline = createTimeline($("#timeline"), {
    getPool: () => poolName,
    getLiveModel: () => model,
    onShow: (past, ts) => {
      pastModel = past;
      drawMap(past || model);
      if (charts) charts.mark(ts);
      renderPanels();
    },
    onChange: () => followSeries(),
    status: (m, k) => controls.status(m, k),
  });
  logDirty = true;
  renderPanels();
  socket = feedPool(name, model, {
    onMessage,
    onFrame: () => heatmap && heatmap.schedule(),
    onBackfill: () => {
      logDirty = true;
      schedulePanels();
    },
    onState: setConn,
    onError: (err) => controls.status(`bad frame: ${err.message}`, "err"),
  });
  setPoolInUrl(name);
}

/** @param {string} name "" drops the parameter */
function setPoolInUrl(name) {
  const url = new URL(window.location.href);
  if (name) url.searchParams.set("pool", name);
  else url.searchParams.delete("pool");
  window.history.replaceState(null, "", url);
}

/** Pool names on the server; [] (and a status line) when they cannot be listed. */
async function poolNames() {
  try {
    return await pools.names();
  } catch (err) {
    controls.status(`could not list pools: ${/** @type {Error} */ (err).message}`, "err");
    return [];
  }
}

/**
 * Rebuild the pool menu and show `select` (default: the current pool, or the first one when
 * none is shown). A name the server does not list yet stays in the menu: its stream says
 * "no such pool" and connects once someone creates it.
 * @param {string} [select]
 */
async function refreshPools(select) {
  const sel = /** @type {HTMLSelectElement} */ ($("#pool-select"));
  const names = await poolNames();
  const target = select || poolName || names[0];
  if (!target) return;
  if (!names.includes(target)) names.push(target);
  const current = Array.from(sel.options, (o) => o.value);
  // rebuilding the options of an open <select> would close it: only touch them on a change
  if (current.join("\n") !== names.join("\n")) {
    sel.innerHTML = names.map((n) => `<option value="${escapeHtml(n)}">${escapeHtml(n)}</option>`).join("");
  }
  sel.value = target;
  if (!socket || target !== poolName) connect(target);
}

/** After the shown pool was deleted: show the first pool left, or say that there is none. */
async function showFirstPool() {
  const names = await poolNames();
  if (names.length) {
    await refreshPools(names[0]);
    return;
  }
  disconnect();
  setConn("closed", "no pools");
  controls.clearChips();
  poolName = "";
  model = new PoolModel();
  renderPanels();
  /** @type {HTMLSelectElement} */ ($("#pool-select")).innerHTML = "";
  $("#pool-meta").textContent = "no pools: create one on the Pool tab";
  setPoolInUrl("");
  /** @type {HTMLElement} */ ($('.controls-panel [data-tab="pool"]')).click(); // the create form
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
  $("#view-routing").hidden = view !== "routing";
  $("#view-fleet").hidden = view !== "fleet";
  $("#alerts").hidden = view !== "dashboard"; // they are about the dashboard's pool, not the compared ones
  if (view === "compare") compare.show();
  if (view === "fleet") fleetView.show();
  else fleetView.hide();
  if (window.location.hash !== `#${view}`) window.history.replaceState(null, "", view === "dashboard" ? window.location.pathname + window.location.search : `#${view}`);
}
document.querySelectorAll("[data-view]").forEach((b) => b.addEventListener("click", () => showView(/** @type {HTMLElement} */ (b).dataset.view || "dashboard")));

if (poolName) refreshPools(poolName);
else showFirstPool();
const routing = createRoutingView($);
const fleetView = createFleetView();
showView({ "#compare": "compare", "#routing": "routing", "#fleet": "fleet" }[window.location.hash] || "dashboard");

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
    blockColor: (i) => (heatmap ? heatmap.blockColor(i) : null),
    setMode: (m) => heatmap && heatmap.setMode(m),
    modelCounts: () => model.countStates(),
    /** Distinct owner ids on the shown map (live or past), ascending (the browser tests compare them to REST). */
    owners: () => Array.from(new Set((pastModel || model).owner)).filter((o) => o >= 0).sort((a, b) => a - b),
    /** The timeline: {mode: "live"|"past", seq, first, last, shown, markers}. */
    timeline: () => (timeline ? timeline.state() : null),
    shownStats: () => (pastModel || model).stats,
    /** Time (unix s) the charts mark for the timeline's moment, or null. */
    chartMark: () => (charts ? charts.marked() : null),
    /** What the charts draw: {source: "live"|"past", points, first, last, utilization, utilizations}. */
    charts: () => (charts ? charts.summary() : null),
    stats: () => model.stats,
    alerts: () => model.alerts().concat(mirrorAlerts(model.stats)),
    events: () => model.events.slice(),
    lastFrame: () => model.lastFrame,
    compare: () => compare.summary(),
    fleet: () => fleetView.summary(),
    prefixCurve: () => curve.summary(),
    /** The Routing view: {id, state, done, total, table: {headers, rows}, error} of its run. */
    routing: () => routing.summary(),
    version: page.version,
  }),
});
