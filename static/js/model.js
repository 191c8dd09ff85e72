// Pure state of one pool as the page sees it: block map, dirty regions, stats history, events,
// alerts. No DOM, no network: main.js feeds it stream messages, heatmap/charts read it.

import { setVocab, stateCodes } from "./vocab.js";

/** Stats samples kept for the charts: 4 samples/s (server rate) x 5 minutes. */
export const HISTORY_CAPACITY = 1200;
/** Events kept for the log; older ones fall off (the server keeps its own ring). */
export const EVENT_CAPACITY = 500;
/** Creation times kept for tooltips; past this many live ids the oldest knowledge is dropped. */
export const MAX_TRACKED_ALLOCATIONS = 200_000;
/** Freed allocation ids remembered, so that hovering their stale cells never asks the server. */
export const MAX_GONE_IDS = 50_000;
/** Events asked for when filling a gap after a resync or a reconnect (the log keeps fewer anyway). */
export const BACKFILL_LIMIT = 1000;
/** Past this many separate dirty ranges, repainting their union is cheaper than tracking them. */
export const MAX_DIRTY_RANGES = 256;

export const DEFAULT_THRESHOLDS = Object.freeze({
  utilizationWarn: 0.9,
  utilizationCritical: 0.98,
  externalFragmentationWarn: 0.5,
});

/**
 * @typedef {Object} PoolConfig  GET /api/pools/{pool} "config"
 * @property {string} name
 * @property {string} strategy  a name of the vocabulary (vocab.js, GET /api/meta)
 * @property {number} num_blocks
 * @property {number} block_bytes
 * @property {number} capacity_bytes
 * @property {string} device
 * @property {string} [fit]
 * @property {{capacity_bytes:number, policy:string}|null} [cache]
 */

/**
 * @typedef {Object} PoolStats  GET /api/pools/{pool}/stats
 * @property {number} total_blocks
 * @property {number} used_blocks
 * @property {number} free_blocks
 * @property {number} utilization
 * @property {number} internal_fragmentation
 * @property {number} external_fragmentation
 * @property {number} largest_free_bytes
 * @property {number} [free_bytes]
 * @property {boolean} [scatter_fails]  whether scattered free space can fail a request here (false: paged)
 * @property {number} [stranded_free_bytes]  free bytes outside the largest extent where it can, else 0
 * @property {{capacity:number, fragmentation:number}} ooms
 * @property {Object<string, number>} [counters]
 * @property {{hits?:number, misses?:number, hit_rate?:number, evictions?:number|Object<string,number>, policy?:string, used_bytes?:number, capacity_bytes?:number, entries?:number}} [cache]
 */

/**
 * @typedef {Object} PoolEvent  one entry of an `events` message (fields per kind: allocator/vocab.py EVENT_KINDS)
 * @property {number} seq
 * @property {number} ts       unix seconds
 * @property {string} type     an event kind of the vocabulary (vocab.js `vocab().events`)
 * @property {string} [key]
 * @property {number} [id]
 * @property {number} [bytes]
 * @property {number} [blocks]
 * @property {string} [reason]
 * @property {string} [policy]
 * @property {string} [cause]
 * @property {number} [requested_bytes]
 * @property {number} [free_bytes]
 * @property {number} [largest_free_bytes]
 */

/** @typedef {{type:"hello", protocol:number, pool:PoolConfig, states:Object<string,string>, last_event_seq:number, meta?:import("./vocab.js").Meta, instance_id?:string, started_at?:number}} HelloMessage */
/** @typedef {{type:"events", events:PoolEvent[], skipped?:number}} EventsMessage  skipped: events the server left out just before this batch */
/** @typedef {{type:"resync", last_event_seq:number}} ResyncMessage  after a resync snapshot: queued events up to last_event_seq were dropped */
/** @typedef {{events:PoolEvent[], last_seq:number}} EventPage  GET /api/pools/{pool}/events?after=&limit= */
/** @typedef {{after:number, upto:number, limit:number, skipped:number}} EventGap  what to fetch: seq in (after, upto], `skipped` older ones given up */
/** @typedef {{type:"stats", stats:PoolStats}} StatsMessage */
/** @typedef {{type:"order", ids:number[], keys:string[], truncated:boolean}} OrderMessage */
/** @typedef {{type:"prefix", order:number[], truncated:boolean, shared:{blocks:number[], refcounts:number[]}}} PrefixMessage */
/** @typedef {{name:string, state:string, done:number, total:number, error?:string}} WorkloadProgress  state: running|finished|stopped|failed (`error` says why) */
/** @typedef {{type:"progress", workload:WorkloadProgress}} ProgressMessage */
/** @typedef {{type:"closed", reason:string}} ClosedMessage */

