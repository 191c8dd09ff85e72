// Controls, Pool tab: defragment, reset, check, create a pool, delete this one.

import { pool as poolApi, pools } from "./api.js";
import { formatBytes } from "./model.js";

/**
 * @param {import("./controls.js").ControlContext} ctx
 * @param {{clearChips: () => void}} alloc
 */
export function createPoolTab(ctx, alloc) {
  const { $, act, client, sizeOf, env } = ctx;
  $("#b-defrag").addEventListener("click", () =>
    act("defragment", async () => {
      const r = await client().defragment();
      return `defragmented: moved ${r.moved_blocks} blocks (${formatBytes(r.moved_bytes)}) in ${(1000 * r.seconds).toFixed(1)} ms`;
    }),
  );
  $("#b-reset").addEventListener("click", () =>
    act("reset", async () => {
      await client().reset();
      alloc.clearChips();
      return "pool reset";
    }),
  );
  $("#b-check").addEventListener("click", () =>
    act("check", async () => {
      const r = await client().check();
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
      await pools.create(body);
      env.onPoolCreated(body.name);
      return `created pool ${body.name}`;
    });
  });
  $("#b-delete-pool").addEventListener("click", () => {
    const name = env.getPool();
    if (!window.confirm(`Delete pool "${name}" and release its memory?`)) return;
    act("delete pool", async () => {
      await poolApi(name).delete();
      env.onPoolDeleted(name);
      return `deleted pool ${name}`;
    });
  });
  return {};
}
