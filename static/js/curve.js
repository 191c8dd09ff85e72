// The capacity curve's data shaping (GET /api/prefix/curve), pure so node tests it without a DOM.

/**
 * @typedef {Object} CurveReport  GET /api/prefix/curve
 * @property {number[]} capacities_tokens
 * @property {string[]} policies
 * @property {number} max_hit_ratio
 * @property {{capacity_tokens: number, policy: string, hit_ratio: number}[]} curve
 */

/**
 * Where the shown pool sits: its capacity in tokens (num_blocks × tokens_per_block) and its live
 * hit ratio (null before any lookup). Null for a pool without prefix caching.
 * @param {any} config  the stream's hello `pool`
 * @param {any} stats   the latest stats message
 * @returns {{capacity: number, hitRatio: number|null}|null}
 */
export function poolOnCurve(config, stats) {
  if (!config || !config.prefix_caching) return null;
  const capacity = Number(config.num_blocks) * Number(config.tokens_per_block);
  if (!(capacity > 0)) return null;
  const p = stats && stats.prefix;
  const hitRatio = p && p.queries > 0 ? p.hits / p.queries : null;
  return { capacity, hitRatio };
}

/**
 * uPlot's aligned data for the curve: x = capacities (ascending, with the pool's capacity added
 * when it is not one of them), one column per policy (null where it has no point: at the pool's
 * own x), the maximum as a constant column, and the pool's point alone in the last column.
 * @param {CurveReport} report
 * @param {{capacity: number, hitRatio: number|null}|null} [here]
 * @returns {{labels: string[], data: (number|null)[][]}}
 */
export function curveData(report, here = null) {
  const xs = Array.from(new Set(report.capacities_tokens.map(Number)));
  if (here && here.capacity > 0 && !xs.includes(here.capacity)) xs.push(here.capacity);
  xs.sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const lines = report.policies.map(() => xs.map(() => /** @type {number|null} */ (null)));
  for (const pt of report.curve) {
    const p = report.policies.indexOf(pt.policy);
    const i = at.get(Number(pt.capacity_tokens));
    if (p >= 0 && i !== undefined) lines[p][i] = pt.hit_ratio;
  }
  const max = xs.map(() => report.max_hit_ratio);
  const pool = xs.map((x) => (here && x === here.capacity ? here.hitRatio : null));
  return { labels: [...report.policies, "max (∞ capacity)", "this pool"], data: [xs, ...lines, max, pool] };
}

/** "100k", "3M", "4,096": capacity in tokens for the axis and the title. */
export function formatTokens(n) {
  if (n >= 1e6) return `${+(n / 1e6).toPrecision(3)}M`;
  if (n >= 1e5) return `${+(n / 1e3).toPrecision(3)}k`;
  return Math.round(n).toLocaleString("en");
}
