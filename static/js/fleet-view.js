// The Fleet view: one small block map per engine (one colour per colour group, a subtree that
// tells requests apart, the same on every engine; the shared trunk grey), the largest groups
// split by which engines hold them, duplication and missed
// reuse over time, per-engine health and lag, and a match box. Polls while shown.

import { fleets } from "./api.js";
import { escapeHtml, paintSwatches } from "./dom.js";
import { CELL, COLUMNS, GAP, colorOf, engineHeadHtml, figuresHtml, groupByServer, legendHtml, mapLayout, matchHtml, parseTokens, prefixesHtml, recentOptionsHtml, seriesOf } from "./fleet.js";

/** The fleet's state is read this often while the view is shown; its block maps half as often. */
export const FLEET_REFRESH_MS = 1000;
export const BLOCKS_REFRESH_MS = 2000;

const $ = (sel, root = document) => /** @type {HTMLElement} */ (root.querySelector(sel));

export function createFleetView() {
  const root = $("#view-fleet");
  const select = /** @type {HTMLSelectElement} */ ($("#fleet-select"));
  let name = new URLSearchParams(window.location.search).get("fleet") || "";
  let shown = false;
  let timer = 0;
  let lastBlocksAt = 0;
  let state = { fleet: null, blocks: null, painted: {}, colors: {}, error: null, match: null };

  async function refreshList() {
    const list = await fleets.list();
    const names = list.fleets.map((f) => f.name);
    if (!names.includes(name)) name = names[0] || "";
    select.innerHTML = names.map((n) => `<option${n === name ? " selected" : ""}>${escapeHtml(n)}</option>`).join("");
    $("#fleet-empty", root).hidden = names.length > 0;
  }

  async function tick() {
    timer = 0;
    if (!shown) return;
    try {
      await refreshList();
      if (name) {
        state.fleet = await fleets.get(name);
        if (Date.now() - lastBlocksAt >= BLOCKS_REFRESH_MS || !state.blocks) {
          state.blocks = await fleets.blocks(name);
          lastBlocksAt = Date.now();
        }
        state.error = null;
      } else {
        state.fleet = state.blocks = null;
      }
    } catch (err) {
      state.error = String(/** @type {Error} */ (err).message || err);
    }
    render();
    if (shown) timer = window.setTimeout(tick, FLEET_REFRESH_MS);
  }

  function render() {
    $("#fleet-status", root).textContent = state.error || "";
    const f = state.fleet;
    $("#fleet-body", root).hidden = !f;
    if (!f) return;
    $("#fleet-numbers", root).innerHTML = figuresHtml(f.stats);
    const blocks = (state.blocks && state.blocks.engines) || {};
    const groups = groupByServer(f.engines);
    const wrap = $("#fleet-engines", root);
    wrap.innerHTML = Array.from(groups.entries()).map(([server, rows]) => `<section class="fleet-server">${rows.length > 1 ? `<h3>${escapeHtml(server)} <small>${rows.length} DP ranks</small></h3>` : ""}${rows.map((e) => `<div class="fleet-engine" data-engine="${escapeHtml(e.name)}">${engineHeadHtml(e, f.engines.length)}<canvas class="fleet-map" aria-label="blocks of ${escapeHtml(e.name)}"></canvas><small class="fleet-map-note"></small></div>`).join("")}</section>`).join("");
    state.painted = {};
    state.colors = {};
    const legend = $("#fleet-legend", root);
    legend.innerHTML = legendHtml(state.blocks);
    paintSwatches(legend);
    wrap.querySelectorAll(".fleet-engine").forEach((el) => {
      const eng = /** @type {HTMLElement} */ (el).dataset.engine || "";
      const b = blocks[eng] || { colors: [], blocks: 0, truncated: false };
      const { cells, rows, hidden } = mapLayout(b.colors);
      const canvas = /** @type {HTMLCanvasElement} */ (el.querySelector("canvas"));
      canvas.width = COLUMNS * (CELL + GAP);
      canvas.height = rows * (CELL + GAP);
      const ctx = canvas.getContext("2d");
      if (ctx) {
        for (let i = 0; i < cells.length; i++) {
          ctx.fillStyle = colorOf(cells[i]);
          ctx.fillRect((i % COLUMNS) * (CELL + GAP), Math.floor(i / COLUMNS) * (CELL + GAP), CELL, CELL);
        }
      }
      state.painted[eng] = cells.length;
      state.colors[eng] = new Set(cells).size;
      const cut = hidden + (b.blocks - b.colors.length);
      /** @type {HTMLElement} */ (el.querySelector(".fleet-map-note")).textContent = cut > 0 ? `${cut.toLocaleString()} more blocks not drawn` : "";
    });
    const prefixes = $("#fleet-prefixes", root);
    prefixes.innerHTML = prefixesHtml((state.blocks && state.blocks.prefixes) || []);
    paintSwatches(prefixes);
    drawChart(/** @type {HTMLCanvasElement} */ ($("#fleet-chart", root)), seriesOf(f.samples || []));
    const recent = /** @type {HTMLSelectElement} */ ($("#fleet-recent", root));
    if (document.activeElement !== recent && !recent.value) recent.innerHTML = recentOptionsHtml(f.recent_chains || [], Date.now() / 1000);
  }

  /** Duplicated blocks and missed reuse (cumulative) over the samples, each on its own scale. */
  function drawChart(canvas, s) {
    const w = (canvas.width = canvas.clientWidth || 600);
    const h = (canvas.height = 140);
    const ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.clearRect(0, 0, w, h);
    if (s.t.length < 2) {
      ctx.fillStyle = "#888";
      ctx.fillText("collecting: one point a second", 6, 12);
      return;
    }
    const lines = [["duplicated", "#e8a33d"], ["recomputes", "#d9534f"], ["unique", "#5b9bd5"]];
    lines.forEach(([key, color], k) => {
      const ys = s[key];
      if (ys.length < 2) return;
      const max = Math.max(1, ...ys);
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      ys.forEach((y, i) => {
        const px = (i / (ys.length - 1)) * (w - 4) + 2;
        const py = h - 4 - (y / max) * (h - 20);
        if (i) ctx.lineTo(px, py);
        else ctx.moveTo(px, py);
      });
      ctx.stroke();
      ctx.fillStyle = color;
      ctx.fillText(`${key} ${ys[ys.length - 1].toLocaleString()}`, 6 + k * 150, 12);
    });
  }

  async function onMatch(ev) {
    ev.preventDefault();
    const out = $("#fleet-match-out", root);
    const parsed = parseTokens(/** @type {HTMLTextAreaElement} */ ($("#fleet-tokens", root)).value);
    if ("error" in parsed) {
      out.textContent = parsed.error;
      return;
    }
    await runMatch({ tokens: parsed.tokens });
  }

  /** @param {{tokens: number[]}|{key: string}} body */
  async function runMatch(body) {
    const out = $("#fleet-match-out", root);
    try {
      const r = await fleets.match(name, body);
      state.match = r;
      out.innerHTML = matchHtml(r.engines, r.block_sizes);
    } catch (err) {
      out.textContent = String(/** @type {Error} */ (err).message || err);
    }
  }

  /** The shown fleet goes in the address (`?fleet=NAME`), so a reload or a shared link opens it. */
  function keepInUrl() {
    const url = new URL(window.location.href);
    if (url.searchParams.get("fleet") === name) return;
    url.searchParams.set("fleet", name);
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }

  select.addEventListener("change", () => {
    name = select.value;
    keepInUrl();
    state.blocks = null;
    if (timer) window.clearTimeout(timer);
    tick();
  });
  $("#f-fleet-match", root).addEventListener("submit", onMatch);
  $("#fleet-recent", root).addEventListener("change", (ev) => {
    const key = /** @type {HTMLSelectElement} */ (ev.target).value;
    if (key) runMatch({ key });
  });

  return {
    show() {
      shown = true;
      if (!timer) tick();
    },
    hide() {
      shown = false;
      if (timer) window.clearTimeout(timer);
      timer = 0;
    },
    /** For the browser tests: what is shown. */
    summary: () => ({ fleet: name, engines: state.fleet ? state.fleet.engines.map((e) => e.name) : [], painted: { ...state.painted }, colors: { ...state.colors }, stats: state.fleet ? state.fleet.stats : null, match: state.match, error: state.error }),
  };
}
