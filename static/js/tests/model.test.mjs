import assert from "node:assert/strict";
import { test } from "node:test";

import { decodeFrame, encodeFrame } from "../frames.js";
import { BACKFILL_LIMIT, EVENT_CAPACITY, HistoryRing, MAX_DIRTY_RANGES, PoolModel, computeAlerts, describeWorkload, filterEvents, parseSize } from "../model.js";

const hello = (n) => ({ type: "hello", protocol: 1, pool: { name: "p", strategy: "paged", num_blocks: n, block_bytes: 4096 }, states: {}, last_event_seq: 0 });

function snapshot(owner, state) {
  return decodeFrame(encodeFrame({ kind: 1, frame: 0, blocks: owner.length, runs: [{ start: 0, owner, state }] }));
}

test("a snapshot replaces the whole map and marks everything dirty", () => {
  const m = new PoolModel();
  m.applyHello(hello(6));
  m.takeDirty();
  m.applyFrame(snapshot([1, 1, -1, 2, 2, 2], [1, 1, 0, 2, 2, 3]));
  assert.deepEqual(Array.from(m.owner), [1, 1, -1, 2, 2, 2]);
  assert.deepEqual(m.countStates(), [1, 2, 2, 1]);
  assert.equal(m.takeDirty(), "all");
  assert.equal(m.takeDirty(), null);
});

test("a delta patches only its runs and reports merged dirty ranges", () => {
  const m = new PoolModel();
  m.applyHello(hello(300));
  m.applyFrame(snapshot(new Array(300).fill(-1), new Array(300).fill(0)));
  m.takeDirty();
  const delta = encodeFrame({
    kind: 2, frame: 1, blocks: 300,
    runs: [
      { start: 128, owner: [9, 9], state: [1, 1] },
      { start: 0, owner: [4, 4, 4], state: [2, 2, 2] },
      { start: 129, owner: [9, 9, 9], state: [3, 1, 1] },
    ],
  });
  m.applyFrame(decodeFrame(delta));
  assert.equal(m.lastFrame, 1);
  assert.deepEqual(Array.from(m.owner.slice(0, 4)), [4, 4, 4, -1]);
  assert.deepEqual(Array.from(m.state.slice(128, 133)), [1, 3, 1, 1, 0]);
  assert.deepEqual(m.takeDirty(), [[0, 3], [128, 132]]);
  assert.deepEqual(m.countStates(), [300 - 7, 3, 3, 1]);
});

test("a snapshot of another size resizes the map", () => {
  const m = new PoolModel();
  m.applyHello(hello(4));
  m.applyFrame(snapshot([1, 2, 3, 4, 5, 6, 7, 8], new Array(8).fill(1)));
  assert.equal(m.blocks, 8);
  assert.equal(m.owner.length, 8);
});

test("too many dirty ranges collapse into their union", () => {
  const m = new PoolModel();
  m.applyHello(hello(10_000));
  m.takeDirty();
  for (let i = 0; i < MAX_DIRTY_RANGES + 10; i++) m.markDirty(i * 10 + 5, i * 10 + 6);
  const d = m.takeDirty();
  assert.ok(d.length <= MAX_DIRTY_RANGES);
  assert.equal(d[0][0], 5);
  assert.equal(d[d.length - 1][1], (MAX_DIRTY_RANGES + 9) * 10 + 6);
});

const stats = (over = {}) => ({
  strategy: "contiguous", total_blocks: 100, used_blocks: 50, free_blocks: 50, utilization: 0.5,
  internal_fragmentation: 0.1, external_fragmentation: 0.2, largest_free_bytes: 4096, free_bytes: 8192,
  ooms: { capacity: 0, fragmentation: 0 }, ...over,
});

test("no alerts on a healthy pool", () => {
  assert.deepEqual(computeAlerts(stats(), null), []);
});

test("utilization thresholds warn, then go critical", () => {
  assert.deepEqual(computeAlerts(stats({ utilization: 0.92 }), null).map((a) => [a.code, a.level]), [["utilization", "warn"]]);
  assert.deepEqual(computeAlerts(stats({ utilization: 0.99 }), null).map((a) => [a.code, a.level]), [["utilization", "critical"]]);
});

test("external fragmentation warns where scattered free space can fail a request, not where it cannot", () => {
  assert.equal(computeAlerts(stats({ external_fragmentation: 0.7 }), null)[0].code, "fragmentation");
  assert.deepEqual(computeAlerts(stats({ external_fragmentation: 0.7, strategy: "paged", scatter_fails: false }), null), []);
});

