// What the Fleet view shows, as pure functions of GET /api/fleets/{fleet} and its /blocks
// answer (node-tested); static/js/fleet-view.js draws them.

import { escapeHtml } from "./dom.js";

/** Map cells: 4 px squares, 1 px apart, 60 a row: a 64k-block engine still fits a small canvas. */
export const CELL = 4;
export const GAP = 1;
export const COLUMNS = 60;
/** Taller maps are cut (the count says how many blocks are not drawn). */
export const MAX_ROWS = 120;

/** Colour id 0: the shared trunk, blocks above every colour group (drawn grey). */
export const SHARED = 0;
export const SHARED_COLOR = "hsl(0, 0%, 62%)";

/**
 * The colour of a colour group (docs/FLEET.md: a block's group is the topmost block above it
 * whose subtree holds at most 1/8 of the fleet's blocks): its id (24 bits of the group's top
 * block key) spread over the hue circle by the golden angle, so neighbouring ids differ; the
 * shared trunk is grey. The same group gets the same colour on every engine's map. @param {number} id
 */
export function colorOf(id) {
  if (id === SHARED) return SHARED_COLOR;
  const hue = Math.round((id * 137.508) % 360);
  const light = 45 + (id % 3) * 8;
  return `hsl(${hue}, 65%, ${light}%)`;
}

/** Engines grouped under their server (DP ranks together), servers in first-seen order. @param {any[]} engines */
export function groupByServer(engines) {
  /** @type {Map<string, any[]>} */
  const out = new Map();
  for (const e of engines) {
    if (!out.has(e.server)) out.set(e.server, []);
    out.get(e.server).push(e);
  }
  for (const rows of out.values()) rows.sort((a, b) => a.dp_rank - b.dp_rank);
  return out;
}

const num = (v) => (v == null ? "—" : Number(v).toLocaleString());

/** The fleet's figures as "Now" cells. @param {any} stats */
export function figuresHtml(stats) {
  const cell = (label, value, sub) => `<div class="num"><label>${label}</label><b>${value}</b><small>${sub}</small></div>`;
  return [
    cell("unique blocks", num(stats.unique_blocks), `across ${num(stats.engines)} engines`),
    cell("duplicated blocks", num(stats.duplicated_blocks), "cached on 2+ engines"),
    cell("duplicate copies", num(stats.duplicate_copies), "extra copies held"),
    cell("missed reuse", num(stats.cross_engine_recomputes), `blocks recomputed while another engine held them · ${num(stats.recompute_tokens)} tokens`),
  ].join("");
}

/** An engine's stream state as one word and whether it needs attention. @param {any} e */
export function healthOf(e) {
  const s = e.stream || {};
  const state = s.state || "?";
  const bad = state === "unreachable" || state === "disconnected" || (s.error_count || 0) > 0 || (s.lost_batches || 0) > 0 || (e.errors || []).length > 0;
  return { state, bad };
}

/**
 * What is true of an engine whose blocks carry no token ids (keyed by its own hashes), said only
 * when it has such blocks and the fleet has another engine to compare with.
 * @param {any} e @param {number} engines in the fleet
 */
export function keyedNote(e, engines) {
  const own = e.fallback_blocks || 0;
  if (!own || engines < 2) return "";
  const which = e.keyed_by === "tokens" ? `${num(own)} of its blocks came without token ids and are` : "its events carry no token ids: blocks";
  return `${which} keyed by its own hashes, so they match another engine's only where both hash alike`;
}

/** Storage tiers as the page names them (kvevents/tiers.py's names, fastest first). */
export const TIER_LABELS = { gpu: "GPU", cpu: "CPU", disk: "disk", external: "external" };

/**
 * An engine's blocks per storage tier, once its fleet has a tier below the GPU ("" before:
 * every block is on the GPU, as the count beside it says). @param {any} e
 */
export function tiersHtml(e) {
  const tiers = e.tiers || {};
  const names = Object.keys(tiers);
  if (!names.some((t) => t !== "gpu")) return "";
  return ` · <span class="fleet-tiers">${names.map((t) => `<span class="fleet-tier${tiers[t] ? "" : " none"}" data-tier="${escapeHtml(t)}">${escapeHtml(TIER_LABELS[t] || t)} ${num(tiers[t])}</span>`).join(" ")}</span>`;
}

