// The stream connection of one pool: reconnects by itself with exponential backoff and jitter,
// reports its state, and hands decoded messages to the caller. Protocol: docs/STREAM.md.

import { decodeFrame } from "./frames.js";

/** First retry delay; doubles per failure up to BACKOFF_MAX_MS (a restarting server needs ~1-3 s). */
export const BACKOFF_START_MS = 250;
export const BACKOFF_MAX_MS = 5000;
/** Close codes the server uses before `hello` (docs/STREAM.md). */
export const CLOSE_TOKEN_MISSING = 4401;
export const CLOSE_TOKEN_WRONG = 4403;
export const CLOSE_UNKNOWN_POOL = 4404;

/** @typedef {"connecting"|"open"|"reconnecting"|"auth"|"missing"|"closed"} SocketState */

/**
 * @typedef {Object} SocketHandlers
 * @property {(msg: Object) => void} onJson     every JSON message (hello, resync, events, stats, order, progress, closed);
 *   a `resync` follows a snapshot that replaced a dropped backlog: the caller refills its event log
 * @property {(frame: import("./frames.js").Frame) => void} onFrame
 * @property {(state: SocketState, detail?: string) => void} [onState]
 * @property {(err: Error) => void} [onError]  a frame that failed to decode
 */

/**
 * Backoff delay for the n-th consecutive failure (0-based), with +-20% jitter so that many
 * tabs do not reconnect in lockstep after a server restart.
 * @param {number} attempt @param {() => number} [random]
 */
export function backoffDelay(attempt, random = Math.random) {
  const base = Math.min(BACKOFF_MAX_MS, BACKOFF_START_MS * 2 ** attempt);
  return Math.round(base * (0.8 + 0.4 * random()));
}

/**
 * @param {string} pool
 * @param {SocketHandlers} handlers
 * @param {{token?: () => string|null, location?: Location}} [opts]
 */
export function createPoolSocket(pool, handlers, opts = {}) {
  const loc = opts.location || window.location;
  /** @type {WebSocket|null} */
  let ws = null;
  let attempt = 0;
  let timer = 0;
  let stopped = false;
  /** @type {SocketState} */
  let state = "connecting";

  function setState(next, detail) {
    state = next;
    if (handlers.onState) handlers.onState(next, detail);
  }

  function url() {
    const proto = loc.protocol === "https:" ? "wss:" : "ws:";
    const token = opts.token ? opts.token() : null;
    const q = token ? `?token=${encodeURIComponent(token)}` : "";
    return `${proto}//${loc.host}/ws/pools/${encodeURIComponent(pool)}${q}`;
  }

  function connect() {
    if (stopped) return;
    setState(attempt === 0 ? "connecting" : "reconnecting");
    const sock = new WebSocket(url());
    sock.binaryType = "arraybuffer";
    ws = sock;
    sock.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        const msg = JSON.parse(ev.data);
        if (msg.type === "hello") {
          attempt = 0;
          setState("open");
        }
        handlers.onJson(msg);
        return;
      }
      try {
        handlers.onFrame(decodeFrame(ev.data));
      } catch (err) {
        if (handlers.onError) handlers.onError(/** @type {Error} */ (err));
      }
    };
    sock.onclose = (ev) => {
      if (ws !== sock) return;
      ws = null;
      if (stopped) return;
      if (ev.code === CLOSE_TOKEN_MISSING || ev.code === CLOSE_TOKEN_WRONG) {
        setState("auth", ev.code === CLOSE_TOKEN_WRONG ? "wrong token" : "token required");
        return; // wait for reconnect() after the user gives a token
      }
      if (ev.code === CLOSE_UNKNOWN_POOL) setState("missing", `no pool named ${pool}`);
      else setState("reconnecting");
      timer = window.setTimeout(connect, backoffDelay(attempt++));
    };
  }

  connect();

  return {
    get state() {
      return state;
    },
    /** Reconnect now (e.g. after a token was entered), resetting the backoff. */
    reconnect() {
      window.clearTimeout(timer);
      attempt = 0;
      const old = ws;
      ws = null;
      if (old) old.close();
      connect();
    },
    close() {
      stopped = true;
      window.clearTimeout(timer);
      if (ws) ws.close();
      ws = null;
      setState("closed");
    },
  };
}