test("an OOM with cause fragmentation raises the banner until a defragment", () => {
  const m = new PoolModel();
  m.applyHello(hello(10));
  m.applyEvents([{ seq: 1, ts: 1, type: "oom", cause: "capacity", requested_bytes: 10, free_bytes: 0, largest_free_bytes: 0 }]);
  assert.deepEqual(m.alerts().map((a) => a.code), []);
  m.applyEvents([{ seq: 2, ts: 2, type: "oom", cause: "fragmentation", requested_bytes: 8192, free_bytes: 16384, largest_free_bytes: 4096 }]);
  const a = m.alerts();
  assert.equal(a[0].code, "oom-fragmentation");
  assert.match(a[0].message, /OOM with memory free/);
  assert.match(a[0].message, /16\.0 KiB was free/);
  m.applyEvents([{ seq: 3, ts: 3, type: "defragment", moved_blocks: 2, moved_bytes: 8192, seconds: 0.001 }]);
  assert.deepEqual(m.alerts().map((x) => x.code), []);
});

test("a rising fragmentation OOM counter raises the banner even if the event was missed", () => {
  const m = new PoolModel();
  m.applyStats(stats(), 1);
  m.applyStats(stats({ ooms: { capacity: 0, fragmentation: 2 } }), 2);
  assert.equal(m.alerts()[0].code, "oom-fragmentation");
  m.applyEvents([{ seq: 9, ts: 3, type: "reset", freed: 3 }]);
  assert.equal(m.alerts().length, 0);
});

test("events are kept newest first, bounded, and filterable by type", () => {
  const m = new PoolModel();
  m.applyEvents([
    { seq: 1, ts: 1, type: "allocate", id: 1 },
    { seq: 2, ts: 1, type: "evict", key: "a", bytes: 10, reason: "capacity", policy: "lru" },
  ]);
  m.applyEvents([{ seq: 3, ts: 2, type: "oom", cause: "capacity" }]);
  assert.deepEqual(m.events.map((e) => e.seq), [3, 2, 1]);
  assert.deepEqual(filterEvents(m.events, ["evict", "oom"]).map((e) => e.seq), [3, 2]);
  assert.deepEqual(filterEvents(m.events, new Set(["allocate"])).map((e) => e.seq), [1]);
  assert.equal(filterEvents(m.events, null).length, 3);
  assert.equal(filterEvents(m.events, []).length, 3);
  const many = Array.from({ length: EVENT_CAPACITY + 50 }, (_, i) => ({ seq: 10 + i, ts: 3, type: "free", id: i }));
  m.applyEvents(many);
  assert.equal(m.events.length, EVENT_CAPACITY);
  assert.equal(m.events[0].seq, 10 + EVENT_CAPACITY + 49);
});

test("stats history derives evictions per second and hit rate", () => {
  const m = new PoolModel();
  m.applyStats(stats({ cache: { hits: 3, misses: 1, evictions: { capacity: 4, oom: 1 } } }), 10);
  m.applyStats(stats({ cache: { hits: 6, misses: 2, evictions: { capacity: 14, oom: 1 } } }), 12);
  assert.equal(m.evictionsPerSec(), 5);
  const cols = m.history.toArrays();
  assert.deepEqual(cols[0], [10, 12]);
  assert.deepEqual(cols[5], [0.75, 0.75]);
  assert.equal(cols[4][0], null); // no rate before two samples
});

test("the history ring keeps the newest samples in order", () => {
  const r = new HistoryRing(3, ["t", "v"]);
  for (let i = 1; i <= 5; i++) r.push([i, i * 10]);
  assert.deepEqual(r.toArrays(), [[3, 4, 5], [30, 40, 50]]);
});

test("the order message ranks allocations for the heat mode", () => {
  const m = new PoolModel();
  m.applyOrder({ type: "order", ids: [17, 4, 9], keys: ["a", "b", "c"], truncated: false });
  assert.equal(m.orderRank.get(17), 0);
  assert.equal(m.orderRank.get(9), 2);
  assert.equal(m.keyById.get(4), "b");
});

test("sizes parse with units and tokens", () => {
  assert.deepEqual(parseSize("4096"), { bytes: 4096 });
  assert.deepEqual(parseSize("64 KiB"), { bytes: 65536 });
  assert.deepEqual(parseSize("1.5MiB"), { bytes: 1572864 });
  assert.deepEqual(parseSize("200 tok"), { tokens: 200 });
  assert.equal(parseSize("-3"), null);
  assert.equal(parseSize("lots"), null);
  assert.equal(parseSize("0"), null);
});