/** @typedef {{code:string, level:"warn"|"critical", message:string}} Alert */

/** Sum a counter that the server may report as a number or as {reason: count}. */
export function counterTotal(value) {
  if (typeof value === "number") return value;
  if (value && typeof value === "object") return Object.values(value).reduce((a, b) => a + (Number(b) || 0), 0);
  return 0;
}

/**
 * Hit rate from cache stats (a mirror pool: the engine's own prefix hit ratio from its /metrics;
 * a prefix-caching pool: the token-weighted prefix hit ratio, prompt tokens served from the cache
 * over prompt tokens), or null when there is nothing to rate yet.
 */
export function hitRateOf(stats) {
  const p = stats && /** @type {any} */ (stats).prefix;
  if (p) return p.queries > 0 ? p.hits / p.queries : null;
  const c = stats && stats.cache;
  if (!c) {
    const eng = stats && stats.mirror && stats.mirror.source && stats.mirror.source.engine;
    const hr = eng && eng.latest ? eng.latest.hit_ratio : null;
    return typeof hr === "number" ? hr : null;
  }
  const hits = Number(c.hits) || 0;
  const misses = Number(c.misses) || 0;
  if ((c.hits != null || c.misses != null) && hits + misses === 0) return null; // no lookups yet
  if (typeof c.hit_rate === "number") return c.hit_rate;
  return hits + misses > 0 ? hits / (hits + misses) : null;
}

/** Fixed-capacity ring of stats samples, read oldest-first as column arrays for uPlot. */
export class HistoryRing {
  /** @param {number} capacity @param {string[]} series */
  constructor(capacity, series) {
    this.capacity = capacity;
    this.series = series;
    this.columns = series.map(() => new Float64Array(capacity));
    this.length = 0;
    this.head = 0; // next write position
  }

  /** @param {number[]} values one per series, NaN for "no value" */
  push(values) {
    for (let s = 0; s < this.columns.length; s++) this.columns[s][this.head] = values[s];
    this.head = (this.head + 1) % this.capacity;
    if (this.length < this.capacity) this.length++;
  }

  /** Oldest-first plain arrays (uPlot wants arrays; nulls for gaps). */
  toArrays() {
    const start = (this.head - this.length + this.capacity) % this.capacity;
    return this.columns.map((col) => {
      const out = new Array(this.length);
      for (let i = 0; i < this.length; i++) {
        const v = col[(start + i) % this.capacity];
        out[i] = Number.isNaN(v) ? null : v;
      }
      return out;
    });
  }
}

export const HISTORY_SERIES = ["t", "utilization", "internal", "external", "evictionsPerSec", "hitRate", "oomCapacity", "oomFragmentation"];

/**
 * Keep only events whose type is in `types` (all when `types` is empty or null).
 * @param {PoolEvent[]} events @param {Set<string>|string[]|null} types
 */
export function filterEvents(events, types) {
  if (!types) return events.slice();
  const set = types instanceof Set ? types : new Set(types);
  if (set.size === 0) return events.slice();
  // a "skipped" marker says the log has a hole, whatever the filter: it stays
  return events.filter((e) => set.has(e.type) || e.type === SKIPPED);
}

/** Type of the log's own marker rows: `count` events the page never received. */
export const SKIPPED = "skipped";

/** @param {number} seq just below the first event after the hole @param {number} ts @param {number} count */
const skippedMarker = (seq, ts, count) => /** @type {PoolEvent} */ ({ seq, ts, type: SKIPPED, count });

