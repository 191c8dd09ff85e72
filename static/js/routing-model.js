// Routing view, pure part: the request body from the form's values, the run's progress line and
// its result rows as table cells (GET /api/routing/{id} -> what the view shows). No DOM here.

/**
 * @typedef {Object} RoutingRow  one finished policy (a `kvscope route` row)
 * @property {string} policy
 * @property {number} hit_ratio
 * @property {number} imbalance
 * @property {number} duplicated_blocks
 * @property {number|null} [of_pooled_bound]  hit_ratio over the pooled bound (null: the bound is 0)
 * @property {number} [available_hit_ratio]  serving mode
 * @property {number} [ttft_p50_s]
 * @property {number} [ttft_p99_s]
 * @property {number} [throughput_rps]
 */

/**
 * @typedef {Object} RoutingRun  the `routing` object of GET /api/routing/{id}
 * @property {string} id
 * @property {"running"|"finished"|"stopped"|"failed"} state
 * @property {"sequence"|"serving"|"live"|"router"} mode
 * @property {string} [router]  router mode: the real router (sglang, vllm, vllm-kv)
 * @property {string} [policy]  live: the policy routing now
 * @property {string|null} [fleet]  live: the fleet mirroring its pools (null once released)
 * @property {number} [hit_ratio]  live: over every request so far
 * @property {ReplicaFigures[]} [replica_figures]  live; router mode: EngineFigures
 * @property {number} done
 * @property {number} total
 * @property {string|null} current
 * @property {RoutingRow[]} results
 * @property {RoutingBounds|null} [bounds]  sequence / serving: the limits of its (mode, N, C)
 * @property {number} [replicas]
 * @property {number} [capacity_tokens]
 * @property {string|null} error
 * @property {Decision[]} decisions
 * @property {boolean} [compare]  live: two policies side by side, their figures in `sides`
 * @property {LiveSide[]} [sides]  live: one per policy routing (two when comparing)
 */

/**
 * @typedef {Object} RoutingBounds  what no routing of the same requests over N replicas of C can beat
 * @property {number} pooled_bound_hit_ratio  Bélády's MIN over one cache of all N replicas' blocks
 * @property {number} pooled_bound_blocks
 * @property {number} infinite_bound_hit_ratio  a cache that never evicts
 */

/** @typedef {{request: number, replica: number, policy?: string, rule: string, matches: number[], loads: number[]}} Decision */

/**
 * @typedef {Object} LiveSide  one policy of a live run with its pools and fleet
 * @property {string|null} label  "a" or "b" when comparing
 * @property {string} policy
 * @property {number} requests
 * @property {number} hit_ratio
 * @property {ReplicaFigures[]} replica_figures
 * @property {Decision[]} decisions
 * @property {string|null} fleet
 */

/**
 * @typedef {Object} ReplicaFigures  one live replica (a real pool)
 * @property {number} replica
 * @property {number} requests
 * @property {number} hit_ratio
 * @property {number} cached_blocks
 * @property {number} num_blocks
 * @property {number} refused
 */

/**
 * @typedef {Object} EngineFigures  one simulated engine behind a real router, from its own counters
 * @property {string} name
 * @property {number} requests
 * @property {number} completed
 * @property {number} hit_ratio
 * @property {number} cached_blocks
 */

const pct = (x) => `${(100 * x).toFixed(1)}%`;
const count = (x) => x.toLocaleString("en-US");

/** Table columns: [header, cell of a row]; serving runs add the TTFT columns. */
export const SEQUENCE_COLUMNS = [
  ["Policy", (r) => r.policy],
  ["Hit ratio", (r) => pct(r.hit_ratio)],
  ["Of pooled bound", (r) => (r.of_pooled_bound == null ? "—" : `${(100 * r.of_pooled_bound).toFixed(0)}%`)],
  ["Imbalance", (r) => r.imbalance.toFixed(2)],
  ["Duplicated blocks", (r) => r.duplicated_blocks.toLocaleString("en-US")],
];
export const SERVING_COLUMNS = [
  ["Available hit", (r) => pct(r.available_hit_ratio)],
  ["TTFT p50 (s)", (r) => r.ttft_p50_s.toFixed(2)],
  ["TTFT p99 (s)", (r) => r.ttft_p99_s.toFixed(2)],
  ["Req/s", (r) => r.throughput_rps.toFixed(2)],
];