test("hit rate is unknown before the first lookup", async () => {
  const { hitRateOf } = await import("../model.js");
  assert.equal(hitRateOf({ cache: { hits: 0, misses: 0, hit_rate: 0 } }), null);
  assert.equal(hitRateOf({ cache: { hits: 3, misses: 1, hit_rate: 0.75 } }), 0.75);
  assert.equal(hitRateOf({}), null);
});

test("creation times of allocations are learnt from events and forgotten on free", () => {
  const m = new PoolModel();
  m.applyEvents([{ seq: 1, ts: 100, type: "allocate", id: 5 }, { seq: 2, ts: 101, type: "put", id: 6, key: "k" }]);
  assert.equal(m.createdAt.get(5), 100);
  assert.equal(m.keyById.get(6), "k");
  m.applyEvents([{ seq: 3, ts: 102, type: "free", id: 5 }]);
  assert.equal(m.createdAt.has(5), false);
});

test("a batch the server shortened gets a 'skipped' row that every filter keeps", () => {
  const m = new PoolModel();
  m.applyEvents([{ seq: 41, ts: 5, type: "free", id: 1 }, { seq: 42, ts: 5, type: "evict", key: "x" }], 30);
  assert.deepEqual(m.events.map((e) => [e.type, e.count]), [["evict", undefined], ["free", undefined], ["skipped", 30]]);
  assert.deepEqual(filterEvents(m.events, ["evict"]).map((e) => e.type), ["evict", "skipped"]);
  assert.equal(m.lastSeq, 42);
});

test("a resync asks for the dropped events and the backfill slots them under newer live ones", () => {
  const m = new PoolModel();
  m.applyHello({ ...hello(4), last_event_seq: 10 });
  m.applyEvents([{ seq: 11, ts: 1, type: "allocate", id: 1 }]);
  const gap = m.gapUpTo(20);
  assert.deepEqual(gap, { after: 11, upto: 20, limit: BACKFILL_LIMIT, skipped: 0 });
  // a live batch arrives before the fetch returns
  m.applyEvents([{ seq: 21, ts: 3, type: "evict", key: "k" }]);
  const page = Array.from({ length: 10 }, (_, i) => ({ seq: 12 + i, ts: 2, type: i === 0 ? "free" : "hit", id: 1, key: "k" }));
  m.applyBackfill(gap, { events: page, last_seq: 21 }); // 21 is already held
  assert.deepEqual(m.events.map((e) => e.seq), [21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11]);
  assert.equal(m.isGone(1), true);
  assert.equal(m.lastSeq, 21);
  assert.equal(m.gapUpTo(21), null);
});

test("a gap wider than one page fetches its newest events and counts the rest as skipped", () => {
  const m = new PoolModel();
  m.applyHello({ ...hello(4), last_event_seq: 5 });
  const gap = m.gapUpTo(5 + BACKFILL_LIMIT + 200);
  assert.equal(gap.after, 205);
  assert.equal(gap.skipped, 200);
  // the server's ring holds only the last 10 of what was asked for
  const page = Array.from({ length: 10 }, (_, i) => ({ seq: gap.upto - 9 + i, ts: 1, type: "hit", key: "k" }));
  m.applyBackfill(gap, page);
  assert.equal(m.events.length, 11);
  const marker = m.events[10];
  assert.equal(marker.type, "skipped");
  assert.equal(marker.count, BACKFILL_LIMIT + 200 - 10);
});

test("a backfilled older OOM does not raise the banner over a newer defragment", () => {
  const m = new PoolModel();
  m.applyHello({ ...hello(4), last_event_seq: 1 });
  const gap = m.gapUpTo(3);
  m.applyEvents([{ seq: 4, ts: 2, type: "defragment", moved_blocks: 1 }]);
  m.applyBackfill(gap, [{ seq: 2, ts: 1, type: "oom", cause: "fragmentation", requested_bytes: 1, free_bytes: 2, largest_free_bytes: 1 }]);
  assert.deepEqual(m.alerts(), []);
  assert.equal(m.events.some((e) => e.type === "oom"), true);
});

test("a restarted server's hello forgets old seqs and freed ids", () => {
  const m = new PoolModel();
  m.applyHello({ ...hello(4), last_event_seq: 100 });
  m.applyEvents([{ seq: 101, ts: 1, type: "free", id: 7 }]);
  assert.equal(m.isGone(7), true);
  m.applyHello({ ...hello(4), last_event_seq: 3 });
  assert.equal(m.isGone(7), false);
  assert.equal(m.lastSeq, 3);
  assert.equal(m.gapUpTo(3), null);
});

