// The Fleet view: one small block map per engine (one colour per colour group, a subtree that
// tells requests apart, the same on every engine; the shared trunk grey), the largest groups
// split by which engines hold them, duplication and missed
// reuse over time, per-engine health and lag, and a match box. Polls while shown. Past
// LARGE_FLEET engines: the fleet's summary and its servers one row each (searched, filtered by
// state, paged), a server opened showing its ranks' maps; only those are fetched and drawn.

import { fleets } from "./api.js";
import { escapeHtml, paintSwatches } from "./dom.js";
import { CELL, COLUMNS, GAP, GROUPS_PER_PAGE, LARGE_FLEET, LARGE_SETS, MATCH_ROWS, colorOf, engineHeadHtml, figuresHtml, groupByServer, groupRowHtml, legendHtml, mapLayout, matchHtml, pagerText, parseTokens, prefixesHtml, recentOptionsHtml, seriesOf, summaryHtml, viewParams } from "./fleet.js";

/** The fleet's state is read this often while the view is shown; its block maps half as often. */
export const FLEET_REFRESH_MS = 1000;
export const BLOCKS_REFRESH_MS = 2000;
/** A search typed waits this long for the next key before it is asked. */
const SEARCH_WAIT_MS = 250;

const $ = (sel, root = document) => /** @type {HTMLElement} */ (root.querySelector(sel));