export const LIVE_COLUMNS = [
  ["Replica", (r) => `r${r.replica}`],
  ["Requests", (r) => r.requests.toLocaleString("en-US")],
  ["Hit ratio", (r) => pct(r.hit_ratio)],
  ["Cached blocks", (r) => `${r.cached_blocks.toLocaleString("en-US")} / ${r.num_blocks.toLocaleString("en-US")}`],
  ["Refused", (r) => r.refused.toLocaleString("en-US")],
];

export const ENGINE_COLUMNS = [
  ["Engine", (r) => r.name],
  ["Requests", (r) => r.requests.toLocaleString("en-US")],
  ["Completed", (r) => r.completed.toLocaleString("en-US")],
  ["Hit ratio (its counters)", (r) => pct(r.hit_ratio)],
  ["Cached blocks", (r) => r.cached_blocks.toLocaleString("en-US")],
];

const opt = (x, f) => (x == null ? "—" : f(x));
export const ROUTER_COLUMNS = [
  ["Router", (r) => r.policy],
  ["Hit ratio (decisions)", (r) => pct(r.hit_ratio)],
  ["Engines' counters", (r) => opt(r.engine_hit_ratio, pct)],
  ["Available hit", (r) => opt(r.available_hit_ratio, pct)],
  ["Of pooled bound", (r) => (r.of_pooled_bound == null ? "—" : `${(100 * r.of_pooled_bound).toFixed(0)}%`)],
  ["Imbalance", (r) => r.imbalance.toFixed(2)],
  ["TTFT p50 (s)", (r) => r.ttft_p50_s.toFixed(2)],
  ["TTFT p99 (s)", (r) => r.ttft_p99_s.toFixed(2)],
];

/**
 * The POST body for a start. A live run starts with the first ticked policy, at `speed` times
 * the trace's timestamps; with `compare`, it runs the first two ticked policies side by side.
 * Router mode sends the trace through the real `router` in front of simulated engines.
 * @param {{policies: string[], replicas: string, capacity: string, limit: string, mode: string, speed?: string, compare?: boolean, router?: string}} f
 */
export function routingBody(f) {
  if (f.mode === "router") {
    return {
      action: "start",
      mode: "router",
      router: f.router || "sglang",
      replicas: Number(f.replicas),
      capacity_tokens: Number(String(f.capacity).replace(/[_,\s]/g, "")),
      limit: Number(f.limit),
      ...(f.speed ? { speed: Number(f.speed) } : {}),
    };
  }
  if (f.mode === "live") {
    return {
      action: "start",
      mode: "live",
      ...(f.compare ? { compare: f.policies.slice(0, 2) } : { policy: f.policies[0] }),
      replicas: Number(f.replicas),
      capacity_tokens: Number(String(f.capacity).replace(/[_,\s]/g, "")),
      limit: Number(f.limit),
      speed: Number(f.speed),
    };
  }
  return {
    action: "start",
    policies: f.policies,
    replicas: Number(f.replicas),
    capacity_tokens: Number(String(f.capacity).replace(/[_,\s]/g, "")),
    limit: Number(f.limit),
    mode: f.mode,
  };
}

/** @param {RoutingRun} run */
export function columnsFor(run) {
  return run.mode === "serving" ? SEQUENCE_COLUMNS.concat(SERVING_COLUMNS) : SEQUENCE_COLUMNS;
}

/** Headers and cells of the run's result table. @param {RoutingRun} run */
export function resultTable(run) {
  if (run.mode === "router") {
    if (run.results && run.results.length) {
      return { headers: ROUTER_COLUMNS.map((c) => c[0]), rows: run.results.map((r) => ROUTER_COLUMNS.map((c) => c[1](r))) };
    }
    return { headers: ENGINE_COLUMNS.map((c) => c[0]), rows: (run.replica_figures || []).map((r) => ENGINE_COLUMNS.map((c) => c[1](r))) };
  }
  if (run.mode === "live") {
    return { headers: LIVE_COLUMNS.map((c) => c[0]), rows: (run.replica_figures || []).map((r) => LIVE_COLUMNS.map((c) => c[1](r))) };
  }
  const cols = columnsFor(run);
  return { headers: cols.map((c) => c[0]), rows: run.results.map((r) => cols.map((c) => c[1](r))) };
}

/**
 * The line above the result table: the run's two bounds, or "" (a live run, or none yet).
 * @param {RoutingRun} run
 */