/**
 * Share of the pool's blocks that cannot be reclaimed (used or pinned): a cache pool full of
 * evictable entries is working as intended, not close to failing.
 * @param {PoolStats|null} stats
 */
export function pressureOf(stats) {
  if (!stats) return 0;
  const by = /** @type {any} */ (stats).blocks_by_state;
  if (!by || !stats.total_blocks) return stats.utilization || 0;
  return ((by.used || 0) + (by.pinned || 0)) / stats.total_blocks;
}

/**
 * Alerts for the banner, from the latest stats and the "OOM with memory free" latch.
 * @param {PoolStats|null} stats
 * @param {PoolEvent|null} fragmentationOom the latest oom event with cause fragmentation since the last defragment/reset
 * @param {typeof DEFAULT_THRESHOLDS} [thresholds]
 * @returns {Alert[]}
 */
export function computeAlerts(stats, fragmentationOom, thresholds = DEFAULT_THRESHOLDS) {
  /** @type {Alert[]} */
  const alerts = [];
  if (fragmentationOom) {
    const e = fragmentationOom;
    alerts.push({
      code: "oom-fragmentation",
      level: "critical",
      message: `OOM with memory free: a ${formatBytes(e.requested_bytes)} request failed while ${formatBytes(e.free_bytes)} was free (largest free extent ${formatBytes(e.largest_free_bytes)}). Defragment to recover.`,
    });
  }
  if (!stats) return alerts;
  const u = pressureOf(stats);
  const what = stats.cache ? `${pct(u)} of the pool is held by allocations the cache cannot evict` : `Utilization ${pct(u)}`;
  if (u >= thresholds.utilizationCritical) {
    alerts.push({ code: "utilization", level: "critical", message: `${what}: the pool is full.` });
  } else if (u >= thresholds.utilizationWarn) {
    alerts.push({ code: "utilization", level: "warn", message: `${what}: close to full.` });
  }
  const ext = stats.external_fragmentation;
  // the server says whether scattered free space can fail a request here (on a paged pool it cannot)
  if (stats.scatter_fails !== false && ext >= thresholds.externalFragmentationWarn && stats.free_blocks > 0) {
    alerts.push({ code: "fragmentation", level: "warn", message: `External fragmentation ${pct(ext)}: free memory is scattered.` });
  }
  return alerts;
}

/** @param {number} x */
export function pct(x) {
  return `${(100 * (x || 0)).toFixed(1)}%`;
}