/** One engine's header line. @param {any} e @param {number} [engines] in the fleet */
export function engineHeadHtml(e, engines = 1) {
  const s = e.stream || {};
  const { state, bad } = healthOf(e);
  const lag = s.lag_s == null ? "no batch yet" : `${s.lag_s < 1 ? Math.round(s.lag_s * 1000) + " ms" : s.lag_s.toFixed(1) + " s"} since last batch`;
  const p99 = s.apply_lag_p99_ms == null ? "" : ` (p99 ${Math.round(s.apply_lag_p99_ms)} ms from engine to index)`;
  const retry = state === "unreachable" ? ` · retry ${num(s.retries)} in ${num(s.retry_in_ms)} ms` : "";
  const m = e.metrics;
  const own = m && m.prefix_cache_queries != null
    ? ` · engine: ${num(m.prefix_cache_hits)} / ${num(m.prefix_cache_queries)} prefix hits, KV ${m.kv_usage == null ? "—" : Math.round(m.kv_usage * 100) + "%"}`
    : "";
  const note = keyedNote(e, engines);
  const keyed = note ? ` · <span class="note">${escapeHtml(note)}</span>` : "";
  const errs = (e.errors || []).map((x) => ` · <span class="warn">${escapeHtml(x)}</span>`).join("");
  const bad_in = (s.error_count || 0) + (e.malformed_events || 0);
  return `<div class="fleet-engine-head${bad ? " bad" : ""}"><b>${escapeHtml(e.name)}</b>${e.dp_rank ? ` <small class="dp">dp ${e.dp_rank}</small>` : ""}
    <span class="state" data-state="${escapeHtml(state)}">${escapeHtml(state)}</span>
    <small>${num(e.cached_blocks)} blocks${tiersHtml(e)} · ${e.block_size ? e.block_size + " tok/block" : "block size unknown"} · ${lag}${p99}${retry}${bad_in ? ` · ${num(bad_in)} bad messages` : ""}${own}${keyed}${errs}</small></div>`;
}

/**
 * Cells of one engine's map: colour ids in order, cut to MAX_ROWS rows.
 * @param {number[]} colors @returns {{cells: number[], rows: number, hidden: number}}
 */
export function mapLayout(colors) {
  const max = COLUMNS * MAX_ROWS;
  const cells = colors.length > max ? colors.slice(0, max) : colors;
  return { cells, rows: Math.max(1, Math.ceil(cells.length / COLUMNS)), hidden: colors.length - cells.length };
}

/**
 * The forest summary: the largest colour groups (and the shared trunk), each split by the set of
 * engines holding its blocks (the largest `maxSets` sets, then what the others hold).
 * @param {any[]} prefixes @param {number} [maxSets]
 */
export function prefixesHtml(prefixes, maxSets = Infinity) {
  if (!prefixes.length) return `<p class="hint">no blocks yet</p>`;
  return prefixes.map((p) => {
    const sets = p.sets.slice(0, maxSets);
    const left = p.sets.slice(sets.length);
    const others = left.length + (p.other_sets || 0);
    const othersBlocks = left.reduce((a, s) => a + s.blocks, 0) + (p.other_sets_blocks || 0);
    const rest = left.length && others ? ` <small class="fleet-set">+ ${num(others)} more sets: ${num(othersBlocks)}</small>` : "";
    const parts = sets.map((s) => {
      const more = s.more_engines ? ` + ${num(s.more_engines)} more` : "";
      return `<span class="fleet-set${s.engines.length + (s.more_engines || 0) > 1 ? " shared" : ""}" title="${s.blocks} blocks held by ${escapeHtml(s.engines.join(", "))}${more}">${escapeHtml(s.engines.join(" + "))}${more}: ${num(s.blocks)}</span>`;
    }).join("");
    const what = p.color === SHARED ? " <small>shared trunk</small>" : "";
    return `<li><i class="swatch" data-color="${colorOf(p.color)}"></i><b>${num(p.blocks)}</b> blocks${what} ${parts}${rest}</li>`;
  }).join("");
}

/**
 * What the maps' colours mean, from the /blocks answer; with `tiers` (the storage tiers the
 * fleet's engines have used) past the GPU, that the maps are the GPU's.
 * @param {any} blocks @param {string[]} [tiers]
 */
export function legendHtml(blocks, tiers = []) {
  if (!blocks || blocks.max_group_blocks == null) return "";
  const groups = new Set();
  for (const e of Object.values(blocks.engines || {})) for (const c of /** @type {any} */ (e).colors) if (c !== SHARED) groups.add(c);
  const trunk = blocks.shared_blocks
    ? ` <i class="swatch" data-color="${SHARED_COLOR}"></i> grey: the shared trunk, ${num(blocks.shared_blocks)} blocks above every group (a prefix most requests share).`
    : "";
  const cycles = blocks.cycles ? ` <span class="warn">${num(blocks.cycles)} parent-hash cycles cut (see the engines)</span>` : "";
  const lower = tiers.filter((t) => t !== "gpu").map((t) => TIER_LABELS[t] || t);
  const tiered = lower.length
    ? ` <span class="fleet-tier-legend">The maps are the GPU's blocks; each engine's line counts its blocks per tier (GPU, ${escapeHtml(lower.join(", "))}): an offloaded block is on the GPU and its other tier at once until the GPU evicts it.</span>`
    : "";
  return `A colour is one subtree of the prefix tree: the topmost block above a block whose subtree holds at most ${num(blocks.max_group_blocks)} blocks (1/8 of the fleet's), the same colour on every engine; ${num(groups.size)} shown.${trunk}${cycles}${tiered}`;
}