export function boundsLine(run) {
  const b = run.mode === "live" ? null : run.bounds;
  if (!b) return "";
  return (
    `No routing of these requests over ${run.replicas} replicas of ${count(run.capacity_tokens)} tokens can hit more than ` +
    `${pct(b.pooled_bound_hit_ratio)} (pooled bound: Bélády's MIN on one cache of all ${count(b.pooled_bound_blocks)} blocks) ` +
    `or ${pct(b.infinite_bound_hit_ratio)} (infinite cache).`
  );
}

/** The progress line: {frac, text, state}. @param {RoutingRun} run */
export function describeRun(run) {
  const frac = run.total ? Math.min(1, run.done / run.total) : 0;
  if (run.mode === "router") {
    const n = run.total == null
      ? `${run.done.toLocaleString("en-US")} requests sent`
      : `${run.done.toLocaleString("en-US")} / ${run.total.toLocaleString("en-US")} requests`;
    const hit = run.hit_ratio == null ? "" : `, hit ${pct(run.hit_ratio)} (engines' counters)`;
    const text = {
      running: `the real ${run.router} router over ${run.replicas} simulated engines: ${n}${hit}`,
      finished: `finished: ${n} through the real ${run.router} router`,
      stopped: `stopped: ${n} through the real ${run.router} router`,
      failed: `failed: ${run.error || "unknown error"}`,
    }[run.state];
    return { frac: run.total == null ? 1 : frac, text, state: run.state };
  }
  if (run.mode === "live") {
    const n = `${run.done.toLocaleString("en-US")} / ${run.total.toLocaleString("en-US")} requests`;
    const sides = run.compare ? run.sides || [] : [];
    const hit = sides.length
      ? `hit ${sides.map((s) => `${pct(s.hit_ratio)} (${s.policy})`).join(" vs ")}`
      : `hit ${pct(run.hit_ratio || 0)}`;
    const what = sides.length ? sides.map((s) => s.policy).join(" vs ") : run.policy;
    const text = {
      running: `live, ${what}: ${n}, ${hit}`,
      finished: `finished: ${n}, ${hit}`,
      stopped: `stopped: ${n}, ${hit}`,
      failed: `failed: ${run.error || "unknown error"}`,
    }[run.state];
    return { frac, text, state: run.state };
  }
  const what = {
    running: `routing ${run.current || ""}: ${run.done.toLocaleString("en-US")} / ${run.total.toLocaleString("en-US")} requests`,
    finished: `finished: ${run.results.length} policies over ${run.total.toLocaleString("en-US")} requests`,
    stopped: `stopped after ${run.results.length} policies`,
    failed: `failed: ${run.error || "unknown error"}`,
  }[run.state];
  return { frac, text: what, state: run.state };
}

/**
 * A compare run's two columns, one per side: its title, fleet link, hit ratio, replica table and
 * latest decisions. Empty for any other run. @param {RoutingRun} run
 */
export function sideColumns(run) {
  if (run.mode !== "live" || !run.compare) return [];
  return (run.sides || []).map((s) => ({
    title: `${s.label}: ${s.policy}`,
    fleet: fleetHref({ mode: "live", fleet: s.fleet }),
    fleetName: s.fleet,
    hit: `hit ${pct(s.hit_ratio)} over ${s.requests.toLocaleString("en-US")} requests`,
    table: resultTable({ mode: "live", replica_figures: s.replica_figures }),
    decisions: decisionLines(s),
  }));
}

/** The latest decisions, newest first, one line each. @param {{decisions?: Decision[]}} run */
export function decisionLines(run) {
  return (run.decisions || [])
    .slice()
    .reverse()
    .map((d) => `request ${d.request} → replica ${d.replica}${d.policy ? ` [${d.policy}]` : ""}: ${d.rule} (cached blocks [${d.matches.join(", ")}], in flight [${d.loads.join(", ")}])`);
}

/** The Fleet view's address for a live or router run's fleet, or null (none, or released). @param {RoutingRun} run */
export function fleetHref(run) {
  return (run.mode === "live" || run.mode === "router") && run.fleet
    ? `/?fleet=${encodeURIComponent(run.fleet)}#fleet`
    : null;
}

/**
 * The runs select's options, newest first: {value, label} per run of GET /api/routing.
 * @param {RoutingRun[]} runs
 */
export function runOptions(runs) {
  return runs
    .slice()
    .reverse()
    .map((r) => ({
      value: r.id,
      label: `${r.id}: ${r.mode === "router" ? `router ${r.router}` : r.mode === "live" ? `live ${(r.policies || []).join(" vs ")}` : `${r.mode}, ${(r.policies || []).length} policies`} (${r.state})`,
    }));
}