export function createFleetView() {
  const root = $("#view-fleet");
  const select = /** @type {HTMLSelectElement} */ ($("#fleet-select"));
  const search = /** @type {HTMLInputElement} */ ($("#fleet-search"));
  const stateSel = /** @type {HTMLSelectElement} */ ($("#fleet-state"));
  let name = new URLSearchParams(window.location.search).get("fleet") || "";
  let shown = false;
  let timer = 0;
  let searchTimer = 0;
  let state = { fleet: null, blocks: null, blocksKey: "", blocksAt: 0, open: null, painted: {}, colors: {}, error: null, match: null };
  // What the list of a large fleet shows: the search, the state, the page, the servers opened.
  const view = { large: false, q: "", state: "", offset: 0, open: /** @type {Set<string>} */ (new Set()) };

  async function refreshList() {
    const list = await fleets.list();
    const names = list.fleets.map((f) => f.name);
    if (!names.includes(name)) name = names[0] || "";
    select.innerHTML = names.map((n) => `<option${n === name ? " selected" : ""}>${escapeHtml(n)}</option>`).join("");
    $("#fleet-empty", root).hidden = names.length > 0;
  }

  /** What the view shows next (set at once, so that it is one moment's, and only by the latest tick). */
  async function load() {
    const narrow = { q: view.q, state: view.state };
    if (!view.large) {
      // every engine of a small fleet; a large one answers with its summary and first servers
      const f = await fleets.get(name, 300, viewParams({ limit: LARGE_FLEET }));
      view.large = f.engines_page.total > LARGE_FLEET;
      if (!view.large) {
        const maps = await mapsFor("", () => fleets.blocks(name));
        return { fleet: f, open: null, ...maps };
      }
    }
    const f = await fleets.get(name, 300, viewParams({ ...narrow, offset: view.offset }));
    if (f.engines_page.total <= LARGE_FLEET) {
      view.large = false;
      return load();
    }
    if (f.groups.length === 0 && view.offset > 0) {  // the list shrank under the page shown
      view.offset = 0;
      return load();
    }
    const listed = new Set(f.groups.map((g) => g.name));
    const open = [...view.open].filter((g) => listed.has(g));  // a search may hide some
    const ranks = open.length ? await fleets.get(name, 0, viewParams({ ...narrow, open })) : { engines: [] };
    const key = JSON.stringify([open, view.q, view.state]);
    const maps = await mapsFor(key, () => fleets.blocks(name, viewParams({ ...narrow, open })));
    return { fleet: f, open: ranks, ...maps };
  }

  /** The maps shown, fetched again every BLOCKS_REFRESH_MS or when what they are of (`key`) changed. */
  async function mapsFor(key, fetchMaps) {
    if (state.blocks && state.blocksKey === key && Date.now() - state.blocksAt < BLOCKS_REFRESH_MS) {
      return { blocks: state.blocks, blocksKey: key, blocksAt: state.blocksAt };
    }
    return { blocks: await fetchMaps(), blocksKey: key, blocksAt: Date.now() };
  }

  let ticks = 0;
  async function tick() {
    if (timer) window.clearTimeout(timer);
    timer = 0;
    if (!shown) return;
    const mine = ++ticks;
    let next;
    try {
      await refreshList();
      next = name ? { ...(await load()), error: null } : { fleet: null, blocks: null, open: null, error: null };
    } catch (err) {
      next = { error: String(/** @type {Error} */ (err).message || err) };
    }
    if (mine !== ticks) return;  // a later tick (a click, a search) renders and goes on
    Object.assign(state, next);
    render();
    if (shown && !timer) timer = window.setTimeout(tick, FLEET_REFRESH_MS);
  }

  /** Draw each `.fleet-engine` map of `wrap` from the /blocks answer. */
  function drawMaps(wrap, blocks) {
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
  }

  const engineHtml = (e, engines) => `<div class="fleet-engine" data-engine="${escapeHtml(e.name)}">${engineHeadHtml(e, engines)}<canvas class="fleet-map" aria-label="blocks of ${escapeHtml(e.name)}"></canvas><small class="fleet-map-note"></small></div>`;

  /** A large fleet: the summary, the servers of the page (opened ones with their ranks' maps), the pager. */
  function renderLarge(f, blocks) {
    $("#fleet-summary", root).innerHTML = summaryHtml(f.summary);
    const narrowed = Boolean(view.q || view.state);
    $("#fleet-page-of", root).textContent = pagerText(f.groups_page, narrowed);
    /** @type {HTMLButtonElement} */ ($("#fleet-prev", root)).disabled = view.offset <= 0;
    /** @type {HTMLButtonElement} */ ($("#fleet-next", root)).disabled = f.groups_page.offset + f.groups_page.limit >= f.groups_page.matched;
    const most = Math.max(1, ...f.groups.map((g) => g.cached_blocks));
    const list = $("#fleet-groups", root);
    list.innerHTML = f.groups.map((g) => groupRowHtml(g, view.open.has(g.name), most)).join("") || `<p class="hint">${narrowed ? "no engine matches" : "no engine yet"}</p>`;
    const ranks = groupByServer((state.open && state.open.engines) || []);
    list.querySelectorAll(".fleet-group.open").forEach((el) => {
      const g = /** @type {HTMLElement} */ (el).dataset.group || "";
      const rows = ranks.get(g) || [];
      const wrap = /** @type {HTMLElement} */ (el.querySelector(".fleet-group-ranks"));
      wrap.innerHTML = rows.map((e) => engineHtml(e, f.summary.engines)).join("") || `<p class="hint">loading…</p>`;
      drawMaps(wrap, blocks);
    });
  }

  function render() {
    $("#fleet-status", root).textContent = state.error || "";
    const f = state.fleet;
    $("#fleet-body", root).hidden = !f;
    if (!f) return;
    $("#fleet-numbers", root).innerHTML = figuresHtml(f.stats);
    const blocks = (state.blocks && state.blocks.engines) || {};
    state.painted = {};
    state.colors = {};
    $("#fleet-large", root).hidden = !view.large;
    const wrap = $("#fleet-engines", root);
    wrap.hidden = view.large;
    $("#fleet-groups", root).hidden = !view.large;
    if (view.large) {
      wrap.innerHTML = "";
      renderLarge(f, blocks);
    } else {
      $("#fleet-groups", root).innerHTML = "";
      const groups = groupByServer(f.engines);
      wrap.innerHTML = Array.from(groups.entries()).map(([server, rows]) => `<section class="fleet-server">${rows.length > 1 ? `<h3>${escapeHtml(server)} <small>${rows.length} DP ranks</small></h3>` : ""}${rows.map((e) => engineHtml(e, f.engines.length)).join("")}</section>`).join("");
      drawMaps(wrap, blocks);
    }
    const legend = $("#fleet-legend", root);
    legend.innerHTML = legendHtml(state.blocks, Object.keys((f.stats && f.stats.tiers) || {}));
    paintSwatches(legend);
    const prefixes = $("#fleet-prefixes", root);
    prefixes.innerHTML = prefixesHtml((state.blocks && state.blocks.prefixes) || [], view.large ? LARGE_SETS : Infinity);
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
      out.innerHTML = matchHtml(r.engines, r.block_sizes, MATCH_ROWS);
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
    Object.assign(view, { large: false, offset: 0, open: new Set() });
    tick();
  });
  // the list of a large fleet: open or close a server, search, filter by state, page
  $("#fleet-groups", root).addEventListener("click", (ev) => {
    const head = /** @type {HTMLElement|null} */ (/** @type {HTMLElement} */ (ev.target).closest(".fleet-group-head"));
    if (!head) return;
    const g = head.dataset.group || "";
    if (view.open.has(g)) view.open.delete(g);
    else view.open.add(g);
    tick();
  });
  search.addEventListener("input", () => {
    if (searchTimer) window.clearTimeout(searchTimer);
    searchTimer = window.setTimeout(() => {
      searchTimer = 0;
      view.q = search.value.trim();
      view.offset = 0;
      tick();
    }, SEARCH_WAIT_MS);
  });
  stateSel.addEventListener("change", () => {
    view.state = stateSel.value;
    view.offset = 0;
    tick();
  });
  $("#fleet-prev", root).addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - GROUPS_PER_PAGE);
    tick();
  });
  $("#fleet-next", root).addEventListener("click", () => {
    view.offset += GROUPS_PER_PAGE;
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
    summary: () => ({
      fleet: name, large: view.large,
      engines: state.fleet ? (view.large ? ((state.open && state.open.engines) || []) : state.fleet.engines).map((e) => e.name) : [],
      groups: view.large && state.fleet ? state.fleet.groups.map((g) => g.name) : [], open: [...view.open],
      painted: { ...state.painted }, colors: { ...state.colors }, stats: state.fleet ? state.fleet.stats : null, match: state.match, error: state.error,
    }),
  };
}