/**
 * Token ids typed or pasted: integers separated by commas, spaces or newlines (a JSON array too).
 * @param {string} text @returns {{tokens: number[]}|{error: string}}
 */
export function parseTokens(text) {
  const parts = text.replace(/[[\]]/g, " ").split(/[\s,]+/).filter(Boolean);
  if (!parts.length) return { error: "paste token ids (integers), e.g. 1, 2, 3" };
  const bad = parts.find((p) => !/^\d+$/.test(p));
  if (bad !== undefined) return { error: `not a token id: ${bad.slice(0, 20)}` };
  return { tokens: parts.map(Number) };
}

/**
 * Match results as bars, longest first; past `limit` engines the best `limit` and a line on the rest.
 * @param {Record<string, number>} engines @param {Record<string, number|null>} sizes @param {number} [limit]
 */
export function matchHtml(engines, sizes, limit = Infinity) {
  const all = Object.entries(engines).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  const rows = all.slice(0, limit);
  const rest = all.slice(rows.length);
  const more = rest.length ? `<p class="hint">${num(rest.length)} more engines: ${num(rest.filter(([, n]) => n > 0).length)} hold part of it, ${num(rest.filter(([, n]) => n === 0).length)} none</p>` : "";
  const best = Math.max(1, ...rows.map(([, n]) => n));
  return more ? matchRows(rows, sizes, best) + more : matchRows(rows, sizes, best);
}

function matchRows(rows, sizes, best) {
  return rows.map(([name, n]) => `<div class="fleet-match-row" data-engine="${escapeHtml(name)}" data-blocks="${n}"><span>${escapeHtml(name)}</span><meter min="0" max="${best}" value="${n}"></meter><b>${n} blocks</b><small>${sizes[name] ? n * sizes[name] + " tokens" : ""}</small></div>`).join("");
}

/** The chart's columns from the samples: time, duplicated blocks, missed reuse (cumulative). @param {any[]} samples */
export function seriesOf(samples) {
  return {
    t: samples.map((s) => s.at),
    duplicated: samples.map((s) => s.duplicated_blocks),
    recomputes: samples.map((s) => s.cross_engine_recomputes),
    unique: samples.map((s) => s.unique_blocks),
  };
}

/** Options of the recent-chains picker, newest first. @param {any[]} chains @param {number} now unix s */
export function recentOptionsHtml(chains, now) {
  return `<option value="">—</option>` + chains.map((c) => `<option value="${escapeHtml(c.key)}">${escapeHtml(c.engine)} · ${c.blocks} blocks · ${Math.max(0, Math.round(now - c.at))} s ago</option>`).join("");
}

// -- many engines (docs/FLEET.md, "The page"): past LARGE_FLEET engines the view shows the
// fleet's summary and its servers one row each, searched and paged, and draws the maps of the
// servers opened only.

/** More engines than this: the summary and the server list instead of every engine's map. */
export const LARGE_FLEET = 32;
/** Servers a page of the list shows. */
export const GROUPS_PER_PAGE = 20;
/** Ranks of the opened servers read (and maps drawn) at most: the API's page bound. */
export const MAX_OPEN_ENGINES = 256;
/** Match results listed at most (the best first). */
export const MATCH_ROWS = 32;
/** Engine sets listed per largest group. */
export const LARGE_SETS = 4;

/**
 * The query of GET /api/fleets/{fleet} (and its /blocks) for what the view shows: `open`, the
 * servers opened (their ranks matching the search), else the summary and a page of servers.
 * @param {{q?: string, state?: string, offset?: number, open?: string[], limit?: number}} v
 * @returns {URLSearchParams}
 */
export function viewParams(v) {
  const p = new URLSearchParams();
  if (v.q) p.set("engines_q", v.q);
  if (v.state) p.set("engines_state", v.state);
  if (v.open && v.open.length) {
    for (const g of v.open) p.append("engines_group", g);
    p.set("engines_limit", String(MAX_OPEN_ENGINES));
  } else {
    p.set("engines_limit", String(v.limit == null ? 0 : v.limit));
    p.set("groups_offset", String(v.offset || 0));
    p.set("groups_limit", String(GROUPS_PER_PAGE));
  }
  return p;
}

