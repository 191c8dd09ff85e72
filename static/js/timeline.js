// Time travel: a timeline under the block map. Drag, step or play through the pool's kept
// history (GET .../history); the map and the numbers then show that moment (blockmap and stats
// `at_seq`), markers show OOMs, evictions, defragments, resets and workload phases; "Live"
// returns to the stream. Works the same on a recording opened as a pool.

import { pool as poolApi } from "./api.js";
import { PoolModel } from "./model.js";

export const MARKER_KINDS = ["oom", "evict", "defragment", "reset", "workload"];
export const MARKER_LIMIT = 2000;
export const REFRESH_MS = 2000;
export const PLAY_TICK_MS = 100;
export const SCRUB_DEBOUNCE_MS = 60;

/**
 * Fill a model's map from RLE runs `[start, count, owner, state]` (the blockmap route's JSON).
 * @param {PoolModel} model @param {number} blocks @param {number[][]} runs
 */
export function applyRuns(model, blocks, runs) {
  model.resize(blocks);
  for (const [start, count, owner, state] of runs) {
    model.owner.fill(owner, start, start + count);
    model.state.fill(state, start, start + count);
  }
  model.markAllDirty();
}

/**
 * Where a seq sits on the track, 0..1.
 * @param {number} seq @param {number} first @param {number} last
 */
export function fraction(seq, first, last) {
  return last > first ? Math.min(1, Math.max(0, (seq - first) / (last - first))) : 1;
}

/**
 * @param {HTMLElement} root
 * @param {{getPool: () => string, getLiveModel: () => PoolModel,
 *          onShow: (model: PoolModel|null, ts: number|null) => void, status: (msg: string, kind?: string) => void,
 *          onChange?: (state: {mode: string, seq: number, first: number, last: number}) => void}} opts
 *   onShow(model, ts): draw this past model (its event's time `ts`, null for seq 0); onShow(null, null): live.
 *   onChange(state): the mode, the chosen seq or the kept range changed (the charts follow it).
 */
