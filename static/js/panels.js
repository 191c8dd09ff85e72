// DOM renderers for the read-only panels: current numbers, alert banner, event log.

import { escapeHtml } from "./dom.js";
import { describePrefixEvent, isMirror, mirrorNumbersHtml } from "./mirror.js";
import { SKIPPED, filterEvents, formatBytes, hitRateOf, pct, pressureOf } from "./model.js";
import { eventTypesOf } from "./vocab.js";

/** Panels (numbers, log, alerts) re-render at most this often; the maps have their own rAF loop. */
export const PANEL_REFRESH_MS = 250;

/** The log shows at most this many rows; rebuilding more on every batch costs frames. */
export const LOG_ROWS = 200;

/**
 * @param {import("./model.js").PoolStats|null} s
 * @param {number} evictionsPerSec
 * @param {any} [forest] a mirror pool's prefix forest (GET /forest), when fetched
 */
export function numbersHtml(s, evictionsPerSec, forest = null) {
  if (!s) return `<div class="muted">waiting for stats…</div>`;
  if (isMirror(s)) return mirrorNumbersHtml(s, forest);
  const hr = hitRateOf(s);
  const c = s.cache;
  const cell = (label, value, sub = "", cls = "") => `<div class="num ${cls}"><label>${label}</label><b>${value}</b><small>${sub}</small></div>`;
  const ooms = s.ooms || { capacity: 0, fragmentation: 0 };
  const cached = /** @type {any} */ (s).blocks_by_state ? /** @type {any} */ (s).blocks_by_state.cached || 0 : 0;
  const blocks = `${(s.used_blocks ?? 0).toLocaleString()} / ${(s.total_blocks ?? 0).toLocaleString()} blocks`;
  // where any free block serves any request (paged), scattered free space costs nothing: the
  // server says so in `scatter_fails`, and counts what scatter strands in `stranded_free_bytes`
  const ext = s.scatter_fails === false
    ? cell("free scatter", pct(s.external_fragmentation), `${s.free_extent_count ?? "?"} free extents · harmless on ${s.strategy}`, "calm")
    : cell("external frag", pct(s.external_fragmentation), `${s.free_extent_count ?? "?"} free extents${s.stranded_free_bytes ? ` · ${formatBytes(s.stranded_free_bytes)} stranded` : ""}`, s.external_fragmentation >= 0.5 ? "hot" : "");
  return [
    cell("utilization", pct(s.utilization), cached ? `${blocks} · ${cached.toLocaleString()} evictable` : blocks, pressureOf(s) >= 0.9 ? "hot" : ""),
    cell("internal frag", pct(s.internal_fragmentation), `${formatBytes((s.allocated_bytes || 0) - (s.requested_bytes || 0))} wasted in blocks`),
    ext,
    cell("largest free", formatBytes(s.largest_free_bytes), `of ${formatBytes(s.free_bytes ?? (s.free_blocks || 0) * (s.block_bytes || 0))} free`),
    cell("OOMs", `${ooms.capacity + ooms.fragmentation}`, `capacity ${ooms.capacity} · fragmentation ${ooms.fragmentation}`, ooms.fragmentation > 0 ? "hot" : ""),
    cell("hit rate", hr == null ? "—" : pct(hr), prefixSub(s) || (c ? `${c.hits ?? 0} hits · ${c.misses ?? 0} misses`
      : /** @type {any} */ (s).past ? "not kept for past moments" : "no cache on this pool")),
    cell("evictions/s", Number.isFinite(evictionsPerSec) ? evictionsPerSec.toFixed(1) : "—", c ? `${c.entries ?? c.count ?? "?"} entries · ${formatBytes(c.used_bytes)} / ${formatBytes(c.capacity_bytes)}` : ""),
  ].join("");
}

/** The hit-rate cell's line on a prefix-caching pool: prompt tokens served from the cache. */
function prefixSub(s) {
  const p = /** @type {any} */ (s).prefix;
  if (!p) return "";
  return `${Number(p.hits).toLocaleString()} of ${Number(p.queries).toLocaleString()} prompt tokens cached · ${p.blocks.shared} shared blocks`;
}

