// The block map as a canvas: one cell per block. The ONLY module that writes canvas pixels.
// It keeps one ImageData the size of the canvas and repaints only the rows a frame touched,
// at most once per animation frame, with putImageData on that band of rows.

import { escapeHtml, paintSwatches } from "./dom.js";
import { formatBytes } from "./model.js";

/**
 * Canvas backing store cap. 8 M pixels = 32 MB of ImageData, well inside what Chromium keeps
 * on the GPU path; a 1,000,000-block pool at one pixel per block is 1 M.
 * Past it, cells get fewer backing pixels and CSS scales them up (pixelated).
 */
export const MAX_CANVAS_PIXELS = 8_000_000;
/** Chromium refuses canvases taller or wider than 32,767 px; stay below with margin. */
export const MAX_CANVAS_SIDE = 32_000;
/** Cells need this many backing pixels before a 1 px grid gap and the pinned dot fit inside. */
export const MIN_DETAILED_CELL_PX = 4;
/** "Auto" cell size keeps the whole map within this CSS height, so it is seen at a glance. */
export const AUTO_MAX_HEIGHT_PX = 460;
export const CELL_SIZES = [1, 2, 3, 4, 6, 8, 12, 16];
/** Hovering must not flood the server with allocation look-ups. */
export const HOVER_FETCH_DEBOUNCE_MS = 120;
export const HOVER_CACHE_MS = 2000;
const HUES = 256;
/** Paint timings kept for `paintStats()`. */
const PAINT_SAMPLES = 512;

/** @param {number} r @param {number} g @param {number} b  little-endian RGBA as one u32 */
const rgba = (r, g, b) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;

/** @param {number} h degrees @param {number} s 0-1 @param {number} l 0-1 */
function hsl(h, s, l) {
  const k = (n) => (n + h / 30) % 12;
  const a = s * Math.min(l, 1 - l);
  const f = (n) => l - a * Math.max(-1, Math.min(k(n) - 3, Math.min(9 - k(n), 1)));
  return rgba(Math.round(255 * f(0)), Math.round(255 * f(8)), Math.round(255 * f(4)));
}

export const COLORS = Object.freeze({
  background: rgba(11, 14, 19),
  free: rgba(28, 34, 45),
  pinned: rgba(250, 250, 250),
  uncachedHeat: rgba(70, 78, 94),
});

const usedPalette = new Uint32Array(HUES);
const cachedPalette = new Uint32Array(HUES);
const heatPalette = new Uint32Array(HUES);
for (let i = 0; i < HUES; i++) {
  const hue = (i * 360) / HUES;
  usedPalette[i] = hsl(hue, 0.68, 0.56);
  cachedPalette[i] = hsl(hue, 0.4, 0.38);
  // 0 = last to go (cool blue) ... 255 = next victim (hot yellow-red)
  const t = i / (HUES - 1);
  heatPalette[i] = hsl(230 - 230 * t, 0.85, 0.3 + 0.32 * t);
}

/** Owner id -> palette index; a multiplicative hash so that neighbouring ids get distant hues. */
export const ownerHue = (owner) => Math.imul(owner + 1, 0x9e3779b1) >>> 24;

/** CSS colour for an owner (legend, tooltip swatch). */
export function ownerCss(owner) {
  const c = usedPalette[ownerHue(owner)];
  return `rgb(${c & 255},${(c >> 8) & 255},${(c >> 16) & 255})`;
}

/** Sharing mode: reference counts at or past this take the hottest colour. */
export const SHARE_SCALE_MAX = 8;
/** Tooltip state of an allocation freed after its cell was painted (the map catches up next frame). */
const FREED = Object.freeze({ freed: true });

/**
 * @param {HTMLElement} root   the element to fill (toolbar + canvas + legend + tooltip)
 * @param {import("./model.js").PoolModel} model
 * @param {{fetchAllocation?: (id:number) => Promise<any>, fetchBlock?: (block:number) => Promise<any>, compact?: boolean}} [opts]
 */