test("a cache pool full of evictable entries raises no utilization alert", async () => {
  const { pressureOf } = await import("../model.js");
  const full = stats({ utilization: 0.95, used_blocks: 95, free_blocks: 5, blocks_by_state: { free: 5, used: 3, cached: 90, pinned: 2 }, cache: { hits: 1, misses: 0 } });
  assert.equal(pressureOf(full), 0.05);
  assert.deepEqual(computeAlerts(full, null), []);
  const stuck = stats({ utilization: 0.95, blocks_by_state: { free: 5, used: 80, cached: 5, pinned: 10 }, cache: {} });
  assert.deepEqual(computeAlerts(stuck, null).map((a) => [a.code, a.level]), [["utilization", "warn"]]);
  assert.match(computeAlerts(stuck, null)[0].message, /cannot evict/);
});

test("applyMessage applies each stream message and names the events to backfill", () => {
  const m = new PoolModel();
  assert.equal(m.applyMessage(hello(4)), null); // a first hello: nothing was missed
  assert.equal(m.config.num_blocks, 4);
  m.applyMessage({ type: "events", events: [{ seq: 1, ts: 1, type: "allocate", id: 3 }, { seq: 2, ts: 1, type: "free", id: 3 }] });
  assert.equal(m.lastSeq, 2);
  m.applyMessage({ type: "progress", workload: { name: "chat", state: "running", done: 1, total: 9 } });
  assert.equal(m.workload.name, "chat");
  m.applyMessage({ type: "order", ids: [5], keys: ["k"], truncated: false });
  assert.equal(m.keyById.get(5), "k");
  assert.deepEqual(m.applyMessage({ type: "resync", last_event_seq: 7 }), { after: 2, upto: 7, limit: BACKFILL_LIMIT, skipped: 0 });
  assert.deepEqual(m.applyMessage({ ...hello(4), last_event_seq: 9 }), { after: 2, upto: 9, limit: BACKFILL_LIMIT, skipped: 0 });
  assert.equal(m.applyMessage({ type: "closed", reason: "pool deleted" }), null);
});

test("a failed workload reads as failed with its error, never finished", () => {
  assert.equal(describeWorkload(null), null);
  const running = describeWorkload({ name: "chat", state: "running", done: 50, total: 200 });
  assert.deepEqual(running, { text: "chat · running · 50/200", state: "running", failed: false, error: "", frac: 0.25 });
  const failed = describeWorkload({ name: "chat", state: "failed", done: 120, total: 400, error: "pool is out of memory" });
  assert.equal(failed.state, "failed");
  assert.equal(failed.failed, true);
  assert.equal(failed.error, "pool is out of memory");
  assert.equal(failed.text, "chat · failed at 120/400: pool is out of memory");
  assert.doesNotMatch(failed.text, /finished/);
  assert.equal(failed.frac, 0.3);
  // a failure without a message still says it failed
  const bare = describeWorkload({ name: "mix", state: "failed", done: 0, total: 0 });
  assert.equal(bare.text, "mix · failed at 0/?: unknown error");
  assert.equal(bare.frac, 0);
});

test("a hello from another server instance says restarted and drops the old history", () => {
  const m = new PoolModel();
  const from = (instance, seq) => ({ ...hello(4), instance_id: instance, last_event_seq: seq });
  m.applyMessage(from("aaaa", 0));
  assert.equal(m.restarted, false); // the first hello: nothing to compare with
  m.applyMessage({ type: "events", events: [{ seq: 1, ts: 1, type: "allocate", id: 3 }, { seq: 2, ts: 1, type: "put", id: 4, key: "k" }] });
  assert.equal(m.lastSeq, 2);
  m.applyMessage(from("aaaa", 2)); // a reconnect to the same process keeps the history
  assert.equal(m.restarted, false);
  assert.equal(m.events.length, 2);
  // the restarted server has seq 5 by now: more than we saw, so seq alone would not tell
  assert.equal(m.applyMessage(from("bbbb", 5)), null, "nothing of the old process is to be fetched");
  assert.equal(m.restarted, true);
  assert.deepEqual(m.events, []);
  assert.equal(m.lastSeq, 5);
  assert.equal(m.keyById.size, 0);
  m.applyMessage(from("bbbb", 5));
  assert.equal(m.restarted, false, "said once, for the hello that changed the instance");
});