/** @param {number|undefined|null} n */
export function formatBytes(n) {
  if (n == null || Number.isNaN(n)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${u === 0 ? v : v.toFixed(v >= 100 ? 0 : 1)} ${units[u]}`;
}

/**
 * How to show a workload's progress: the line's text, the full error (for a tooltip), the bar's
 * fraction, and whether it failed. A failed workload reads "failed: <error>", never "finished".
 * @param {WorkloadProgress|null|undefined} w
 * @returns {{text:string, state:string, failed:boolean, error:string, frac:number}|null}
 */
export function describeWorkload(w) {
  if (!w) return null;
  const failed = w.state === "failed";
  const error = failed ? String(w.error || "unknown error") : "";
  const done = w.done ?? 0;
  const count = `${done}/${w.total || "?"}`;
  const frac = w.total ? Math.max(0, Math.min(1, done / w.total)) : 0;
  const text = failed ? `${w.name} · failed at ${count}: ${error}` : `${w.name} · ${w.state} · ${count}`;
  return { text, state: w.state, failed, error, frac };
}

/**
 * The page's copy of one pool. Invariants: `owner.length === state.length === blocks`;
 * `dirty` holds disjoint-or-overlapping [start, end) block ranges changed since the last
 * `takeDirty()`, or `allDirty` is set; `events` is newest first and at most EVENT_CAPACITY long.
 */
export class PoolModel {
  constructor() {
    /** @type {PoolConfig|null} */
    this.config = null;
    /** @type {Object<string, number>} block-state name -> code, from the hello's `states` */
    this.codes = {};
    /** @type {string[]} block-state code -> name */
    this.stateNames = [];
    this.blocks = 0;
    this.owner = new Int32Array(0);
    this.state = new Uint8Array(0);
    this.lastFrame = -1;
    /** @type {[number, number][]} */
    this.dirty = [];
    this.allDirty = false;
    /** @type {PoolStats|null} */
    this.stats = null;
    this.history = new HistoryRing(HISTORY_CAPACITY, HISTORY_SERIES);
    /** @type {PoolEvent[]} newest first */
    this.events = [];
    this.evictionCount = 0;
    this.lastSample = null;
    /** @type {PoolEvent|null} */
    this.fragmentationOom = null;
    this.lastFragOomCounter = null;
    /** @type {Map<number, number>} allocation id -> rank in eviction order (0 = next victim) */
    this.orderRank = new Map();
    this.orderLength = 0;
    this.orderVersion = 0;
    /** @type {Map<number, number>} prefix pools: idle cached block -> rank in eviction order */
    this.blockRank = new Map();
    /** @type {Map<number, number>} prefix pools: block held by 2+ sequences -> reference count */
    this.refcount = new Map();
    /** @type {Map<number, number>} allocation id -> creation time (unix s), from allocate/put events */
    this.createdAt = new Map();
    /** @type {Map<number, string>} allocation id -> cache key, learnt from put events and order */
    this.keyById = new Map();
    /** Newest event seq received (stream or backfill); gaps are measured from it. */
    this.lastSeq = 0;
    /** Seq of the newest oom/defragment/reset applied: an older one (from a backfill) never overrides it. */
    this.latchSeq = -1;
    /** @type {Set<number>} ids seen freed, oldest first (a Set keeps insertion order) */
    this.goneIds = new Set();
    /** @type {WorkloadProgress|null} */
    this.workload = null;
    this.thresholds = { ...DEFAULT_THRESHOLDS };
    /** The server process of the last hello (`instance_id`); null before the first. */
    this.instanceId = null;
    /** Set when a hello came from another server process than the one before: the server
     * restarted and everything it held (pools, events, allocations) is new. Until the next hello. */
    this.restarted = false;
  }

  /** @param {HelloMessage} hello */
  applyHello(hello) {
    this.config = hello.pool;
    this.codes = stateCodes(hello.states);
    this.stateNames = [];
    for (const [name, code] of Object.entries(this.codes)) this.stateNames[code] = name;
    setVocab(hello.meta);
    this.resize(hello.pool.num_blocks);
    this.lastFrame = -1;
    const seq = Number(hello.last_event_seq) || 0;
    const instance = hello.instance_id || null;
    this.restarted = Boolean(instance && this.instanceId && instance !== this.instanceId);
    this.instanceId = instance || this.instanceId;
    if (this.restarted) {
      // another process: its seqs and ids restart from scratch, and our history is not its
      this.lastSeq = seq;
      this.latchSeq = -1;
      this.goneIds.clear();
      this.events = [];
      this.keyById.clear();
      this.createdAt.clear();
      this.fragmentationOom = null;
    } else if (seq < this.lastSeq) {
      // a restarted server numbers events and allocations from scratch: our old ones mean nothing
      this.lastSeq = seq;
      this.latchSeq = -1;
      this.goneIds.clear();
    } else if (this.lastSeq === 0) this.lastSeq = seq;
  }

  /**
   * The events to fetch so that the log has no hole up to `upto` (a `resync` message's, or a
   * reconnect's `hello` `last_event_seq`); null when nothing is missing. Only the newest
   * BACKFILL_LIMIT are asked for; the older ones are reported as `skipped`.
   * @param {number} upto
   * @returns {EventGap|null}
   */
  gapUpTo(upto) {
    if (!(upto > this.lastSeq)) return null;
    const after = Math.max(this.lastSeq, upto - BACKFILL_LIMIT);
    return { after, upto, limit: BACKFILL_LIMIT, skipped: after - this.lastSeq };
  }

  /**
   * Fill a hole in the log with fetched events. Live batches may have arrived meanwhile: only
   * events inside the gap and not already held are added, in seq order with the rest.
   * @param {EventGap} gap @param {EventPage|PoolEvent[]} page
   */
  applyBackfill(gap, page) {
    const list = Array.isArray(page) ? page : (page && page.events) || [];
    const have = new Set(this.events.map((e) => e.seq));
    const fresh = list.filter((e) => e.seq > gap.after && e.seq <= gap.upto && !have.has(e.seq));
    this.noteEvents(fresh);
    const got = fresh.length ? fresh[fresh.length - 1].seq : gap.after;
    const added = fresh.slice().reverse();
    // events the server no longer holds, or beyond the page: say so rather than hide the hole
    const missingOld = gap.skipped + (fresh.length ? fresh[0].seq - gap.after - 1 : 0);
    const missingNew = gap.upto - got;
    if (missingNew > 0 && fresh.length) added.unshift(skippedMarker(got + 0.5, fresh[fresh.length - 1].ts, missingNew));
    if (!fresh.length && gap.upto > gap.after) added.push(skippedMarker(gap.after + 0.5, Date.now() / 1000, gap.upto - gap.after + gap.skipped));
    else if (missingOld > 0) added.push(skippedMarker(gap.after - 0.5, fresh[0].ts, missingOld));
    this.events = this.events.concat(added).sort((a, b) => b.seq - a.seq);
    if (this.events.length > EVENT_CAPACITY) this.events.length = EVENT_CAPACITY;
    if (gap.upto > this.lastSeq) this.lastSeq = gap.upto;
  }

  /** Was allocation `id` seen freed (so asking the server about it would only 404)? @param {number} id */
  isGone(id) {
    return this.goneIds.has(id);
  }

  /** @param {number} blocks */
  resize(blocks) {
    if (blocks !== this.blocks) {
      this.blocks = blocks;
      this.owner = new Int32Array(blocks).fill(-1);
      this.state = new Uint8Array(blocks);
    }
    this.markAllDirty();
  }

  /**
   * Apply a decoded binary frame. A snapshot replaces the whole map; a delta patches its runs.
   * @param {import("./frames.js").Frame} frame
   */
  applyFrame(frame) {
    if (frame.kind === 1 || frame.blocks !== this.blocks) this.resize(frame.blocks);
    for (const run of frame.runs) {
      this.owner.set(run.owner, run.start);
      this.state.set(run.state, run.start);
      if (frame.kind !== 1) this.markDirty(run.start, run.start + run.count);
    }
    this.lastFrame = frame.frame;
  }

  markAllDirty() {
    this.allDirty = true;
    this.dirty.length = 0;
  }

  /** @param {number} start @param {number} end */
  markDirty(start, end) {
    if (this.allDirty) return;
    if (this.dirty.length >= MAX_DIRTY_RANGES) {
      let lo = start;
      let hi = end;
      for (const [s, e] of this.dirty) {
        if (s < lo) lo = s;
        if (e > hi) hi = e;
      }
      this.dirty = [[lo, hi]];
      return;
    }
    this.dirty.push([start, end]);
  }

  /** Return and clear what changed: null when nothing, "all", or sorted merged ranges. */
  takeDirty() {
    if (this.allDirty) {
      this.allDirty = false;
      this.dirty.length = 0;
      return "all";
    }
    if (this.dirty.length === 0) return null;
    const ranges = this.dirty.sort((a, b) => a[0] - b[0]);
    /** @type {[number, number][]} */
    const merged = [];
    for (const [s, e] of ranges) {
      const last = merged[merged.length - 1];
      if (last && s <= last[1]) last[1] = Math.max(last[1], e);
      else merged.push([s, e]);
    }
    this.dirty = [];
    return merged;
  }

  /** Counts by state code, from the map itself (what the heatmap should show). */
  countStates() {
    const counts = [0, 0, 0, 0];
    const st = this.state;
    for (let i = 0; i < st.length; i++) counts[st[i] & 3]++;
    return counts;
  }

  /** @param {PoolStats} stats @param {number} [now] seconds */
  applyStats(stats, now = Date.now() / 1000) {
    this.stats = stats;
    const frag = stats.ooms ? stats.ooms.fragmentation : 0;
    if (this.lastFragOomCounter != null && frag > this.lastFragOomCounter && !this.fragmentationOom) {
      // The event itself may have fallen out of a dropped batch; the counter is authoritative.
      // newer than every event seen so far, so a backfilled older defragment cannot clear it
      this.latchSeq = this.lastSeq;
      this.fragmentationOom = { seq: this.lastSeq, ts: now, type: "oom", cause: "fragmentation", requested_bytes: undefined, free_bytes: stats.free_bytes, largest_free_bytes: stats.largest_free_bytes };
    }
    this.lastFragOomCounter = frag;
    let evictionsPerSec = NaN;
    // a mirror pool: blocks the engine removed stand for its evictions; a prefix pool: its own
    const prefix = /** @type {any} */ (stats).prefix;
    const evictTotal = prefix ? Number(prefix.evicted) || 0
      : stats.cache ? counterTotal(stats.cache.evictions) || this.evictionCount
      : stats.mirror ? Number(stats.mirror.removed_blocks) || 0 : this.evictionCount;
    if (this.lastSample) {
      const dt = now - this.lastSample.t;
      if (dt > 0) evictionsPerSec = Math.max(0, evictTotal - this.lastSample.evictions) / dt;
    }
    this.lastSample = { t: now, evictions: evictTotal };
    const hr = hitRateOf(stats);
    this.history.push([
      now,
      stats.utilization,
      stats.internal_fragmentation,
      stats.external_fragmentation,
      evictionsPerSec,
      hr == null ? NaN : hr,
      stats.ooms ? stats.ooms.capacity : 0,
      frag,
    ]);
  }

  /** Latest evictions/s sample (NaN before two samples). */
  evictionsPerSec() {
    const h = this.history;
    if (h.length === 0) return NaN;
    return h.columns[4][(h.head - 1 + h.capacity) % h.capacity];
  }

  /**
   * @param {PoolEvent[]} events oldest first, as the server sends them
   * @param {number} [skipped] events the server left out just before this batch
   */
  applyEvents(events, skipped = 0) {
    this.noteEvents(events);
    const fresh = events.slice().reverse();
    if (skipped > 0 && events.length) fresh.push(skippedMarker(events[0].seq - 0.5, events[0].ts, skipped));
    this.events = fresh.concat(this.events);
    if (this.events.length > EVENT_CAPACITY) this.events.length = EVENT_CAPACITY;
  }

  /** Side effects of events on the model (counters, latches, what is known per id); any order. @param {PoolEvent[]} events */
  noteEvents(events) {
    for (const e of events) {
      if (e.seq > this.lastSeq) this.lastSeq = e.seq;
      switch (e.type) {
        case "evict":
          this.evictionCount++;
          break;
        case "oom":
          if (e.cause === "fragmentation") this.latch(e, e);
          break;
        case "defragment":
          this.latch(e, null);
          break;
        case "reset":
          this.latch(e, null);
          this.createdAt.clear();
          break;
        case "put":
          if (e.id != null && this.goneIds.has(e.id)) break; // freed since (a backfill is late)
          if (e.id != null && e.key != null) this.keyById.set(e.id, e.key);
          if (e.id != null) this.trackCreated(e.id, e.ts);
          break;
        case "allocate":
          if (e.id != null && !this.goneIds.has(e.id)) this.trackCreated(e.id, e.ts);
          break;
        case "free":
          this.createdAt.delete(/** @type {number} */ (e.id));
          this.keyById.delete(/** @type {number} */ (e.id));
          this.markGone(/** @type {number} */ (e.id));
          break;
        default:
          break;
      }
    }
  }

  /** The OOM banner follows the newest of oom/defragment/reset by seq, whatever order they came in. @param {PoolEvent} e @param {PoolEvent|null} value */
  latch(e, value) {
    if (e.seq <= this.latchSeq) return;
    this.latchSeq = e.seq;
    this.fragmentationOom = value;
  }

  /** @param {number} id */
  markGone(id) {
    if (id == null) return;
    if (this.goneIds.size >= MAX_GONE_IDS) {
      const oldest = this.goneIds.values().next().value;
      this.goneIds.delete(/** @type {number} */ (oldest));
    }
    this.goneIds.add(id);
  }

  /** @param {number} id @param {number} ts */
  trackCreated(id, ts) {
    if (this.createdAt.size >= MAX_TRACKED_ALLOCATIONS) this.createdAt.clear();
    this.createdAt.set(id, ts);
  }

  /**
   * A prefix-caching pool's eviction order (by block) and reference counts of shared blocks.
   * @param {PrefixMessage} msg
   */
  applyPrefix(msg) {
    this.blockRank = new Map();
    (msg.order || []).forEach((b, i) => this.blockRank.set(b, i));
    this.orderLength = (msg.order || []).length;
    this.refcount = new Map();
    const shared = msg.shared || { blocks: [], refcounts: [] };
    shared.blocks.forEach((b, i) => this.refcount.set(b, shared.refcounts[i]));
    this.orderVersion++;
  }

  /** Reference count of block i as the page knows it (prefix pools): from the state and the last prefix message. @param {number} i */
  refcountOf(i) {
    const st = this.state[i];
    const c = this.codes;
    if (st === c.shared) return this.refcount.get(i) || 2;
    return st === c.used || st === c.pinned ? 1 : 0;
  }

  /** @param {OrderMessage} order */
  applyOrder(order) {
    this.orderRank = new Map();
    order.ids.forEach((id, i) => {
      this.orderRank.set(id, i);
      if (order.keys && order.keys[i] != null) this.keyById.set(id, order.keys[i]);
    });
    this.orderLength = order.ids.length;
    this.orderVersion++;
  }

  /** @param {WorkloadProgress} w */
  applyProgress(w) {
    this.workload = w;
  }

  /**
   * Apply one JSON stream message (docs/STREAM.md). Returns the hole in the event log that the
   * caller should fetch and hand to `applyBackfill` (after a reconnect's `hello` or a `resync`),
   * or null. Messages the model does not keep (`closed`, unknown types) change nothing.
   * @param {{type: string} & Record<string, any>} msg
   * @returns {EventGap|null}
   */
  applyMessage(msg) {
    switch (msg.type) {
      case "hello":
        this.applyHello(/** @type {HelloMessage} */ (msg));
        return this.gapUpTo(msg.last_event_seq); // events missed while disconnected
      case "resync":
        return this.gapUpTo(msg.last_event_seq); // the server dropped our backlog
      case "events":
        this.applyEvents(msg.events || [], msg.skipped || 0);
        return null;
      case "stats":
        this.applyStats(msg.stats);
        return null;
      case "order":
        this.applyOrder(/** @type {OrderMessage} */ (msg));
        return null;
      case "prefix":
        this.applyPrefix(/** @type {PrefixMessage} */ (msg));
        return null;
      case "progress":
        this.applyProgress(msg.workload);
        return null;
      default:
        return null;
    }
  }

  /** Current alerts for the banner. */
  alerts() {
    return computeAlerts(this.stats, this.fragmentationOom, this.thresholds);
  }

  clearEvents() {
    this.events = [];
  }
}

const SIZE_UNITS = { b: 1, kb: 1000, mb: 1e6, gb: 1e9, k: 1024, kib: 1024, m: 1024 ** 2, mib: 1024 ** 2, g: 1024 ** 3, gib: 1024 ** 3 };

/**
 * Parse "4096", "64 KiB", "1.5MiB" into {bytes}, or "200 tok" / "200 tokens" into {tokens}.
 * @param {string} text
 * @returns {{bytes:number}|{tokens:number}|null} null when it is not a positive size
 */
export function parseSize(text) {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(String(text));
  if (!m) return null;
  const n = Number(m[1]);
  const unit = m[2].toLowerCase();
  if (unit.startsWith("tok")) return Number.isInteger(n) && n > 0 ? { tokens: n } : null;
  const mult = unit === "" ? 1 : SIZE_UNITS[unit];
  if (!mult) return null;
  const bytes = Math.round(n * mult);
  return bytes > 0 ? { bytes } : null;
}
