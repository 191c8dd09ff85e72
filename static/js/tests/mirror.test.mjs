import assert from "node:assert/strict";
import { test } from "node:test";

import { describeMirror, describePrefixEvent, errorSummary, mirrorAlerts, mirrorNumbersHtml } from "../mirror.js";
import { describeEvent, numbersHtml } from "../panels.js";

const stats = (mirror) => ({ strategy: "mirror", total_blocks: 96, used_blocks: 10, utilization: 10 / 96, mirror });

test("a healthy mirror raises no alert and says logical slots", () => {
  const s = stats({ cached_blocks: 10, overflow: 0, source: { state: "live", lost_batches: 0, error_count: 0, errors: {} } });
  assert.deepEqual(mirrorAlerts(s), []);
  const html = numbersHtml(s, 0);
  assert.match(html, /logical slots/);
  assert.match(html, /no bad input/);
  assert.doesNotMatch(html, /engine KV usage/); // no metrics URL: no engine cells
  assert.doesNotMatch(html, /copies/);
  assert.match(numbersHtml(stats({ cached_blocks: 10, copies: 12, source: {} }), 0), /12 copies on 96 logical slots/);
});

test("lost events, bad input and overflow each raise their alert with the numbers", () => {
  const s = stats({ cached_blocks: 10, overflow: 3, source: { state: "live", lost_batches: 5, error_count: 3, errors: { frames: 2, malformed: 1, replay: 0 }, last_error: "message of 2 frames" } });
  const a = mirrorAlerts(s);
  assert.deepEqual(a.map((x) => x.code), ["mirror-lost", "mirror-errors", "mirror-overflow"]);
  assert.match(a[0].message, /^5 event batches were lost/);
  assert.match(a[1].message, /2 frames, 1 malformed\); latest: message of 2 frames/);
  assert.equal(errorSummary({ a_b: 0 }), "none");
  const metricsDown = mirrorAlerts(stats({ source: { engine: { errors: 2, failing: true, last_error: "could not read http://gpu:8000/metrics: refused" } } }));
  assert.deepEqual(metricsDown.map((x) => x.code), ["mirror-metrics"]);
  assert.match(metricsDown[0].message, /2 times; latest: could not read http:\/\/gpu:8000/);
  assert.deepEqual(mirrorAlerts(stats({ source: { engine: { errors: 2, failing: false } } })), []); // recovered
  const html = mirrorNumbersHtml(s);
  assert.match(html, /class="num hot"><label>lost events<\/label><b>5<\/b>/);
});

test("engine metrics and the forest show when present", () => {
  const s = stats({ cached_blocks: 10, source: { state: "live", engine: { latest: { kv_usage: 0.25, hit_ratio: 0.4, num_gpu_blocks: 96 } } } });
  const forest = { trees: 2, roots: 1, orphans: 1, max_depth: 5, mean_depth: 2.5, top_prefixes: [{ hash: "00000000000000ab", depth: 2, children: 2, descendants: 5, tokens: 32 }] };
  const html = mirrorNumbersHtml(s, forest);
  assert.match(html, /engine KV usage<\/label><b>25(\.0)?%/);
  assert.match(html, /engine hit ratio<\/label><b>40(\.0)?%/);
  assert.match(html, /5 below/);
  assert.match(html, /32 tokens/);
});

test("prefix-cache events read in the log; other kinds are left to the default", () => {
  assert.deepEqual(describePrefixEvent({ type: "stored", block_hashes: [255, 2], block_size: 16, parent_block_hash: null }), ["2 blocks 00000000…", "32 tokens", "new root"]);
  assert.equal(describeEvent({ type: "removed", block_hashes: [1], reason: "engine" })[2], "engine");
  assert.equal(describePrefixEvent({ type: "put" }), null);
  assert.match(describeMirror({ num_blocks: 96, source: { endpoint: "tcp://h:5557", topic: "kv" } }), /mirror of tcp:\/\/h:5557 \(topic kv\) · 96 logical slots/);
});

test("a mirror's chart reads the engine's hit ratio and its removed blocks as evictions", async () => {
  const { PoolModel, hitRateOf } = await import("../model.js");
  assert.equal(hitRateOf({ mirror: { source: { engine: { latest: { hit_ratio: 0.3 } } } } }), 0.3);
  assert.equal(hitRateOf({ mirror: { source: {} } }), null);
  const m = new PoolModel();
  const s = (removed, t) => ({ type: "stats", stats: { strategy: "mirror", utilization: 0.5, mirror: { removed_blocks: removed, source: {} } }, t });
  m.applyMessage(s(10));
  await new Promise((r) => setTimeout(r, 30));
  m.applyMessage(s(40));
  assert.ok(m.evictionsPerSec() > 100, `removed blocks/s ${m.evictionsPerSec()}`);
});