/** @param {import("./model.js").PoolEvent} e @returns {[string, string, string]} what, size, why */
export function describeEvent(e) {
  switch (e.type) {
    case "evict":
      return [e.key ?? "?", formatBytes(e.bytes), `${e.reason} · ${e.policy}${e.idle_s != null ? ` · idle ${Number(e.idle_s).toFixed(1)}s` : ""}`];
    case "oom":
      return [`request failed`, formatBytes(e.requested_bytes), `${e.cause}: ${formatBytes(e.free_bytes)} free, largest ${formatBytes(e.largest_free_bytes)}`];
    case "defragment": {
      const b = /** @type {any} */ (e).before || {};
      const a = /** @type {any} */ (e).after || {};
      const ext = b.external_fragmentation != null ? `ext frag ${pct(b.external_fragmentation)} → ${pct(a.external_fragmentation)}` : "";
      return [`moved ${/** @type {any} */ (e).moved_blocks} blocks`, formatBytes(/** @type {any} */ (e).moved_bytes), ext];
    }
    case "reset":
      return [`freed ${/** @type {any} */ (e).freed ?? "all"}`, "", ""];
    case "policy":
      return [`policy → ${e.policy}`, "", ""];
    case "workload": {
      const w = /** @type {any} */ (e);
      return [`${w.name} ${w.state}`, "", `${w.done ?? ""}/${w.total ?? ""}`];
    }
    case "allocate":
      return [`#${e.id}`, formatBytes(/** @type {any} */ (e).allocated_bytes), `requested ${formatBytes(e.requested_bytes)}`];
    case "extend":
      return [`#${e.id}`, formatBytes(/** @type {any} */ (e).allocated_bytes), /** @type {any} */ (e).moved ? "moved" : "in place"];
    case "free":
      return [`#${e.id}`, `${e.blocks ?? ""} blocks`, ""];
    case "open": {
      const p = /** @type {any} */ (e);
      const hit = p.num_tokens ? p.cached_tokens / p.num_tokens : 0;
      return [`seq #${p.seq_id}`, `${p.num_tokens} tok`, `${p.cached_tokens} cached (${pct(hit)})`];
    }
    case "append":
      return [`seq #${/** @type {any} */ (e).seq_id}`, `${/** @type {any} */ (e).num_tokens} tok`, `+${(/** @type {any} */ (e).blocks || []).length} blocks`];
    case "close":
      return [`seq #${/** @type {any} */ (e).seq_id}`, `${(/** @type {any} */ (e).blocks || []).length} blocks`, "released"];
    default:
      return describePrefixEvent(e) || [e.key ?? (e.id != null ? `#${e.id}` : ""), e.bytes != null ? formatBytes(e.bytes) : "", ""];
  }
}

/** Types selected by the filter checkboxes. @param {HTMLElement} box */
export function selectedTypes(box) {
  const types = new Set();
  box.querySelectorAll("input:checked").forEach((el) => {
    const v = /** @type {HTMLInputElement} */ (el).value;
    for (const t of eventTypesOf(v)) types.add(t);
  });
  return types;
}

/**
 * @param {HTMLElement} tbody
 * @param {import("./model.js").PoolEvent[]} events newest first
 * @param {Set<string>} types
 */
export function renderLog(tbody, events, types) {
  const rows = [];
  const shown = types.size ? filterEvents(events, types) : [];
  for (let i = 0; i < shown.length && rows.length < LOG_ROWS; i++) {
    const e = shown[i];
    if (e.type === SKIPPED) {
      // holes with none of the selected events between them read as one
      let n = /** @type {any} */ (e).count;
      while (i + 1 < shown.length && shown[i + 1].type === SKIPPED) n += /** @type {any} */ (shown[++i]).count;
      rows.push(`<tr class="ev-skipped" data-type="${SKIPPED}"><td colspan="5">${Number(n).toLocaleString()} event${n === 1 ? "" : "s"} not shown (too many at once, or missed while catching up)</td></tr>`);
      continue;
    }
    const [what, size, why] = describeEvent(e);
    const t = new Date((e.ts || 0) * 1000).toLocaleTimeString([], { hour12: false });
    const hot = e.type === "oom" && e.cause === "fragmentation" ? " hot" : "";
    rows.push(`<tr class="ev ev-${e.type}${hot}" data-type="${e.type}"><td>${t}</td><td><span class="tag">${e.type}</span></td><td>${escapeHtml(String(what))}</td><td>${size}</td><td>${escapeHtml(String(why))}</td></tr>`);
  }
  tbody.innerHTML = rows.length ? rows.join("") : `<tr class="empty"><td colspan="5">no events of the selected types yet</td></tr>`;
}

/** @param {HTMLElement} box @param {import("./model.js").Alert[]} alerts */
export function renderAlerts(box, alerts) {
  const html = alerts.map((a) => `<div class="alert ${a.level}" data-code="${a.code}" role="alert">${escapeHtml(a.message)}</div>`).join("");
  if (box.innerHTML !== html) box.innerHTML = html;
}