/** "8 live · 2 unreachable": engines by state, the most first. @param {Record<string, number>} states */
export function statesHtml(states) {
  return Object.entries(states || {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .map(([s, n]) => `<span class="state" data-state="${escapeHtml(s)}">${num(n)} ${escapeHtml(s)}</span>`).join("");
}

/** The summary of every engine (GET /api/fleets/{fleet} `summary`) as "Now" cells and the largest holders. @param {any} s */
export function summaryHtml(s) {
  if (!s) return "";
  const cell = (label, value, sub) => `<div class="num"><label>${label}</label><b>${value}</b><small>${sub}</small></div>`;
  const attention = [s.errors ? `<span class="warn">${num(s.errors)} with errors</span>` : "", s.lagging ? `<span class="warn">${num(s.lagging)} lagging</span>` : ""].filter(Boolean).join(" · ");
  const hit = s.hit_ratio == null ? "—" : `${(s.hit_ratio * 100).toFixed(1)}%`;
  const hitSub = s.hit_ratio == null ? "no engine's /metrics read" : `${num(s.prefix_cache_hits)} / ${num(s.prefix_cache_queries)} tokens, ${num(s.engines_with_metrics)} engines`;
  const tops = (list, what) => list.map((t) => `<li title="${escapeHtml(t.name)}: ${num(t.cached_blocks)} blocks${what(t)}"><b>${escapeHtml(t.name)}</b><small>${num(t.cached_blocks)}</small></li>`).join("");
  return `<div class="numbers fleet-summary-numbers">
    ${cell("engines", num(s.engines), `on ${num(s.servers)} servers`)}
    ${cell("blocks held", num(s.cached_blocks), "summed over engines")}
    ${cell("engines' hit ratio", hit, hitSub)}
    <div class="num"><label>states</label><div class="fleet-states">${statesHtml(s.by_state)}</div><small>${attention || "none lagging, none with errors"}</small></div>
  </div>
  <div class="fleet-tops"><div><h4>Most blocks held: engines</h4><ol>${tops(s.top_engines || [], (t) => (t.server !== t.name ? `, server ${t.server}` : ""))}</ol></div>
  <div><h4>Most blocks held: servers</h4><ol>${tops(s.top_servers || [], (t) => `, ${num(t.engines)} engines`)}</ol></div></div>`;
}

/** A server's DP ranks in words. @param {any} g */
export function ranksText(g) {
  const r = g.dp_ranks || {};
  if (g.engines === 1) return r.first ? `dp ${r.first}` : "1 engine";
  const span = r.some ? `dp ${r.some.join(", ")}${g.engines > r.some.length ? ", …" : ""}` : `dp ${r.first}–${r.last}`;
  return `${num(g.engines)} ranks · ${span}`;
}

/**
 * One server of the list: its name, ranks, engines by state, blocks (a bar against the page's
 * largest) and models; opened, its ranks' maps follow (drawn by the view).
 * @param {any} g @param {boolean} open @param {number} most blocks of the page's largest server
 */
export function groupRowHtml(g, open, most) {
  const bad = g.errors ? ` <span class="warn">${num(g.errors)} with errors</span>` : "";
  const lag = g.lagging ? ` <span class="warn">${num(g.lagging)} lagging</span>` : "";
  const models = g.models && g.models.length ? ` · ${escapeHtml(g.models.join(", "))}` : "";
  return `<div class="fleet-group${open ? " open" : ""}${g.errors ? " bad" : ""}" data-group="${escapeHtml(g.name)}">
    <button type="button" class="fleet-group-head" aria-expanded="${open}" data-group="${escapeHtml(g.name)}"><i class="caret">${open ? "▾" : "▸"}</i><b>${escapeHtml(g.name)}</b><small>${ranksText(g)}${models}</small><span class="fleet-states">${statesHtml(g.states)}${bad}${lag}</span><meter min="0" max="${Math.max(1, most)}" value="${g.cached_blocks}"></meter><small class="blocks">${num(g.cached_blocks)} blocks</small></button>
    <div class="fleet-group-ranks"${open ? "" : " hidden"}></div></div>`;
}

/** "servers 21–40 of 128" (of those matching, when a search or state narrows). @param {any} page @param {boolean} narrowed */
export function pagerText(page, narrowed) {
  if (!page || !page.matched) return narrowed ? "no server matches" : "no server";
  const first = Math.min(page.offset + 1, page.matched);
  const last = Math.min(page.offset + page.limit, page.matched);
  return `servers ${num(first)}–${num(last)} of ${num(page.matched)}${narrowed ? ` matching (${num(page.total)} in all)` : ""}`;
}
