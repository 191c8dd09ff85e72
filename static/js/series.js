// The charts rebuilt from a pool's history (GET .../history/series): which stretch to ask for
// (an opened recording: all of it; a live pool scrubbed back: up to the chosen moment; live:
// none, the stream's samples), the answer turned into the chart columns, and a loader that keeps
// one request in flight and drops answers nobody wants any more. No DOM.

import { HISTORY_SERIES } from "./model.js";

/** Points asked for: about one per horizontal pixel pair of a chart; the server allows 2000. */
export const SERIES_POINTS = 300;
/** Least time between two requests while the wanted stretch keeps moving (dragging, playing):
 * each is a replay of the stretch on the server. */
export const SERIES_MIN_INTERVAL_MS = 400;

/**
 * @typedef {Object} SeriesBody  GET /api/pools/{pool}/history/series (allocator/history/series.py FIELDS)
 * @property {number} from_seq
 * @property {number} to_seq
 * @property {{seq:number[], ts:(number|null)[], utilization:number[], internal_fragmentation:number[],
 *   external_fragmentation:number[], ooms_capacity:number[], ooms_fragmentation:number[],
 *   evictions:number[], hits:number[], misses:number[], cache_hit_rate?:(number|null)[]}} columns
 */
/** @typedef {{from:number, to:number}} SeriesRange */

/**
 * Which stretch of the history the charts show, or null for the live samples.
 * @param {{mode:string, seq:number, first:number, last:number}|null} tl the timeline's state
 * @param {boolean} recording whether the pool is an opened recording (nothing live to show)
 * @returns {SeriesRange|null}
 */
export function seriesRange(tl, recording) {
  if (!tl || tl.last <= tl.first) return null; // no history (yet)
  if (recording) return { from: tl.first, to: tl.last };
  return tl.mode === "past" ? { from: tl.first, to: Math.max(tl.first, tl.seq) } : null;
}

/** @param {Object|null} config a pool's config (hello / GET pool): is it an opened recording? */
export const isRecording = (config) => Boolean(config && (config.device === "recording" || config.recording));

/**
 * The answer as chart columns in model.HISTORY_SERIES order (x = the events' unix times). Points
 * without a time (the keyframe the history starts at) are left out. Evictions/s is the evictions
 * since the previous point over the time between them; the hit rate is the cache's lifetime
 * rate (`cache_hit_rate`, what the live chart plots) where the history holds it, else hits over
 * lookups from the first point on, null before any lookup.
 * @param {SeriesBody} body
 * @returns {(number|null)[][]}
 */
export function seriesColumns(body) {
  const c = body.columns;
  const out = HISTORY_SERIES.map(() => /** @type {(number|null)[]} */ ([]));
  let hits = 0;
  let lookups = 0;
  let prevTs = null;
  for (let i = 0; i < c.seq.length; i++) {
    hits += c.hits[i];
    lookups += c.hits[i] + c.misses[i];
    const ts = c.ts[i];
    if (ts == null) continue;
    const dt = prevTs == null ? 0 : ts - prevTs;
    const row = [
      ts,
      c.utilization[i],
      c.internal_fragmentation[i],
      c.external_fragmentation[i],
      dt > 0 ? c.evictions[i] / dt : null,
      c.cache_hit_rate && c.cache_hit_rate[i] != null ? c.cache_hit_rate[i] : lookups > 0 ? hits / lookups : null,
      c.ooms_capacity[i],
      c.ooms_fragmentation[i],
    ];
    row.forEach((v, k) => out[k].push(v));
    prevTs = ts;
  }
  return out;
}

/**
 * Keeps the charts on the wanted stretch: `want(range)` any number of times; at most one request
 * is in flight, the newest wanted stretch is fetched next (at least `minIntervalMs` after the
 * last one), an answer for a stretch no longer wanted is dropped, and `want(null)` hands the
 * charts back to the live samples at once. A failed stretch is not retried until another one
 * was wanted in between.
 * @param {(r: SeriesRange) => Promise<SeriesBody>} fetchSeries
 * @param {(cols: (number|null)[][]|null, r: SeriesRange|null) => void} onSeries
 * @param {{minIntervalMs?: number, onError?: (err: Error) => void}} [opts]
 */
export function createSeriesLoader(fetchSeries, onSeries, opts = {}) {
  const minInterval = opts.minIntervalMs ?? SERIES_MIN_INTERVAL_MS;
  /** @type {SeriesRange|null} */
  let wanted = null;
  let shownKey = ""; // "" = the live samples
  let failedKey = "";
  let inFlight = false;
  let lastStart = -Infinity;
  let timer = 0;
  let stopped = false;
  const keyOf = (r) => (r ? `${r.from}..${r.to}` : "");

  function pump() {
    if (stopped) return;
    if (!wanted) { // back to live: at once, whatever is in flight (its answer will be dropped)
      if (shownKey) {
        shownKey = "";
        onSeries(null, null);
      }
      return;
    }
    const key = keyOf(wanted);
    if (inFlight || key === shownKey || key === failedKey) return;
    const wait = lastStart + minInterval - Date.now();
    if (wait > 0) {
      if (!timer) timer = setTimeout(() => { timer = 0; pump(); }, wait);
      return;
    }
    const r = wanted;
    inFlight = true;
    lastStart = Date.now();
    fetchSeries(r)
      .then((body) => {
        if (stopped || keyOf(wanted) !== key) return; // moved on meanwhile
        shownKey = key;
        onSeries(seriesColumns(body), r);
      })
      .catch((err) => {
        failedKey = key;
        if (opts.onError && !stopped) opts.onError(err);
      })
      .finally(() => {
        inFlight = false;
        pump();
      });
  }

  return {
    /** @param {SeriesRange|null} r */
    want(r) {
      if (keyOf(r) !== keyOf(wanted)) failedKey = "";
      wanted = r;
      pump();
    },
    /** What is shown: "" for the live samples, else "from..to". */
    shown: () => shownKey,
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
