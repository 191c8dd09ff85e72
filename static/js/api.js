// REST client (DESIGN.md section 3). Adds the bearer token kept in this tab's sessionStorage and
// turns `{"error": {code, message, details}}` bodies into ApiError.

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
 * @param {Object} [body]
 * @returns {Promise<any>} parsed JSON, or null for 204
 * @throws {ApiError}
 */
export async function api(method, path, body, retried = false) {
  /** @type {Record<string,string>} */
  const headers = {};
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  // The server refuses a POST without it, body or not (a cross-site form could send one).
  if (body !== undefined || method === "POST") headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
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
 * @param {string} pool @param {import("./model.js").EventGap} gap
 * @returns {Promise<import("./model.js").EventPage>}
 */
export function fetchEvents(pool, gap) {
  return api("GET", `${poolPath(pool)}/events?after=${gap.after}&limit=${gap.limit}`);
}