export function createHeatmap(root, model, opts = {}) {
  root.classList.add("heatmap");
  root.innerHTML = `
    <div class="hm-toolbar">
      <div class="seg" role="group" aria-label="Colour mode">
        <button type="button" data-mode="owner" class="on" title="Colour by owning allocation">Owner</button>
        <button type="button" data-mode="heat" title="Eviction order: hot = next to be evicted">Heat</button>
        <button type="button" data-mode="share" title="Prefix caching: reference count (how many sequences hold each block)">Sharing</button>
      </div>
      <label class="hm-zoom">Cell <select data-role="cell">
        <option value="auto">auto</option>${CELL_SIZES.map((s) => `<option value="${s}">${s}px</option>`).join("")}
      </select></label>
      <span class="hm-info" data-role="info"></span>
    </div>
    <div class="hm-scroll"><canvas class="hm-canvas"></canvas></div>
    <div class="hm-legend" data-role="legend"></div>
    <div class="hm-tip" hidden></div>`;
  const canvas = /** @type {HTMLCanvasElement} */ (root.querySelector("canvas"));
  const scroller = /** @type {HTMLElement} */ (root.querySelector(".hm-scroll"));
  const tip = /** @type {HTMLElement} */ (root.querySelector(".hm-tip"));
  const legend = /** @type {HTMLElement} */ (root.querySelector("[data-role=legend]"));
  const info = /** @type {HTMLElement} */ (root.querySelector("[data-role=info]"));
  const cellSelect = /** @type {HTMLSelectElement} */ (root.querySelector("[data-role=cell]"));
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d", { alpha: false }));

  let mode = "owner";
  /** @type {"auto"|number} */
  let cellChoice = "auto";
  let cols = 1;
  let rows = 0;
  let px = 1; // backing pixels per cell side
  let cellCss = 1;
  /** @type {ImageData|null} */
  let image = null;
  /** @type {Uint32Array} */
  let pixels = new Uint32Array(0);
  let frameRequested = false;
  let layoutStale = true;
  let heatVersion = -1;
  let destroyed = false;

  function layout() {
    const width = Math.max(50, scroller.clientWidth - 2);
    const n = Math.max(1, model.blocks);
    if (cellChoice === "auto") {
      cellCss = 1;
      for (const s of CELL_SIZES) {
        const c = Math.max(1, Math.floor(width / s));
        const maxH = opts.compact ? AUTO_MAX_HEIGHT_PX * 0.6 : AUTO_MAX_HEIGHT_PX;
        if (Math.ceil(n / c) * s <= maxH) cellCss = s;
      }
    } else {
      cellCss = cellChoice;
    }
    cols = Math.max(1, Math.floor(width / cellCss));
    rows = Math.ceil(n / cols);
    const dpr = window.devicePixelRatio || 1;
    px = Math.max(1, Math.round(cellCss * dpr));
    while (px > 1 && (cols * rows * px * px > MAX_CANVAS_PIXELS || rows * px > MAX_CANVAS_SIDE)) px--;
    canvas.width = cols * px;
    canvas.height = Math.max(1, rows * px);
    canvas.style.width = `${cols * cellCss}px`;
    canvas.style.height = `${rows * cellCss}px`;
    image = ctx.createImageData(canvas.width, canvas.height);
    pixels = new Uint32Array(image.data.buffer);
    layoutStale = false;
    info.textContent = `${model.blocks.toLocaleString()} blocks · ${cols}×${rows} · ${cellCss}px`;
  }

  /** Colour of block i in the current mode. */
  let lastOwner = -2;
  let lastRankColor = 0;
  // State codes come from the hello (allocator/vocab.py); read into locals once per paint.
  let FREE = -1;
  let CACHED = -1;
  let PINNED = -1;
  let SHARED = -1;
  function readCodes() {
    const c = model.codes;
    FREE = c.free ?? -1;
    CACHED = c.cached ?? -1;
    PINNED = c.pinned ?? -1;
    SHARED = c.shared ?? -1;
  }
  function colorOf(i) {
    const st = model.state[i];
    if (st === FREE) return COLORS.free;
    const owner = model.owner[i];
    if (mode === "share") {
      // cached (idle) blocks dim, one holder cool, more holders hotter
      if (st === CACHED) return COLORS.uncachedHeat;
      const refs = model.refcountOf(i);
      const t = Math.min(1, (refs - 1) / (SHARE_SCALE_MAX - 1));
      return heatPalette[Math.round((HUES - 1) * t)];
    }
    if (mode === "heat" && /** @type {any} */ (model.config || {}).prefix_caching) {
      // prefix pools rank cached blocks themselves, not allocations
      if (st !== CACHED) return COLORS.uncachedHeat;
      const rank = model.blockRank.get(i);
      if (rank === undefined) return heatPalette[0];
      return heatPalette[Math.round((HUES - 1) * (1 - rank / Math.max(1, model.orderLength - 1)))];
    }
    if (mode === "heat") {
      if (st !== CACHED && st !== PINNED) return COLORS.uncachedHeat;
      if (owner !== lastOwner) {
        lastOwner = owner;
        const rank = model.orderRank.get(owner);
        // Not in the last `order` message: the entry arrived (or was touched) since, or sits
        // past the truncated list. Either way it is behind every ranked entry, so it takes the
        // "last to evict" end of the scale rather than a colour of its own.
        if (rank === undefined) lastRankColor = heatPalette[0];
        else {
          const n = Math.max(1, model.orderLength - 1);
          lastRankColor = heatPalette[Math.round((HUES - 1) * (1 - rank / n))];
        }
      }
      return st === PINNED ? COLORS.pinned : lastRankColor;
    }
    if (st === PINNED) return px < MIN_DETAILED_CELL_PX ? COLORS.pinned : usedPalette[ownerHue(owner)];
    if (st === SHARED) return heatPalette[HUES - 1];
    return st === CACHED ? cachedPalette[ownerHue(owner)] : usedPalette[ownerHue(owner)];
  }

  /** Repaint rows [r0, r1) into the ImageData and push that band to the canvas. */
  function paintRows(r0, r1) {
    if (!image || r1 <= r0) return;
    const width = cols * px;
    const n = model.blocks;
    const detailed = px >= MIN_DETAILED_CELL_PX;
    const inner = detailed ? px - 1 : px; // 1 px gap right/bottom draws the grid
    lastOwner = -2;
    readCodes();
    for (let r = r0; r < r1; r++) {
      const rowBase = r * px * width;
      for (let c = 0; c < cols; c++) {
        const i = r * cols + c;
        const color = i < n ? colorOf(i) : COLORS.background;
        if (px === 1) {
          pixels[rowBase + c] = color;
          continue;
        }
        const x0 = c * px;
        for (let y = 0; y < px; y++) {
          const base = rowBase + y * width + x0;
          if (y >= inner) {
            pixels.fill(COLORS.background, base, base + px);
            continue;
          }
          pixels.fill(color, base, base + inner);
          if (detailed) pixels[base + inner] = COLORS.background;
        }
        if (detailed && i < n && model.state[i] === PINNED) {
          // a white dot in the middle marks a pinned block, whatever its owner colour
          const d = Math.max(1, Math.floor(inner / 3));
          const o = Math.floor((inner - d) / 2);
          for (let y = o; y < o + d; y++) pixels.fill(COLORS.pinned, rowBase + y * width + x0 + o, rowBase + y * width + x0 + o + d);
        }
      }
    }
    ctx.putImageData(image, 0, 0, 0, r0 * px, width, (r1 - r0) * px);
  }

  /** Paint time of recent flushes (ms), for the benchmark; a fixed ring, no allocation per frame. */
  const paintMs = new Float64Array(PAINT_SAMPLES);
  let paintCount = 0;

  /** Apply whatever the model marked dirty. Called from requestAnimationFrame (or a test). */
  function flush() {
    const t0 = performance.now();
    paint();
    const dt = performance.now() - t0;
    if (dt > 0.05) paintMs[paintCount++ % PAINT_SAMPLES] = dt; // only frames that painted
  }

  function paint() {
    frameRequested = false;
    if (destroyed) return;
    if (layoutStale || rows !== Math.ceil(Math.max(1, model.blocks) / cols)) {
      layout();
      model.markAllDirty();
    }
    if (mode !== "owner" && heatVersion !== model.orderVersion) {
      heatVersion = model.orderVersion;
      model.markAllDirty();
    }
    const dirty = model.takeDirty();
    if (dirty === null) return;
    if (dirty === "all") {
      paintRows(0, rows);
      return;
    }
    // merge the block ranges into row bands, then paint each band once
    let bandStart = -1;
    let bandEnd = -1;
    for (const [s, e] of dirty) {
      const r0 = Math.floor(s / cols);
      const r1 = Math.floor((e - 1) / cols) + 1;
      if (bandStart >= 0 && r0 <= bandEnd) bandEnd = Math.max(bandEnd, r1);
      else {
        if (bandStart >= 0) paintRows(bandStart, bandEnd);
        bandStart = r0;
        bandEnd = r1;
      }
    }
    if (bandStart >= 0) paintRows(bandStart, bandEnd);
  }

  /** Ask for a repaint on the next animation frame (coalesces any number of calls). */
  function schedule() {
    if (frameRequested || destroyed) return;
    frameRequested = true;
    window.requestAnimationFrame(flush);
  }

  function renderLegend() {
    const sw = (css, label, cls = "") => `<span class="lg"><i class="sw ${cls}" data-color="${css}"></i>${label}</span>`;
    if (mode === "share") {
      legend.innerHTML =
        `<span class="lg"><i class="sw grad"></i>held by 1 → ${SHARE_SCALE_MAX}+ sequences</span>` +
        sw("rgb(70,78,94)", "cached, idle (evictable)") + sw("rgb(28,34,45)", "free");
    } else if (mode === "heat") {
      legend.innerHTML =
        `<span class="lg"><i class="sw grad"></i>next to evict → last</span>` +
        sw("rgb(70,78,94)", "not a cache entry") + sw("rgb(28,34,45)", "free") + sw("#fafafa", "pinned (never evicted)");
    } else {
      legend.innerHTML =
        sw("rgb(28,34,45)", "free") +
        `<span class="lg"><i class="sw hues"></i>used (hue = owner)</span>` +
        `<span class="lg"><i class="sw hues muted"></i>cached, evictable</span>` +
        `<span class="lg"><i class="sw pin"></i>pinned</span>`;
    }
    paintSwatches(legend);
  }

  // -- hover tooltip ---------------------------------------------------------------------
  /** @type {Map<number, {t:number, data:any}>} */
  const allocCache = new Map();
  let hoverTimer = 0;
  let hoverBlock = -1;

  function blockAt(clientX, clientY) {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((clientX - rect.left) / cellCss);
    const r = Math.floor((clientY - rect.top) / cellCss);
    if (c < 0 || c >= cols || r < 0 || r >= rows) return -1;
    const i = r * cols + c;
    return i < model.blocks ? i : -1;
  }

  /** Tooltip lines of a prefix-cache block (data from GET .../prefix-cache/blocks/{i}). */
  function prefixTipHtml(i, info) {
    const st = model.stateNames[model.state[i]] || "?";
    const lines = [`<b>block ${i.toLocaleString()}</b> <span class="st st-${st}">${st}</span>`];
    if (info === undefined) lines.push(`<span class="muted">loading…</span>`);
    else if (info === null || info === FREED) lines.push(`<span class="muted">details unavailable</span>`);
    else {
      lines.push(`refcount <b>${info.refcount}</b> · held by ${info.refcount} sequence${info.refcount === 1 ? "" : "s"}`);
      if (info.hash) lines.push(`hash <code>${escapeHtml(info.hash.slice(0, 8))}…</code> · depth ${info.depth} in its chain`);
      else lines.push(`<span class="muted">not cached (partial or private block)</span>`);
      lines.push(`hits ${info.hits}`);
    }
    const rank = model.blockRank.get(i);
    if (rank !== undefined) lines.push(`eviction rank ${rank + 1} of ${model.orderLength}`);
    return lines.join("<br>");
  }

  /** Whether tooltips describe prefix-cache blocks (the pool has prefix caching). */
  const blockTips = () => Boolean(opts.fetchBlock && /** @type {any} */ (model.config || {}).prefix_caching);

  function tipHtml(i, alloc) {
    if (blockTips()) return prefixTipHtml(i, alloc);
    const owner = model.owner[i];
    const st = model.stateNames[model.state[i]] || "?";
    const lines = [`<b>block ${i.toLocaleString()}</b> <span class="st st-${st}">${st}</span>`];
    if (owner >= 0) {
      lines.push(`<i class="sw" data-color="${ownerCss(owner)}"></i> owner <b>#${owner}</b>`);
      const key = (alloc && alloc.key) || model.keyById.get(owner);
      if (key) lines.push(`key <code>${escapeHtml(String(key))}</code>`);
      const rank = model.orderRank.get(owner);
      if (rank !== undefined) lines.push(`eviction rank ${rank + 1} of ${model.orderLength}`);
      if (alloc === undefined) lines.push(`<span class="muted">loading…</span>`);
      else if (alloc === FREED) lines.push(`<span class="muted">just freed</span>`);
      else if (alloc === null) lines.push(`<span class="muted">details unavailable</span>`);
      else {
        const nblocks = (alloc.blocks || []).reduce((a, r) => a + (r[1] || 0), 0);
        lines.push(`size ${formatBytes(alloc.requested_bytes)} of ${formatBytes(alloc.allocated_bytes)} · ${nblocks} blocks`);
        if (alloc.tier) lines.push(`tier ${escapeHtml(String(alloc.tier))}`);
        // the server knows the age of cache entries only; a raw allocation's comes from its event
        const seen = model.createdAt.get(owner);
        const age = typeof alloc.age_s === "number" ? alloc.age_s : seen == null ? null : Math.max(0, Date.now() / 1000 - seen);
        const idle = typeof alloc.idle_s === "number" ? ` · idle ${formatAge(alloc.idle_s)}` : "";
        lines.push(`age ${age == null ? "—" : formatAge(age)}${idle}`);
      }
    }
    return lines.join("<br>");
  }

  /** What the tooltip knows of `owner`: FREED, fetched data, or undefined (not yet / stale). */
  function knownAlloc(owner) {
    if (model.isGone(owner)) return FREED;
    const cached = allocCache.get(owner);
    if (!cached) return undefined;
    return cached.data === FREED || performance.now() - cached.t < HOVER_CACHE_MS ? cached.data : undefined;
  }

  function placeTip(ev) {
    tip.hidden = false;
    const box = root.getBoundingClientRect();
    let x = ev.clientX - box.left + 14;
    const y = ev.clientY - box.top + 14;
    if (x + 260 > box.width) x = Math.max(0, x - 290);
    tip.style.transform = `translate(${x}px, ${y}px)`;
  }

  /** @type {Map<number, {t:number, data:any}>} prefix pools: block -> its look-up */
  const blockCache = new Map();

  function showBlockTip(ev, i) {
    const known = blockCache.get(i);
    const fresh = known && performance.now() - known.t < HOVER_CACHE_MS / 4; // refcounts move fast
    tip.innerHTML = prefixTipHtml(i, known ? known.data : undefined);
    placeTip(ev);
    window.clearTimeout(hoverTimer);
    if (fresh) return;
    hoverTimer = window.setTimeout(async () => {
      if (hoverBlock !== i) return;
      let data = null;
      try {
        data = await /** @type {(b:number) => Promise<any>} */ (opts.fetchBlock)(i);
      } catch {
        data = null;
      }
      blockCache.set(i, { t: performance.now(), data });
      if (blockCache.size > 4096) blockCache.delete(/** @type {number} */ (blockCache.keys().next().value));
      if (hoverBlock === i && !tip.hidden) tip.innerHTML = prefixTipHtml(i, data);
    }, HOVER_FETCH_DEBOUNCE_MS);
  }

  function showTip(ev, i) {
    if (blockTips()) {
      showBlockTip(ev, i);
      return;
    }
    const owner = model.owner[i];
    const known = owner >= 0 ? knownAlloc(owner) : null;
    tip.innerHTML = tipHtml(i, known);
    paintSwatches(tip);
    placeTip(ev);
    window.clearTimeout(hoverTimer);
    if (owner >= 0 && known === undefined && opts.fetchAllocation) {
      const want = owner;
      hoverTimer = window.setTimeout(() => fetchTip(want), HOVER_FETCH_DEBOUNCE_MS);
    }
  }

  /** @param {number} want owner id under the pointer when the debounce started */
  async function fetchTip(want) {
    // the block may have been freed (or reused) during the debounce: a look-up would only 404
    if (hoverBlock < 0 || model.owner[hoverBlock] !== want || model.isGone(want)) return;
    let data = null;
    try {
      data = await /** @type {(id:number) => Promise<any>} */ (opts.fetchAllocation)(want);
    } catch (err) {
      // freed on the server before the stream told us: a normal race, not an error
      data = err && /** @type {any} */ (err).status === 404 ? FREED : null;
    }
    allocCache.set(want, { t: performance.now(), data });
    if (allocCache.size > 4096) allocCache.delete(/** @type {number} */ (allocCache.keys().next().value));
    if (hoverBlock >= 0 && model.owner[hoverBlock] === want && !tip.hidden) {
      tip.innerHTML = tipHtml(hoverBlock, knownAlloc(want) ?? data);
      paintSwatches(tip);
    }
  }

  canvas.addEventListener("mousemove", (ev) => {
    const i = blockAt(ev.clientX, ev.clientY);
    hoverBlock = i;
    if (i < 0) tip.hidden = true;
    else showTip(ev, i);
  });
  canvas.addEventListener("mouseleave", () => {
    hoverBlock = -1;
    tip.hidden = true;
    window.clearTimeout(hoverTimer);
  });

  root.querySelectorAll("[data-mode]").forEach((b) =>
    b.addEventListener("click", () => setMode(/** @type {HTMLElement} */ (b).dataset.mode || "owner")),
  );
  cellSelect.addEventListener("change", () => {
    cellChoice = cellSelect.value === "auto" ? "auto" : Number(cellSelect.value);
    layoutStale = true;
    schedule();
  });

  /** @param {string} next "owner" | "heat" | "share" */
  function setMode(next) {
    mode = next === "heat" || next === "share" ? next : "owner";
    root.querySelectorAll("[data-mode]").forEach((b) => b.classList.toggle("on", /** @type {HTMLElement} */ (b).dataset.mode === mode));
    heatVersion = -1;
    model.markAllDirty();
    renderLegend();
    schedule();
  }

  const resizeObserver = new ResizeObserver(() => {
    layoutStale = true;
    schedule();
  });
  resizeObserver.observe(scroller);
  renderLegend();

  return {
    schedule,
    flush,
    setMode,
    /** Re-lay out (e.g. after the pool changed size) on the next frame. */
    relayout() {
      layoutStale = true;
      schedule();
    },
    /**
     * Read back what is painted: one sample per cell, classified by colour. A debug hook for
     * the browser tests; it flushes pending changes first.
     */
    paintedCounts() {
      flush();
      const width = cols * px;
      let free = 0;
      let pinned = 0;
      let occupied = 0;
      const inner = px >= MIN_DETAILED_CELL_PX ? px - 1 : px;
      for (let i = 0; i < model.blocks; i++) {
        const r = Math.floor(i / cols);
        const c = i % cols;
        const color = pixels[r * px * width + c * px];
        if (color === COLORS.free) free++;
        else {
          occupied++;
          const mid = Math.floor(inner / 2);
          if (pixels[(r * px + mid) * width + c * px + mid] === COLORS.pinned) pinned++;
        }
      }
      return { total: model.blocks, free, occupied, pinned, cols, rows, cellPx: px, cellCss };
    },
    /** The painted colour of block i (u32 RGBA), after pending changes: a debug hook for tests. */
    blockColor(i) {
      flush();
      const width = cols * px;
      return pixels[Math.floor(i / cols) * px * width + (i % cols) * px];
    },
    /** Paint cost of recent frames that painted something: count, p50 and p95 in ms. */
    paintStats() {
      const n = Math.min(paintCount, PAINT_SAMPLES);
      const sorted = Array.from(paintMs.subarray(0, n)).sort((a, b) => a - b);
      const at = (q) => (n ? sorted[Math.min(n - 1, Math.floor(q * n))] : 0);
      return { frames: paintCount, p50: at(0.5), p95: at(0.95), max: n ? sorted[n - 1] : 0 };
    },
    destroy() {
      destroyed = true;
      resizeObserver.disconnect();
      root.innerHTML = "";
    },
  };
}

/** @param {number} s */
export function formatAge(s) {
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
