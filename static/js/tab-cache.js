// Controls, Cache tab: put, get, delete, evict, fill with random entries, switch the policy.

import { ApiError } from "./api.js";
import { formatBytes } from "./model.js";

/** @param {import("./controls.js").ControlContext} ctx */
export function createCacheTab(ctx) {
  const { $, act, client, sizeOf, env } = ctx;
  /** @param {string} verb */
  const entryKey = (verb) => {
    const key = $("#f-put [name=key]").value.trim();
    if (!key) throw new Error(`type the key of the entry to ${verb}`); // an empty key is the list route
    return key;
  };

  $("#f-put").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const key = f.key.value.trim() || `k${Math.floor(Math.random() * 1e6)}`;
    act("put", async () => {
      const r = await client().put(key, { ...sizeOf(f.size.value), pinned: f.pinned.checked });
      const ev2 = (r && r.evicted) || [];
      return `put ${key}${ev2.length ? `, evicted ${ev2.length}: ${ev2.slice(0, 5).join(", ")}${ev2.length > 5 ? "…" : ""}` : ""}`;
    });
  });
  $("#b-get").addEventListener("click", () => {
    act("get", async () => {
      const key = entryKey("get");
      try {
        const e = await client().lookup(key);
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
      await client().remove(key);
      return `deleted ${key}`;
    });
  });
  $("#b-evict").addEventListener("click", () => {
    act("evict", async () => {
      const key = entryKey("evict");
      try {
        await client().evict(key);
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
      const c = client();
      for (let i = 0; i < 50; i++) {
        const bytes = Math.max(1, Math.floor(bb * (0.5 + Math.random() * 6)));
        const r = await c.put(`r${base + i}`, { bytes });
        evicted += ((r && r.evicted) || []).length;
      }
      return `put 50 entries, ${evicted} evictions`;
    }),
  );
  $("#b-policy").addEventListener("click", () =>
    act("policy", async () => {
      const policy = $("#policy-select").value;
      await client().setPolicy(policy);
      return `policy is now ${policy}`;
    }),
  );
  return {};
}
