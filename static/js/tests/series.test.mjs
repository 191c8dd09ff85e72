import assert from "node:assert/strict";
import { test } from "node:test";

import { HISTORY_SERIES } from "../model.js";
import { createSeriesLoader, isRecording, seriesColumns, seriesRange } from "../series.js";

/** A series answer with these per-point values (the rest zero). */
function body(points) {
  const names = ["seq", "ts", "utilization", "internal_fragmentation", "external_fragmentation",
    "ooms_capacity", "ooms_fragmentation", "evictions", "hits", "misses"];
  const columns = Object.fromEntries(names.map((n) => [n, points.map((p) => (n in p ? p[n] : 0))]));
  return { from_seq: points[0].seq, to_seq: points[points.length - 1].seq, columns };
}

test("seriesColumns gives the chart columns, drops untimed points, rates evictions over time", () => {
  const cols = seriesColumns(body([
    { seq: 0, ts: null, utilization: 0, hits: 0 },
    { seq: 5, ts: 100, utilization: 0.25, internal_fragmentation: 0.1, evictions: 3, misses: 1 },
    { seq: 10, ts: 102, utilization: 0.5, external_fragmentation: 0.4, evictions: 4, hits: 3, ooms_fragmentation: 1 },
    { seq: 15, ts: 102, utilization: 0.75, evictions: 2, hits: 0, misses: 0, ooms_capacity: 2 },
  ]));
  assert.equal(cols.length, HISTORY_SERIES.length);
  const col = (name) => cols[HISTORY_SERIES.indexOf(name)];
  assert.deepEqual(col("t"), [100, 102, 102]);
  assert.deepEqual(col("utilization"), [0.25, 0.5, 0.75]);
  assert.deepEqual(col("internal"), [0.1, 0, 0]);
  assert.deepEqual(col("external"), [0, 0.4, 0]);
  // first timed point has no interval before it; equal times give no rate rather than infinity
  assert.deepEqual(col("evictionsPerSec"), [null, 2, null]);
  // hits over lookups from the first point on
  assert.deepEqual(col("hitRate"), [0, 0.75, 0.75]);
  assert.deepEqual(col("oomCapacity"), [0, 0, 2]);
  assert.deepEqual(col("oomFragmentation"), [0, 1, 0]);
});

test("the cache's lifetime hit rate wins where the history holds it", () => {
  const b = body([
    { seq: 1, ts: 100, hits: 1, misses: 1 },
    { seq: 2, ts: 101, hits: 1 },
    { seq: 3, ts: 102, misses: 1 },
  ]);
  b.columns.cache_hit_rate = [null, 0.9, 0.8];  // no cache keyframe yet at the first point
  const cols = seriesColumns(b);
  assert.deepEqual(cols[HISTORY_SERIES.indexOf("hitRate")], [0.5, 0.9, 0.8]);
});

test("seriesRange: a recording is shown whole, a live pool up to the chosen moment, live none", () => {
  assert.deepEqual(seriesRange({ mode: "live", seq: 0, first: 3, last: 90 }, true), { from: 3, to: 90 });
  assert.deepEqual(seriesRange({ mode: "past", seq: 40, first: 3, last: 90 }, true), { from: 3, to: 90 });
  assert.deepEqual(seriesRange({ mode: "past", seq: 40, first: 3, last: 90 }, false), { from: 3, to: 40 });
  assert.equal(seriesRange({ mode: "live", seq: 40, first: 3, last: 90 }, false), null);
  assert.equal(seriesRange({ mode: "past", seq: 0, first: 0, last: 0 }, false), null); // no history yet
  assert.equal(seriesRange(null, true), null);
  assert.equal(isRecording({ device: "recording" }), true);
  assert.equal(isRecording({ device: "cpu" }), false);
  assert.equal(isRecording(null), false);
});

/** A fetch whose answers the test releases by hand. */
function manualFetch() {
  const calls = [];
  const fetchSeries = (r) => new Promise((resolve, reject) => calls.push({ r, resolve, reject }));
  return { calls, fetchSeries };
}
const tick = () => new Promise((r) => setTimeout(r, 0));
const one = (seq) => body([{ seq, ts: seq, utilization: seq / 100 }]);

test("the loader keeps one request in flight, fetches the newest stretch next, drops stale answers", async () => {
  const { calls, fetchSeries } = manualFetch();
  const shown = [];
  const loader = createSeriesLoader(fetchSeries, (cols, r) => shown.push(r && r.to), { minIntervalMs: 0 });
  loader.want({ from: 0, to: 10 });
  loader.want({ from: 0, to: 20 });
  loader.want({ from: 0, to: 30 });
  assert.equal(calls.length, 1); // the others wait for it
  calls[0].resolve(one(10)); // answers a stretch nobody wants any more: dropped
  await tick();
  assert.deepEqual(shown, []);
  assert.equal(calls.length, 2);
  assert.deepEqual(calls[1].r, { from: 0, to: 30 }); // straight to the newest
  calls[1].resolve(one(30));
  await tick();
  assert.deepEqual(shown, [30]);
  assert.equal(loader.shown(), "0..30");
  loader.want({ from: 0, to: 30 }); // already shown: no request
  await tick();
  assert.equal(calls.length, 2);
});

test("want(null) returns to the live samples at once, even with a request in flight", async () => {
  const { calls, fetchSeries } = manualFetch();
  const shown = [];
  const loader = createSeriesLoader(fetchSeries, (cols) => shown.push(cols ? cols[1].length : "live"), { minIntervalMs: 0 });
  loader.want({ from: 0, to: 5 });
  calls[0].resolve(one(5));
  await tick();
  loader.want({ from: 0, to: 8 });
  loader.want(null);
  assert.deepEqual(shown, [1, "live"]);
  calls[1].resolve(one(8)); // too late: live stays
  await tick();
  assert.deepEqual(shown, [1, "live"]);
  assert.equal(loader.shown(), "");
});

test("a failed stretch is reported once and not retried until another was wanted", async () => {
  const { calls, fetchSeries } = manualFetch();
  const errors = [];
  const loader = createSeriesLoader(fetchSeries, () => {}, { minIntervalMs: 0, onError: (e) => errors.push(e.message) });
  loader.want({ from: 0, to: 5 });
  calls[0].reject(new Error("boom"));
  await tick();
  loader.want({ from: 0, to: 5 });
  await tick();
  assert.equal(calls.length, 1);
  assert.deepEqual(errors, ["boom"]);
  loader.want({ from: 0, to: 6 });
  loader.want({ from: 0, to: 5 });
  await tick();
  assert.equal(calls.length, 2);
});

test("requests are spaced by the minimum interval while the stretch keeps moving", async () => {
  const { calls, fetchSeries } = manualFetch();
  const loader = createSeriesLoader(fetchSeries, () => {}, { minIntervalMs: 40 });
  loader.want({ from: 0, to: 1 });
  calls[0].resolve(one(1));
  await tick();
  loader.want({ from: 0, to: 2 });
  await tick();
  assert.equal(calls.length, 1); // too soon after the first
  const t0 = Date.now();
  while (calls.length < 2 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 5));
  assert.equal(calls.length, 2); // sent once the interval passed, without another want()
  loader.stop();
});
