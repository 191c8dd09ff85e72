// Buttons and forms: every action is one call of the typed REST client (api.js); results and
// errors show in the status line. The stream, not these responses, updates the map and numbers.
// One module per tab (tab-alloc.js, tab-cache.js, tab-workload.js, tab-pool.js); this one holds
// what they share: the status line, `act`, the token prompt and the tab switcher.

import { ApiError, getToken, pool as poolApi, setAuthHandler, setToken } from "./api.js";
import { formatBytes, parseSize } from "./model.js";
import { createAllocTab } from "./tab-alloc.js";
import { createCacheTab } from "./tab-cache.js";
import { createPoolTab } from "./tab-pool.js";
import { createWorkloadTab } from "./tab-workload.js";

/**
 * What every tab gets: a selector, `act` (run and report), the selected pool's client, a size parser.
 * @typedef {{
 *   $: (sel: string) => any,
 *   act: (label: string, fn: () => Promise<string|void>) => Promise<void>,
 *   client: () => ReturnType<typeof poolApi>,
 *   sizeOf: (text: string) => import("./api.js").Size,
 *   env: Object,
 * }} ControlContext
 */

/**
 * Ask for the token in a modal dialog; resolves true when one was entered.
 * @returns {Promise<boolean>}
 */
export function promptToken() {
  const dialog = /** @type {HTMLDialogElement} */ (document.getElementById("token-dialog"));
  const input = /** @type {HTMLInputElement} */ (dialog.querySelector("input[name=token]"));
  input.value = getToken() || "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        const ok = dialog.returnValue === "ok" && input.value.trim() !== "";
        if (ok) setToken(input.value.trim());
        resolve(ok);
      },
      { once: true },
    );
    if (!dialog.open) dialog.showModal();
  });
}

/**
 * @param {{
 *   getPool: () => string,
 *   getModel: () => import("./model.js").PoolModel,
 *   onPoolCreated: (name: string) => void,
 *   onPoolDeleted: (name: string) => void,
 *   onTokenChanged: () => void,
 * }} env
 */
export function createControls(env) {
  const $ = (sel) => /** @type {any} */ (document.querySelector(sel));
  const statusEl = $("#control-status");
  let authPrompt = null;
  setAuthHandler(async () => {
    // one prompt at a time, however many calls were refused together
    if (!authPrompt) authPrompt = promptToken().finally(() => (authPrompt = null));
    const ok = await authPrompt;
    if (ok) env.onTokenChanged();
    return ok;
  });

  /** @param {string} msg @param {"ok"|"err"|"info"} [kind] */
  function status(msg, kind = "info") {
    statusEl.textContent = msg;
    statusEl.dataset.kind = kind;
  }

  /** Run an action, reporting its outcome; errors become a readable status line. */
  async function act(label, fn) {
    try {
      const msg = await fn();
      status(msg || `${label}: done`, "ok");
    } catch (err) {
      if (err instanceof ApiError) {
        const d = err.details || {};
        const extra = err.status === 507 ? ` (free ${formatBytes(d.free_bytes)}, largest ${formatBytes(d.largest_free_bytes)}, cause ${d.cause})` : "";
        status(`${label}: ${err.status} ${err.code}: ${err.message}${extra}`, "err");
      } else status(`${label}: ${/** @type {Error} */ (err).message}`, "err");
    }
  }

  const client = () => {
    const name = env.getPool();
    if (!name) throw new Error("there is no pool: create one on the Pool tab");
    return poolApi(name);
  };
  const sizeOf = (text) => {
    const s = parseSize(text);
    if (!s) throw new Error(`not a size: "${text}" (try 4096, 64 KiB, 2 MiB or 100 tok)`);
    return s;
  };

  /** @type {ControlContext} */
  const ctx = { $, act, client, sizeOf, env };
  const alloc = createAllocTab(ctx);
  createCacheTab(ctx);
  const workload = createWorkloadTab(ctx);
  const poolTab = createPoolTab(ctx, alloc);

  // tabs
  document.querySelectorAll(".controls-panel [data-tab]").forEach((b) =>
    b.addEventListener("click", () => {
      const tab = /** @type {HTMLElement} */ (b).dataset.tab;
      document.querySelectorAll(".controls-panel [data-tab]").forEach((x) => x.classList.toggle("on", x === b));
      document.querySelectorAll(".controls-panel [data-tab-body]").forEach((x) => {
        /** @type {HTMLElement} */ (x).hidden = /** @type {HTMLElement} */ (x).dataset.tabBody !== tab;
      });
    }),
  );

  const clearChips = () => {
    alloc.clearChips();
    poolTab.forgetRecording();
  };
  return { status, showProgress: workload.showProgress, clearChips };
}
