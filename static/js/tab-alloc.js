// Controls, Allocate tab: allocate, extend, free, a random free, a batch of mixed sizes.

import { formatBytes } from "./model.js";

/** Chips of allocations made from this page; older ones drop off. */
const MAX_CHIPS = 24;

/** @param {import("./controls.js").ControlContext} ctx */
export function createAllocTab(ctx) {
  const { $, act, client, sizeOf, env } = ctx;
  const chips = $("#my-allocs");
  // An empty id would make a request for another route.
  const idField = () => $("#f-extend [name=id]");
  /** @param {string} verb */
  const allocationId = (verb) => {
    const id = idField().value.trim();
    if (!id) throw new Error(`type the id of the allocation to ${verb}, or click one of the chips below`);
    if (!/^\d+$/.test(id)) throw new Error(`not an allocation id: "${id}" (a number, as on the chips)`);
    return id;
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

  $("#f-allocate").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act("allocate", async () => {
      const a = await client().allocate(sizeOf(ev.target.size.value));
      addChip(a);
      idField().value = String(a.id);
      return `allocated #${a.id}: ${formatBytes(a.requested_bytes)} in ${formatBytes(a.allocated_bytes)}`;
    });
  });
  $("#f-extend").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act("extend", async () => {
      const id = allocationId("extend");
      const a = await client().extend(id, sizeOf(ev.target.size.value));
      return `extended #${a.id} to ${formatBytes(a.allocated_bytes)}`;
    });
  });
  $("#b-free").addEventListener("click", () => {
    act("free", async () => {
      const id = allocationId("free");
      await client().free(id);
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
      await client().free(id);
      return `freed #${id}`;
    }),
  );
  $("#b-alloc-burst").addEventListener("click", () =>
    act("batch", async () => {
      const bb = (env.getModel().config || {}).block_bytes || 4096;
      const ops = Array.from({ length: 20 }, () => ({ op: "allocate", bytes: Math.max(1, Math.floor(bb * (0.3 + Math.random() * 12))) }));
      const res = await client().batch(ops);
      const ok = res.results.filter((r) => r.ok).length;
      return `batch of 20 allocations: ${ok} succeeded`;
    }),
  );

  /** Forget the allocations made here, and the selected id: they belong to one pool. */
  function clearChips() {
    chips.innerHTML = "";
    idField().value = "";
  }

  return { clearChips };
}