/**
 * Which run the view shows when it opens: the newest one still running (such as the demo's
 * router run), else none (finished runs stay a pick away in the runs list).
 * @param {RoutingRun[]} runs
 */
export function runToShow(runs) {
  const running = runs.filter((r) => r.state === "running");
  return running.length ? running[running.length - 1] : null;
}

// -- the decision explorer (GET /api/routing/{id}/decisions) -----------------------------------

/** The rules a decision can name (workloads/routing/decisions.py RULES). */
export const DECISION_RULES = ["round_robin", "random", "least_loaded", "power_of_two", "session",
  "match", "low_match", "imbalance", "score", "only", "router"];
export const DECISION_PAGE = 50;

/**
 * The query of one explorer page; empty filters are left out.
 * @param {{policy?: string, rule?: string, replica?: string|number, request?: string|number, offset?: number}} f
 */
export function decisionsQuery(f) {
  const q = new URLSearchParams();
  if (f.policy) q.set("policy", f.policy);
  if (f.rule) q.set("rule", f.rule);
  for (const key of /** @type {const} */ (["replica", "request"])) {
    const v = f[key];
    if (v !== undefined && v !== null && String(v).trim() !== "") {
      const n = Number(String(v).trim());
      if (!Number.isInteger(n) || n < 0) throw new Error(`${key} must be a whole number >= 0, not "${v}"`);
      q.set(key, String(n));
    }
  }
  q.set("offset", String(Math.max(0, f.offset || 0)));
  q.set("limit", String(DECISION_PAGE));
  return q.toString();
}

/** The policies whose decisions a run holds, in its order (a live run's: its sides'). @param {RoutingRun} run */
export function decisionPolicies(run) {
  if (run.mode === "router") return run.policies || [];
  if (run.mode === "live") return (run.sides || []).map((s) => s.label || s.policy);
  return (run.results || []).map((r) => r.policy).concat(run.current && !(run.results || []).some((r) => r.policy === run.current) ? [run.current] : []);
}

/** @param {number|null|undefined} n */
const tokens = (n) => (n === null || n === undefined ? "—" : n.toLocaleString("en-US"));

/**
 * One explorer page as table cells, and the line that says where it is.
 * @param {{total: number, offset: number, decisions: FullDecision[]}} page
 */
export function decisionTable(page) {
  const rows = page.decisions.map((d) => [String(d.request), String(d.replica), d.rule, d.why,
    String(d.best_matched_blocks), tokens(d.captured_tokens), tokens(d.available_tokens)]);
  const first = page.decisions.length ? page.offset + 1 : 0;
  return {
    headers: ["Request", "Replica", "Rule", "Why", "Best cached blocks", "Captured tokens", "Available tokens"],
    rows,
    where: `${first.toLocaleString("en-US")}–${(page.offset + page.decisions.length).toLocaleString("en-US")} of ${page.total.toLocaleString("en-US")} decisions`,
    prev: page.offset > 0 ? Math.max(0, page.offset - DECISION_PAGE) : null,
    next: page.offset + page.decisions.length < page.total ? page.offset + DECISION_PAGE : null,
  };
}

/**
 * One decision's candidates, the chosen replica marked. @param {FullDecision} d
 */
export function candidateTable(d) {
  return {
    title: `request ${d.request} → replica ${d.replica} (${d.policy}: ${d.rule})`,
    headers: ["Replica", "Cached leading blocks", "Load", "Score", ""],
    rows: d.candidates.map((c) => [String(c.replica), String(c.matched_blocks), String(c.load),
      c.score === null || c.score === undefined ? "—" : String(Math.round(c.score * 1000) / 1000),
      c.replica === d.replica ? "chosen" : c.matched_blocks === d.best_matched_blocks && d.best_matched_blocks > 0 ? "held the most" : ""]),
  };
}

/**
 * @typedef {Object} FullDecision  one record of GET /api/routing/{id}/decisions
 * @property {number} request
 * @property {string} policy
 * @property {number} replica
 * @property {string} rule
 * @property {string} why
 * @property {{replica: number, matched_blocks: number, load: number, score: number|null}[]} candidates
 * @property {number} best_matched_blocks
 * @property {number|null} captured_tokens
 * @property {number|null} available_tokens
 */
