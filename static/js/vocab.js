// The vocabulary (allocator/vocab.py): strategies, fits, policies, block states, event kinds,
// scenarios, and what they mean. The page embeds it (templates/index.html, the same object as
// GET /api/meta and a stream hello's `meta`); the JS keeps no copy of any list and asks here.

/**
 * @typedef {Object} Meta
 * @property {Object<string, {name:string, label:string, scatter_fails:boolean, options:string[], compare:boolean, description:string}>} strategies
 * @property {string[]} fits
 * @property {Object<string, {name:string, label:string, needs_next_use:boolean, description:string}>} policies
 * @property {Object<string, {name:string, code:number, description:string}>} block_states
 * @property {Object<string, {fields:string[], group:string}>} events
 * @property {Object<string, {label:string, default:boolean}>} event_groups
 * @property {Object<string, {name:string, description:string, uses_cache:boolean, uses_prefix?:boolean}>} scenarios
 * @property {string[]} workload_kinds
 */

/** @type {Meta} */
const EMPTY = Object.freeze({ strategies: {}, fits: [], policies: {}, block_states: {}, events: {}, event_groups: {}, scenarios: {}, workload_kinds: [] });

/** @type {Meta|null} */
let current = null;

/** The vocabulary embedded in the page (`<script type="application/json" id="kv-meta">`), or null. */
function fromPage() {
  if (typeof document === "undefined") return null;
  const el = document.getElementById("kv-meta");
  if (!el || !el.textContent) return null;
  try {
    return JSON.parse(el.textContent);
  } catch {
    return null;
  }
}

/** @returns {Meta} */
export function vocab() {
  if (!current) current = fromPage();
  return current || EMPTY;
}

/** Replace the vocabulary (a hello's `meta`, or GET /api/meta). @param {Meta|null|undefined} meta */
export function setVocab(meta) {
  if (meta && typeof meta === "object" && meta.strategies) current = meta;
}

/** Event types in a log-filter group (a group with no member is taken as a type). @param {string} group */
export function eventTypesOf(group, meta = vocab()) {
  const types = Object.entries(meta.events).filter(([, k]) => k.group === group).map(([name]) => name);
  return types.length ? types : [group];
}

/** Whether scattered free space can fail a request on `strategy` (unknown: assume it can). @param {string} strategy */
export function scatterFails(strategy, meta = vocab()) {
  const s = meta.strategies[strategy];
  return s ? s.scatter_fails !== false : true;
}

/** Whether a scenario runs cache operations (its pool wants a cache). @param {string} name */
export function usesCache(name, meta = vocab()) {
  const s = meta.scenarios[name];
  return Boolean(s && s.uses_cache);
}

/** Whether a scenario opens sequences (its pool wants prefix caching). @param {string} name */
export function usesPrefix(name, meta = vocab()) {
  const s = meta.scenarios[name];
  return Boolean(s && /** @type {any} */ (s).uses_prefix);
}

/** Strategies the Compare view runs by default, in vocabulary order. */
export function compareStrategies(meta = vocab()) {
  return Object.values(meta.strategies).filter((s) => s.compare).map((s) => s.name);
}

/** Block-state name -> code, from a hello's `states` (`{"0": "free", ...}`). @param {Object<string,string>} states */
export function stateCodes(states) {
  /** @type {Object<string, number>} */
  const out = {};
  for (const [code, name] of Object.entries(states || {})) out[name] = Number(code);
  return out;
}
