// What the page shows of a mirror pool (strategy "mirror"): the engine's cached block set on
// logical slots, the health of the event stream it follows, the engine's own numbers, and the
// prefix forest's shape. Pure functions of the stats / forest JSON (node-tested).

import { escapeHtml } from "./dom.js";
import { pct } from "./model.js";

/** The forest is fetched this often while a mirror pool is shown (GET /api/pools/{pool}/forest). */
export const FOREST_REFRESH_MS = 2000;

/** @param {any} s pool stats @returns {boolean} */
export function isMirror(s) {
  return !!s && s.strategy === "mirror";
}

/**
 * Problems the page must say out loud: events lost (the mirror may differ from the engine),
 * bad input from the engine, hashes without a slot. Each {level, code, message}.
 * @param {any} s pool stats
 */
export function mirrorAlerts(s) {
  const m = (s && s.mirror) || {};
  const src = m.source || {};
  const out = [];
  if (src.lost_batches > 0) {
    out.push({ level: "warn", code: "mirror-lost", message: `${src.lost_batches.toLocaleString()} event batches were lost (not in the engine's replay buffer): the mirror may differ from the engine until its cache turns over` });
  }
  if (src.error_count > 0) {
    out.push({ level: "warn", code: "mirror-errors", message: `${src.error_count.toLocaleString()} bad messages from the engine (${errorSummary(src.errors)}); latest: ${src.last_error || "?"}` });
  }
  const eng = src.engine;
  if (eng && eng.failing) {
    out.push({ level: "warn", code: "mirror-metrics", message: `the engine's metrics could not be read ${eng.errors.toLocaleString()} times; latest: ${eng.last_error}` });
  }
  if (m.overflow > 0) {
    out.push({ level: "warn", code: "mirror-overflow", message: `${m.overflow.toLocaleString()} cached blocks had no free logical slot: num_blocks is smaller than the engine's cache` });
  }
  return out;
}

/** "2 frames, 1 malformed" from the error counters (zero ones left out). @param {Record<string, number>} errors */
export function errorSummary(errors) {
  return Object.entries(errors || {}).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k.replace(/_/g, " ")}`).join(", ") || "none";
}

/**
 * The "Now" cells of a mirror pool.
 * @param {any} s pool stats
 * @param {any} [forest] GET /forest answer, when fetched
 */
export function mirrorNumbersHtml(s, forest) {
  const m = s.mirror || {};
  const src = m.source || {};
  const eng = (src.engine && src.engine.latest) || null;
  const cell = (label, value, sub = "", cls = "") => `<div class="num ${cls}"><label>${label}</label><b>${value}</b><small>${sub}</small></div>`;
  const num = (v) => (v == null ? "—" : Number(v).toLocaleString());
  const state = src.state || "not connected";
  const cells = [
    cell("cached blocks", num(m.cached_blocks), `${m.copies != null && m.copies !== m.cached_blocks ? `${num(m.copies)} copies ` : ""}on ${num(s.total_blocks)} logical slots (not the engine's block ids) · ${pct(s.utilization)}`),
    cell("stream", escapeHtml(state), `seq ${num(src.last_seq)} · ${num(src.batches)} batches · ${num(src.restarts)} restarts`, state === "live" ? "" : "hot"),
    cell("lost events", num(src.lost_batches || 0), `${num(src.gaps || 0)} gaps · ${num(src.replayed_batches || 0)} batches replayed`, src.lost_batches > 0 ? "hot" : ""),
    cell("errors", num(src.error_count || 0), escapeHtml(src.error_count ? errorSummary(src.errors) : "no bad input"), src.error_count > 0 ? "hot" : ""),
    cell("stored / removed", `${num(m.stored_blocks)} / ${num(m.removed_blocks)}`, `${num(m.cleared_events)} clears · ${num(m.unknown_removes)} unknown removes`),
  ];
  if (eng) {
    cells.push(cell("engine KV usage", eng.kv_usage == null ? "—" : pct(eng.kv_usage), `${num(eng.num_gpu_blocks)} GPU blocks (its /metrics)`));
    cells.push(cell("engine hit ratio", eng.hit_ratio == null ? "—" : pct(eng.hit_ratio), "prefix cache, last interval"));
  }
  if (forest) {
    const top = (forest.top_prefixes || [])[0];
    cells.push(cell("prefix forest", `${num(forest.trees)} trees`, `${num(forest.roots)} roots · ${num(forest.orphans)} orphans · depth ≤ ${num(forest.max_depth)} (mean ${forest.mean_depth})`));
    cells.push(cell("most shared prefix", top ? `${num(top.descendants)} below` : "—", top ? `${top.hash.slice(0, 8)}… depth ${top.depth}${top.tokens ? ` (${num(top.tokens)} tokens)` : ""} · ${top.children} branches` : "no block with two cached children"));
  }
  return cells.join("");
}

/** The pool line under the title. @param {any} c pool config */
export function describeMirror(c) {
  const src = c.source || {};
  return [`mirror of ${src.endpoint || "?"}${src.topic ? ` (topic ${src.topic})` : ""}`,
    `${Number(c.num_blocks).toLocaleString()} logical slots`, "positions are not the engine's"].join(" · ");
}

/**
 * Log row of a prefix-cache event: [what, size, why].
 * @param {any} e
 * @returns {[string, string, string] | null} null for another kind
 */
export function describePrefixEvent(e) {
  const n = (e.block_hashes || []).length;
  const first = n ? hex(e.block_hashes[0]) : "";
  switch (e.type) {
    case "stored":
      return [`${n} block${n === 1 ? "" : "s"} ${first}…`, e.block_size ? `${n * e.block_size} tokens` : "", e.parent_block_hash == null ? "new root" : `under ${hex(e.parent_block_hash)}…`];
    case "removed":
      return [`${n} block${n === 1 ? "" : "s"} ${first}…`, "", e.reason || ""];
    case "cleared":
      return [`all ${n} blocks`, "", "engine cleared its cache (or restarted)"];
    default:
      return null;
  }
}

/** First 8 hex digits of a hash (a JSON number may have lost its low bits: only a label). */
function hex(h) {
  try {
    return BigInt(h).toString(16).padStart(16, "0").slice(0, 8);
  } catch {
    return String(h).slice(0, 8);
  }
}