export function createTimeline(root, opts) {
  root.innerHTML = `
    <div class="tl-markers" data-role="markers" aria-label="Markers"></div>
    <input type="range" id="tl-range" min="0" max="0" value="0" step="1" aria-label="Event seq">
    <div class="tl-row">
      <button type="button" id="tl-back" title="One event back">◀ step</button>
      <button type="button" id="tl-fwd" title="One event forward">step ▶</button>
      <button type="button" id="tl-play" title="Play from here">Play</button>
      <label>speed <select id="tl-speed" aria-label="Events per second">
        <option value="10">10 ev/s</option><option value="100" selected>100 ev/s</option><option value="1000">1000 ev/s</option>
      </select></label>
      <button type="button" id="tl-live" class="on" title="Back to the live pool">Live</button>
      <span id="tl-label" class="tl-label"></span>
    </div>`;
  const range = /** @type {HTMLInputElement} */ (root.querySelector("#tl-range"));
  const label = /** @type {HTMLElement} */ (root.querySelector("#tl-label"));
  const markersBox = /** @type {HTMLElement} */ (root.querySelector("[data-role=markers]"));
  const liveBtn = /** @type {HTMLElement} */ (root.querySelector("#tl-live"));
  const playBtn = /** @type {HTMLElement} */ (root.querySelector("#tl-play"));
  const speedSel = /** @type {HTMLSelectElement} */ (root.querySelector("#tl-speed"));

  const state = { mode: "live", seq: 0, first: 0, last: 0, dropped: 0, shown: -1, markers: /** @type {Object[]} */ ([]) };
  let request = 0; // newer seeks win over older answers
  let scrubTimer = 0;
  let playTimer = 0;
  let refreshTimer = 0;
  let destroyed = false;

  function render() {
    range.min = String(state.first);
    range.max = String(state.last);
    if (state.mode === "live") range.value = String(state.last);
    liveBtn.classList.toggle("on", state.mode === "live");
    root.dataset.mode = state.mode;
    const dropped = state.dropped ? ` · ${state.dropped} oldest events dropped` : "";
    label.textContent = state.mode === "live"
      ? `live · history ${state.first}..${state.last}${dropped}`
      : `event ${state.seq} of ${state.first}..${state.last}${dropped}${state.shown === state.seq ? "" : " · loading"}`;
    if (opts.onChange && !destroyed) opts.onChange({ mode: state.mode, seq: state.seq, first: state.first, last: state.last });
  }

  function renderMarkers() {
    markersBox.innerHTML = "";
    for (const m of state.markers) {
      const tick = document.createElement("button");
      tick.type = "button";
      tick.className = `tl-mark tl-${m.type}`;
      tick.style.left = `${(100 * fraction(m.seq, state.first, state.last)).toFixed(3)}%`;
      tick.title = `${m.type}${m.type === "workload" ? ` ${m.name} ${m.state}` : ""} at event ${m.seq}`;
      tick.dataset.seq = String(m.seq);
      tick.addEventListener("click", () => seek(m.seq));
      markersBox.appendChild(tick);
    }
  }

  async function refresh() {
    const name = opts.getPool();
    if (!name) return;
    try {
      const h = await poolApi(name).history();
      const page = await poolApi(name).historyEvents({ after: h.first_seq, limit: MARKER_LIMIT, kinds: MARKER_KINDS });
      // range and markers change together, so a reader never sees one without the other
      state.first = h.first_seq;
      state.last = h.last_seq;
      state.dropped = h.dropped_events || 0;
      state.markers = page.events;
      renderMarkers();
    } catch (err) {
      // a pool without history (or gone) has no timeline; the live view is unaffected
      state.first = state.last = 0;
      state.markers = [];
      renderMarkers();
      if (state.mode === "past") opts.status(`history: ${/** @type {Error} */ (err).message}`, "err");
    }
    render();
  }

  /** Show the pool right after event `seq`. @param {number} seq */
  async function seek(seq) {
    seq = Math.round(Math.min(state.last, Math.max(state.first, seq)));
    state.mode = "past";
    state.seq = seq;
    range.value = String(seq);
    render();
    const mine = ++request;
    const api = poolApi(opts.getPool());
    try {
      const [map, stats, at] = await Promise.all([
        api.blockmapAt(seq), api.statsAt(seq), seq > 0 ? api.historyEvents({ after: seq - 1, limit: 1 }) : null]);
      if (mine !== request || state.mode !== "past" || destroyed) return;
      const live = opts.getLiveModel();
      const past = new PoolModel();
      past.config = live.config;
      past.codes = live.codes;
      past.stateNames = live.stateNames;
      applyRuns(past, map.num_blocks, map.runs);
      // `past`: the numbers panel says the cache's own figures (and a prefix pool's hit counts) are not kept
      past.stats = { ...stats, past: true };
      past.lastSeq = seq;
      state.shown = seq;
      const ev = at && at.events[0];
      opts.onShow(past, ev && ev.seq === seq ? ev.ts : null);
      render();
    } catch (err) {
      if (mine === request) opts.status(`cannot show event ${seq}: ${/** @type {Error} */ (err).message}`, "err");
    }
  }

  function stopPlay() {
    if (playTimer) window.clearInterval(playTimer);
    playTimer = 0;
    playBtn.textContent = "Play";
  }

  function goLive() {
    stopPlay();
    request++;
    state.mode = "live";
    state.shown = -1;
    opts.onShow(null, null);
    refresh();
  }

  range.addEventListener("input", () => {
    stopPlay();
    window.clearTimeout(scrubTimer);
    scrubTimer = window.setTimeout(() => seek(Number(range.value)), SCRUB_DEBOUNCE_MS);
  });
  root.querySelector("#tl-back")?.addEventListener("click", () => {
    stopPlay();
    seek((state.mode === "live" ? state.last : state.seq) - 1);
  });
  root.querySelector("#tl-fwd")?.addEventListener("click", () => {
    stopPlay();
    if (state.mode === "past") seek(state.seq + 1);
  });
  playBtn.addEventListener("click", () => {
    if (playTimer) {
      stopPlay();
      return;
    }
    if (state.mode === "live") seek(state.first);
    playBtn.textContent = "Pause";
    playTimer = window.setInterval(() => {
      // advance only once the previous point is shown, so a slow server is never flooded
      if (state.shown !== state.seq) return;
      const step = Math.max(1, Math.round((Number(speedSel.value) * PLAY_TICK_MS) / 1000));
      if (state.seq >= state.last) {
        stopPlay();
        return;
      }
      seek(state.seq + step);
    }, PLAY_TICK_MS);
  });
  liveBtn.addEventListener("click", goLive);

  refresh();
  refreshTimer = window.setInterval(() => {
    if (state.mode === "live") refresh();
  }, REFRESH_MS);

  return {
    /** What the page shows: {mode, seq, first, last, shown, markers}. */
    state: () => ({ mode: state.mode, seq: state.seq, first: state.first, last: state.last, shown: state.shown, markers: state.markers.length }),
    seek,
    goLive,
    refresh,
    destroy() {
      destroyed = true;
      stopPlay();
      window.clearInterval(refreshTimer);
      window.clearTimeout(scrubTimer);
      root.innerHTML = "";
    },
  };
}
