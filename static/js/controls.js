// Buttons and forms: every action is one REST call (DESIGN.md section 3); results and errors
// show in the status line. The stream, not these responses, updates the map and numbers.

import { ApiError, api, getToken, poolPath, setAuthHandler, setToken } from "./api.js";
import { describeWorkload, formatBytes, parseSize } from "./model.js";

/** Chips of allocations made from this page; older ones drop off. */
const MAX_CHIPS = 24;

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
  const chips = $("#my-allocs");
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

  const pool = () => {
    const name = env.getPool();
    if (!name) throw new Error("there is no pool: create one on the Pool tab");
    return poolPath(name);
  };
  const sizeOf = (text) => {
    const s = parseSize(text);
    if (!s) throw new Error(`not a size: "${text}" (try 4096, 64 KiB, 2 MiB or 100 tok)`);
    return s;
  };
  // An empty key or id would make a request for another route (`/entries/` is the list).
  const idField = () => $("#f-extend [name=id]");
  /** @param {string} verb */
  const allocationId = (verb) => {
    const id = idField().value.trim();
    if (!id) throw new Error(`type the id of the allocation to ${verb}, or click one of the chips below`);
    if (!/^\d+$/.test(id)) throw new Error(`not an allocation id: "${id}" (a number, as on the chips)`);
    return id;
  };
  /** @param {string} verb */
  const entryKey = (verb) => {
    const key = $("#f-put [name=key]").value.trim();
    if (!key) throw new Error(`type the key of the entry to ${verb}`);
    return key;
  };

  function addChip(alloc) {
    const li = document.createElement("li");
    li.textContent = `#${alloc.id} · ${formatBytes(alloc.allocated_bytes)}`;
    li.dataset.id = String(alloc.id);
    li.title = "click to select for extend/free";
    li.addEventListener("click", () => {
      idField().value = String(alloc.id);
    });
    chips.prepend(li);
    while (chips.children.length > MAX_CHIPS) chips.lastChild.remove();
  }

  // -- allocations -------------------------------------------------------------------------
  $("#f-allocate").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act("allocate", async () => {
      const a = await api("POST", `${pool()}/allocations`, sizeOf(ev.target.size.value));
      addChip(a);
      idField().value = String(a.id);
      return `allocated #${a.id}: ${formatBytes(a.requested_bytes)} in ${formatBytes(a.allocated_bytes)}`;
    });
  });
  $("#f-extend").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act("extend", async () => {
      const id = allocationId("extend");
      const a = await api("POST", `${pool()}/allocations/${encodeURIComponent(id)}/extend`, sizeOf(ev.target.size.value));
      return `extended #${a.id} to ${formatBytes(a.allocated_bytes)}`;
    });
  });
  $("#b-free").addEventListener("click", () => {
    act("free", async () => {
      const id = allocationId("free");
      await api("DELETE", `${pool()}/allocations/${encodeURIComponent(id)}`);
      chips.querySelector(`[data-id="${CSS.escape(id)}"]`)?.remove();
      return `freed #${id}`;
    });
  });
  $("#b-free-random").addEventListener("click", () =>
    act("free", async () => {
      const m = env.getModel();
      const owners = [];
      const used = m.codes.used;
      for (let i = 0; i < m.blocks && owners.length < 4096; i++) if (m.state[i] === used) owners.push(m.owner[i]);
      if (!owners.length) return "nothing to free (cache entries are removed from the Cache tab)";
      const id = owners[Math.floor(Math.random() * owners.length)];
      await api("DELETE", `${pool()}/allocations/${id}`);
      return `freed #${id}`;
    }),
  );
  $("#b-alloc-burst").addEventListener("click", () =>
    act("batch", async () => {
      const bb = (env.getModel().config || {}).block_bytes || 4096;
      const ops = Array.from({ length: 20 }, () => ({ op: "allocate", bytes: Math.max(1, Math.floor(bb * (0.3 + Math.random() * 12))) }));
      const res = await api("POST", `${pool()}/ops`, { ops });
      const ok = res.results.filter((r) => r.ok).length;
      return `batch of 20 allocations: ${ok} succeeded`;
    }),
  );

  // -- cache entries -------------------------------------------------------------------------
  $("#f-put").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const key = f.key.value.trim() || `k${Math.floor(Math.random() * 1e6)}`;
    act("put", async () => {
      const r = await api("PUT", `${pool()}/entries/${encodeURIComponent(key)}`, { ...sizeOf(f.size.value), pinned: f.pinned.checked });
      const ev2 = (r && r.evicted) || [];
      return `put ${key}${ev2.length ? `, evicted ${ev2.length}: ${ev2.slice(0, 5).join(", ")}${ev2.length > 5 ? "…" : ""}` : ""}`;
    });
  });
  $("#b-get").addEventListener("click", () => {
    act("get", async () => {
      const key = entryKey("get");
      try {
        const e = await api("GET", `${pool()}/entries/${encodeURIComponent(key)}`);
        return `hit ${key} (${formatBytes(e.bytes)})`;
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) return `miss ${key}`;
        throw err;
      }
    });
  });
  $("#b-del").addEventListener("click", () => {
    act("delete", async () => {
      const key = entryKey("delete");
      await api("DELETE", `${pool()}/entries/${encodeURIComponent(key)}`);
      return `deleted ${key}`;
    });
  });
  $("#b-evict").addEventListener("click", () => {
    act("evict", async () => {
      const key = entryKey("evict");
      try {
        await api("POST", `${pool()}/entries/${encodeURIComponent(key)}/evict`);
      } catch (err) {
        if (err instanceof ApiError && err.status === 409) throw new Error(`${key} is pinned: pinned entries are never evicted (Delete removes it)`);
        if (err instanceof ApiError && err.status === 404) throw new Error(`no entry ${key}`);
        throw err;
      }
      return `evicted ${key}`;
    });
  });
  $("#b-fill").addEventListener("click", () =>
    act("put ×50", async () => {
      const bb = (env.getModel().config || {}).block_bytes || 4096;
      let evicted = 0;
      const base = Math.floor(Math.random() * 1e6);
      for (let i = 0; i < 50; i++) {
        const bytes = Math.max(1, Math.floor(bb * (0.5 + Math.random() * 6)));
        const r = await api("PUT", `${pool()}/entries/r${base + i}`, { bytes });
        evicted += ((r && r.evicted) || []).length;
      }
      return `put 50 entries, ${evicted} evictions`;
    }),
  );
  $("#b-policy").addEventListener("click", () =>
    act("policy", async () => {
      const policy = $("#policy-select").value;
      await api("PUT", `${pool()}/cache/policy`, { policy });
      return `policy is now ${policy}`;
    }),
  );

  // -- workload ---------------------------------------------------------------------------
  const wf = $("#f-workload");
  const syncWorkloadForm = () => {
    const kind = wf.kind.value;
    wf.querySelectorAll("[data-for]").forEach((el) => (el.hidden = el.dataset.for !== kind));
    wf.speedOut.value = `${wf.speed.value}×`;
  };
  wf.addEventListener("input", syncWorkloadForm);
  syncWorkloadForm();
  wf.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const kind = wf.kind.value;
    const body =
      kind === "scenario"
        ? { kind, name: wf.name.value, speed: Number(wf.speed.value), seed: Number(wf.seed.value) }
        : { kind, speed: Number(wf.speed.value), limit: Number(wf.limit.value) };
    act("workload", async () => {
      await api("POST", `${pool()}/workload`, body);
      return `started ${kind === "trace" ? `trace replay of ${body.limit} requests` : body.name} at ${body.speed}×`;
    });
  });
  $("#b-stop").addEventListener("click", () =>
    act("stop", async () => {
      await api("DELETE", `${pool()}/workload`);
      return "workload stopped";
    }),
  );

  // -- pool -------------------------------------------------------------------------------
  $("#b-defrag").addEventListener("click", () =>
    act("defragment", async () => {
      const r = await api("POST", `${pool()}/defragment`);
      return `defragmented: moved ${r.moved_blocks} blocks (${formatBytes(r.moved_bytes)}) in ${(1000 * r.seconds).toFixed(1)} ms`;
    }),
  );
  $("#b-reset").addEventListener("click", () =>
    act("reset", async () => {
      await api("POST", `${pool()}/reset`);
      clearChips();
      return "pool reset";
    }),
  );
  $("#b-check").addEventListener("click", () =>
    act("check", async () => {
      const r = await api("GET", `${pool()}/check`);
      return r.ok ? "invariants hold" : `problems: ${(r.problems || []).slice(0, 3).join("; ")}`;
    }),
  );
  $("#f-create").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = ev.target;
    act("create pool", async () => {
      const body = {
        name: f.name.value.trim(),
        strategy: f.strategy.value,
        num_blocks: Number(f.num_blocks.value),
        block_bytes: /** @type {any} */ (sizeOf(f.block_bytes.value)).bytes,
      };
      // options only some strategies take (allocator/vocab.py `options`), named on each <option>
      const takes = (f.strategy.selectedOptions[0]?.dataset.options || "").split(" ");
      if (takes.includes("fit")) body.fit = f.fit.value;
      if (f.cache.value.trim()) body.cache = { capacity_bytes: /** @type {any} */ (sizeOf(f.cache.value)).bytes };
      await api("POST", "/api/pools", body);
      env.onPoolCreated(body.name);
      return `created pool ${body.name}`;
    });
  });
  $("#b-delete-pool").addEventListener("click", () => {
    const name = env.getPool();
    if (!window.confirm(`Delete pool "${name}" and release its memory?`)) return;
    act("delete pool", async () => {
      await api("DELETE", poolPath(name));
      env.onPoolDeleted(name);
      return `deleted pool ${name}`;
    });
  });

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

  /** @param {import("./model.js").WorkloadProgress|null} w */
  function showProgress(w) {
    const box = $("#progress");
    const d = describeWorkload(w);
    if (!d) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    box.querySelector("i").style.width = `${(100 * d.frac).toFixed(1)}%`;
    const text = box.querySelector("span");
    text.textContent = d.text;
    text.title = d.error;
    box.dataset.state = d.state;
  }

  /** Forget the allocations made here, and the selected id: they belong to one pool. */
  function clearChips() {
    chips.innerHTML = "";
    idField().value = "";
  }

  return { status, showProgress, clearChips };
}
