// REST client (docs/API.md, docs/ARCHITECTURE.md). Adds the bearer token kept in this tab's
// sessionStorage and turns `{"error": {code, message, details}}` bodies into ApiError. Modules call
// the typed client (`pools.create(body)`, `pool(name).allocate(size)`), never build URLs.

export const TOKEN_KEY = "kvscope.token";

export class ApiError extends Error {
  /** @param {number} status @param {string} code @param {string} message @param {Object} [details] */
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export function getToken() {
  try {
    return window.sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** @param {string|null} token */
export function setToken(token) {
  if (token) window.sessionStorage.setItem(TOKEN_KEY, token);
  else window.sessionStorage.removeItem(TOKEN_KEY);
}

/** Called on 401/403; resolves to true when a new token was entered and the call should retry. */
let onAuthRequired = async () => false;

/** @param {() => Promise<boolean>} fn */
export function setAuthHandler(fn) {
  onAuthRequired = fn;
}

/**
 * @param {string} method
 * @param {string} path  starting with /api/
 * @param {Object|Blob} [body]  JSON, or a Blob sent as application/octet-stream
 * @returns {Promise<any>} parsed JSON, or null for 204
 * @throws {ApiError}
 */
export async function api(method, path, body, retried = false) {
  /** @type {Record<string,string>} */
  const headers = {};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  // The server refuses a POST without it, body or not (a cross-site form could send one). A file
  // (Blob) goes as its bytes: the recording upload, the one route that takes octet-stream.
  const raw = typeof Blob !== "undefined" && body instanceof Blob;
  if (body !== undefined || method === "POST") headers["Content-Type"] = raw ? "application/octet-stream" : "application/json";
  const payload = body === undefined ? undefined : raw ? body : JSON.stringify(body);
  const res = await fetch(path, { method, headers, body: payload });
  if ((res.status === 401 || res.status === 403) && !retried) {
    if (await onAuthRequired()) return api(method, path, body, true);
  }
  if (res.status === 204) return null;
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const err = data && data.error;
    if (err) throw new ApiError(res.status, err.code, err.message, err.details);
    // not the server's error body: a proxy in between answered
    throw new ApiError(res.status, String(res.status), text.slice(0, 200) || res.statusText);
  }
  return data;
}

/** @param {string} pool */
export const poolPath = (pool) => `/api/pools/${encodeURIComponent(pool)}`;

/** Pool names from GET /api/pools (`{pools: [{name, ...}]}`), in the server's order. @returns {Promise<string[]>} */
export async function listPools() {
  const data = await api("GET", "/api/pools");
  return data.pools.map((p) => p.name);
}

/**
 * Events of a pool with seq in (gap.after, ...], at most gap.limit, oldest first: what a page
 * missed while the server dropped its backlog (a `resync`) or while it was disconnected.
 * @param {string} name @param {import("./model.js").EventGap} gap
 * @returns {Promise<import("./model.js").EventPage>}
 */
export function fetchEvents(name, gap) {
  return pool(name).events(gap);
}

/** @typedef {{bytes: number}|{tokens: number}} Size */

/** The pool collection: list, create. */
export const pools = {
  /** @returns {Promise<string[]>} */
  names: listPools,
  /** @param {Object} body app/schemas/pools.py PoolCreate */
  create: (body) => api("POST", "/api/pools", body),
};

/** The vocabulary (allocator/vocab.py), as GET /api/meta serves it. */
export const meta = () => api("GET", "/api/meta");

/** The bundled trace's hit ratio vs capacity per policy (GET /api/prefix/curve). */
export const prefixCurve = () => api("GET", "/api/prefix/curve");

/**
 * One pool's REST API, typed: every URL of it lives here.
 * @param {string} name
 */
export function pool(name) {
  const base = poolPath(name);
  const id = (/** @type {number|string} */ aid) => `${base}/allocations/${encodeURIComponent(aid)}`;
  const entry = (/** @type {string} */ key) => `${base}/entries/${encodeURIComponent(key)}`;
  return {
    name,
    get: () => api("GET", base),
    delete: () => api("DELETE", base),
    reset: () => api("POST", `${base}/reset`),
    defragment: () => api("POST", `${base}/defragment`),
    check: () => api("GET", `${base}/check`),
    stats: () => api("GET", `${base}/stats`),
    /** A mirror pool's prefix forest (roots, orphans, depth, most shared prefixes). */
    forest: () => api("GET", `${base}/forest`),
    /** @param {import("./model.js").EventGap} gap */
    events: (gap) => api("GET", `${base}/events?after=${gap.after}&limit=${gap.limit}`),
    /** @param {Size} size */
    allocate: (size) => api("POST", `${base}/allocations`, size),
    /** @param {number|string} aid */
    allocation: (aid) => api("GET", id(aid)),
    /** @param {number|string} aid @param {Size} size */
    extend: (aid, size) => api("POST", `${id(aid)}/extend`, size),
    /** @param {number|string} aid */
    free: (aid) => api("DELETE", id(aid)),
    /** @param {Object[]} ops app/schemas/ops.py Op, run in order */
    batch: (ops, stopOnError = false) => api("POST", `${base}/ops`, { ops, stop_on_error: stopOnError }),
    /** @param {string} key @param {Size & {priority?: number, ttl_s?: number, pinned?: boolean}} body */
    put: (key, body) => api("PUT", entry(key), body),
    /** @param {string} key */
    lookup: (key) => api("GET", entry(key)),
    /** @param {string} key */
    remove: (key) => api("DELETE", entry(key)),
    /** @param {string} key */
    evict: (key) => api("POST", `${entry(key)}/evict`),
    /** @param {string} policy */
    setPolicy: (policy) => api("PUT", `${base}/cache/policy`, { policy }),
    /** @param {Object} spec app/schemas/workload.py WorkloadIn */
    startWorkload: (spec) => api("POST", `${base}/workload`, spec),
    stopWorkload: () => api("DELETE", `${base}/workload`),
    /** A prefix-caching pool's block: refcount, hash, depth, hits (the tooltip). @param {number} b */
    block: (b) => api("GET", `${base}/prefix-cache/blocks/${b}`),
    /** The kept history's range: {first_seq, last_seq, dropped_events, ...} */
    history: () => api("GET", `${base}/history`),
    /** @param {{after?: number, limit?: number, kinds?: string[]}} q */
    historyEvents: (q) =>
      api("GET", `${base}/history/events?after=${q.after || 0}&limit=${q.limit || 1000}${q.kinds ? `&kinds=${q.kinds.join(",")}` : ""}`),
    /**
     * The charts' figures at up to `points` evenly spaced seqs of from..to (series.js SeriesBody).
     * @param {number} from @param {number} to @param {number} points
     */
    historySeries: (from, to, points) =>
      api("GET", `${base}/history/series?from_seq=${from}&to_seq=${to}&points=${points}`),
    /** @param {number} seq the map right after event `seq` */
    blockmapAt: (seq) => api("GET", `${base}/blockmap?format=json&at_seq=${seq}`),
    /** @param {number} seq */
    statsAt: (seq) => api("GET", `${base}/stats?at_seq=${seq}`),
    /** @param {string} [name] */
    startRecording: (name) => api("POST", `${base}/recording`, name ? { name } : {}),
    stopRecording: () => api("DELETE", `${base}/recording`),
  };
}

/** Recording files on the server (app/routes/recordings.py). */
export const recordings = {
  list: () => api("GET", "/api/recordings"),
  /** @param {string} name @returns {Promise<{name: string}>} the pool it is served as */
  open: (name) => api("POST", `/api/recordings/${encodeURIComponent(name)}/open`, {}),
  /**
   * Upload a recording file: kept on the server under a name it chooses and opened read-only.
   * @param {Blob} file @returns {Promise<{name: string, recording: string}>} the pool it is served as
   */
  upload: (file) => api("POST", "/api/recordings/upload", file),
};

/** Fleets (app/routes/fleets.py): many engines in one prefix index. */
export const fleets = {
  list: () => api("GET", "/api/fleets"),
  /**
   * A page of its engines and servers, the summary, its figures (`engines_*`, `groups_*`: docs/FLEET.md).
   * @param {string} name @param {number} [samples] @param {URLSearchParams} [params]
   */
  get: (name, samples = 300, params = new URLSearchParams()) => {
    const p = new URLSearchParams(params);
    p.set("samples", String(samples));
    return api("GET", `/api/fleets/${encodeURIComponent(name)}?${p}`);
  },
  /** Every engine's map, or those `params` select (`engines`, `engines_*`). @param {string} name @param {URLSearchParams} [params] */
  blocks: (name, params) => api("GET", `/api/fleets/${encodeURIComponent(name)}/blocks${params && [...params].length ? `?${params}` : ""}`),
  /** @param {string} name @param {{tokens: number[]}|{block_hashes: number[], engine: string}|{key: string}} body */
  match: (name, body) => api("POST", `/api/fleets/${encodeURIComponent(name)}/match`, body),
};
