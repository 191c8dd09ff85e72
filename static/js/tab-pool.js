// Controls, Pool tab: defragment, reset, check, create a pool, delete this one; record, list,
// open and upload recordings.

import { pool as poolApi, pools, recordings } from "./api.js";
import { escapeHtml } from "./dom.js";
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
      if (f.prefix && f.prefix.value) {
        body.prefix_caching = { policy: f.prefix.value };
        body.tokens_per_block = Number(f.tokens_per_block.value) || 16;
      }
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
  let recording = false;
  const recordBtn = $("#b-record");
  recordBtn.addEventListener("click", () =>
    act(recording ? "stop recording" : "record", async () => {
      if (recording) {
        const r = await client().stopRecording();
        recording = false;
        recordBtn.textContent = "Record";
        return `recorded ${r.events} events to ${r.name}`;
      }
      const r = await client().startRecording();
      recording = true;
      recordBtn.textContent = "Stop recording";
      return `recording to ${r.name}`;
    }),
  );
  const list = $("#recording-list");
  async function showRecordings() {
    const data = await recordings.list();
    list.hidden = false;
    list.innerHTML = data.recordings.length
      ? data.recordings
          .map((r) => `<li data-name="${escapeHtml(r.name)}"><span>${escapeHtml(r.name)} · ${
            r.error ? `not openable: ${escapeHtml(r.error)}` : `${escapeHtml(r.pool || "?")} · events ${r.start_seq}..${r.last_seq}`
          }${r.recording ? " · recording" : ""}</span> <button type="button" class="ghost" data-open="${escapeHtml(r.name)}">Open</button></li>`)
          .join("")
      : "<li>no recordings yet</li>";
    return `${data.recordings.length} recording(s) in ${data.directory}`;
  }
  $("#b-recordings").addEventListener("click", () => act("list recordings", showRecordings));
  list.addEventListener("click", (ev) => {
    const name = /** @type {HTMLElement} */ (ev.target).dataset?.open;
    if (!name) return;
    act("open recording", async () => {
      const r = await recordings.open(name);
      env.onPoolCreated(r.name);
      return `opened ${name} as pool ${r.name} (read-only)`;
    });
  });
  const fileInput = /** @type {HTMLInputElement} */ ($("#recording-file"));
  $("#b-upload").addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", () => {
    const file = fileInput.files && fileInput.files[0];
    if (!file) return;
    act("upload recording", async () => {
      try {
        const r = await recordings.upload(file);
        env.onPoolCreated(r.name);
        return `uploaded ${file.name} (${formatBytes(file.size)}) as ${r.recording}: opened as pool ${r.name} (read-only)`;
      } finally {
        fileInput.value = ""; // the same file again is a new upload
      }
    });
  });
  return {
    /** The shown pool changed: its recording state is unknown until asked. */
    forgetRecording() {
      recording = false;
      recordBtn.textContent = "Record";
    },
  };
}
