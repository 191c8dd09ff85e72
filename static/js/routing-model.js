// Routing view, pure part: the request body from the form's values, the run's progress line and
// its result rows as table cells (GET /api/routing/{id} -> what the view shows). No DOM here.

/**
 * @typedef {Object} RoutingRow  one finished policy (a `kvscope route` row)
 * @property {string} policy
 * @property {number} hit_ratio
 * @property {number} imbalance
 * @property {number} duplicated_blocks
 * @property {number} [available_hit_ratio]  serving mode
 * @property {number} [ttft_p50_s]
 * @property {number} [ttft_p99_s]
 * @property {number} [throughput_rps]
 */

/**
 * @typedef {Object} RoutingRun  the `routing` object of GET /api/routing/{id}
 * @property {string} id
 * @property {"running"|"finished"|"stopped"|"failed"} state
 * @property {"sequence"|"serving"} mode
 * @property {number} done
 * @property {number} total
 * @property {string|null} current
 * @property {RoutingRow[]} results
 * @property {string|null} error
 * @property {{request: number, replica: number, rule: string, matches: number[], loads: number[]}[]} decisions
 */

const pct = (x) => `${(100 * x).toFixed(1)}%`;

/** Table columns: [header, cell of a row]; serving runs add the TTFT columns. */
export const SEQUENCE_COLUMNS = [
  ["Policy", (r) => r.policy],
  ["Hit ratio", (r) => pct(r.hit_ratio)],
  ["Imbalance", (r) => r.imbalance.toFixed(2)],
  ["Duplicated blocks", (r) => r.duplicated_blocks.toLocaleString("en-US")],
];
export const SERVING_COLUMNS = [
  ["Available hit", (r) => pct(r.available_hit_ratio)],
  ["TTFT p50 (s)", (r) => r.ttft_p50_s.toFixed(2)],
  ["TTFT p99 (s)", (r) => r.ttft_p99_s.toFixed(2)],
  ["Req/s", (r) => r.throughput_rps.toFixed(2)],
];

/**
 * The POST body for a start.
 * @param {{policies: string[], replicas: string, capacity: string, limit: string, mode: string}} f
 */
export function routingBody(f) {
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
  const cols = columnsFor(run);
  return { headers: cols.map((c) => c[0]), rows: run.results.map((r) => cols.map((c) => c[1](r))) };
}

/** The progress line: {frac, text, state}. @param {RoutingRun} run */
export function describeRun(run) {
  const frac = run.total ? Math.min(1, run.done / run.total) : 0;
  const what = {
    running: `routing ${run.current || ""}: ${run.done.toLocaleString("en-US")} / ${run.total.toLocaleString("en-US")} requests`,
    finished: `finished: ${run.results.length} policies over ${run.total.toLocaleString("en-US")} requests`,
    stopped: `stopped after ${run.results.length} policies`,
    failed: `failed: ${run.error || "unknown error"}`,
  }[run.state];
  return { frac, text: what, state: run.state };
}

/** The latest decisions, newest first, one line each. @param {RoutingRun} run */
export function decisionLines(run) {
  return (run.decisions || [])
    .slice()
    .reverse()
    .map((d) => `request ${d.request} → replica ${d.replica}: ${d.rule} (cached blocks [${d.matches.join(", ")}], in flight [${d.loads.join(", ")}])`);
}
