// The capacity curve's data shaping: aligned columns, the pool's point, the pool's capacity.
import { test } from "node:test";
import assert from "node:assert/strict";

import { curveData, formatTokens, poolOnCurve } from "../curve.js";

const REPORT = {
  capacities_tokens: [100000, 1000000],
  policies: ["lru", "belady"],
  max_hit_ratio: 0.4,
  curve: [
    { capacity_tokens: 1000000, policy: "lru", hit_ratio: 0.2 },
    { capacity_tokens: 100000, policy: "lru", hit_ratio: 0.05 },
    { capacity_tokens: 100000, policy: "belady", hit_ratio: 0.1 },
    { capacity_tokens: 1000000, policy: "belady", hit_ratio: 0.3 },
  ],
};

test("one column per policy in capacity order, the maximum flat, no pool point without a pool", () => {
  const { labels, data } = curveData(REPORT);
  assert.deepEqual(labels, ["lru", "belady", "max (∞ capacity)", "this pool"]);
  assert.deepEqual(data, [[100000, 1000000], [0.05, 0.2], [0.1, 0.3], [0.4, 0.4], [null, null]]);
});

test("the pool's capacity is added in order, with its hit ratio there and gaps in the policy lines", () => {
  const { data } = curveData(REPORT, { capacity: 300000, hitRatio: 0.12 });
  assert.deepEqual(data[0], [100000, 300000, 1000000]);
  assert.deepEqual(data[1], [0.05, null, 0.2]);
  assert.deepEqual(data[3], [0.4, 0.4, 0.4]);
  assert.deepEqual(data[4], [null, 0.12, null]);
  // a pool below the smallest measured capacity, and one exactly at a measured capacity
  assert.deepEqual(curveData(REPORT, { capacity: 4096, hitRatio: null }).data[0], [4096, 100000, 1000000]);
  const same = curveData(REPORT, { capacity: 100000, hitRatio: 0.07 }).data;
  assert.deepEqual(same[0], [100000, 1000000]);
  assert.deepEqual(same[4], [0.07, null]);
});

test("points of unknown policies or capacities are ignored, not misplaced", () => {
  const report = { ...REPORT, curve: [...REPORT.curve, { capacity_tokens: 5, policy: "lru", hit_ratio: 1 }, { capacity_tokens: 100000, policy: "mru", hit_ratio: 1 }] };
  assert.deepEqual(curveData(report).data, curveData(REPORT).data);
});

test("the pool on the curve: blocks × tokens per block, token-weighted hit ratio, only with prefix caching", () => {
  const config = { num_blocks: 256, tokens_per_block: 16, prefix_caching: { policy: "lru" } };
  assert.deepEqual(poolOnCurve(config, null), { capacity: 4096, hitRatio: null });
  assert.deepEqual(poolOnCurve(config, { prefix: { queries: 0, hits: 0 } }), { capacity: 4096, hitRatio: null });
  assert.deepEqual(poolOnCurve(config, { prefix: { queries: 400, hits: 100 } }), { capacity: 4096, hitRatio: 0.25 });
  assert.equal(poolOnCurve({ num_blocks: 256, tokens_per_block: 16 }, null), null);
  assert.equal(poolOnCurve(null, null), null);
});

test("token counts read short", () => {
  assert.equal(formatTokens(100000), "100k");
  assert.equal(formatTokens(3000000), "3M");
  assert.equal(formatTokens(100000000), "100M");
  assert.equal(formatTokens(4096), "4,096");
});

test("the shipped curve file shapes into full policy columns and a flat maximum", async () => {
  const { readFile } = await import("node:fs/promises");
  const url = new URL("../../../workloads/reports/mooncake_prefix_curve.json", import.meta.url);
  const report = JSON.parse(await readFile(url, "utf8"));
  const { labels, data } = curveData(report, { capacity: 262144, hitRatio: 0.1 });
  const n = report.policies.length;
  assert.equal(labels.length, n + 2);
  assert.equal(data.length, n + 3);
  const at = data[0].indexOf(262144);
  assert.ok(at > 0, "the pool's capacity lies inside the measured range");
  for (let p = 1; p <= n; p++) {
    assert.equal(data[p].filter((v) => v != null).length, report.capacities_tokens.length, labels[p - 1]);
    assert.equal(data[p][at], null);
  }
  assert.ok(data[n + 1].every((v) => v === report.max_hit_ratio));
  assert.deepEqual(data[n + 2].filter((v) => v != null), [0.1]);
});
