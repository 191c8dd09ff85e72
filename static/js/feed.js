// One pool's stream fed into a PoolModel: every message and frame applied, and the holes in the
// event log (after a reconnect or a `resync`) fetched and slotted in. The dashboard and each
// compare pane use it, adding only what they draw.

import { fetchEvents, getToken } from "./api.js";
import { createPoolSocket } from "./socket.js";

/**
 * @typedef {Object} FeedHooks
 * @property {(msg: {type: string} & Record<string, any>) => void} [onMessage]  after the model applied a JSON message
 * @property {() => void} [onFrame]     after the model applied a binary frame
 * @property {() => void} [onBackfill]  after fetched events were slotted into the log
 * @property {(state: import("./socket.js").SocketState, detail?: string) => void} [onState]
 * @property {(err: Error) => void} [onError]  a frame that failed to decode
 */

/**
 * @param {string} pool
 * @param {import("./model.js").PoolModel} model
 * @param {FeedHooks} hooks
 */
export function feedPool(pool, model, hooks) {
  let closed = false;

  /** A failed fetch leaves a "skipped" row where the events would be. @param {import("./model.js").EventGap|null} gap */
  async function backfill(gap) {
    if (!gap) return;
    let page = { events: [], last_seq: gap.upto };
    try {
      page = await fetchEvents(pool, gap);
    } catch {
      // the hole is then reported as skipped events: nothing else to do
    }
    if (closed) return; // the page moved on to another pool meanwhile
    model.applyBackfill(gap, page);
    if (hooks.onBackfill) hooks.onBackfill();
  }

  const socket = createPoolSocket(
    pool,
    {
      onJson: (msg) => {
        backfill(model.applyMessage(msg));
        if (hooks.onMessage) hooks.onMessage(msg);
      },
      onFrame: (frame) => {
        model.applyFrame(frame);
        if (hooks.onFrame) hooks.onFrame();
      },
      onState: hooks.onState,
      onError: hooks.onError,
    },
    { token: getToken },
  );

  return {
    get state() {
      return socket.state;
    },
    reconnect: () => socket.reconnect(),
    close() {
      closed = true;
      socket.close();
    },
  };
}
