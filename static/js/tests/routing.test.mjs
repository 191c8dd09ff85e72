import assert from "node:assert/strict";
import { test } from "node:test";

import { decisionLines, describeRun, fleetHref, resultTable, routingBody } from "../routing-model.js";

const row = { policy: "dynamo_kv", hit_ratio: 0.12345, imbalance: 1.0234, duplicated_blocks: 1534,
  available_hit_ratio: 0.2, ttft_p50_s: 0.5, ttft_p99_s: 4.25, throughput_rps: 3.391 };

test("the form's values become the POST body, capacities with separators included", () => {
  assert.deepEqual(
    routingBody({ policies: ["round_robin"], replicas: "8", capacity: "1,000 000", limit: "300", mode: "serving" }),
    { action: "start", policies: ["round_robin"], replicas: 8, capacity_tokens: 1000000, limit: 300, mode: "serving" },
  );
});

test("sequence runs show hit ratio, imbalance and duplicates; serving adds TTFT", () => {
  const seq = resultTable({ mode: "sequence", results: [row] });
  assert.deepEqual(seq.headers, ["Policy", "Hit ratio", "Imbalance", "Duplicated blocks"]);
  assert.deepEqual(seq.rows, [["dynamo_kv", "12.3%", "1.02", "1,534"]]);
  const srv = resultTable({ mode: "serving", results: [row] });
  assert.deepEqual(srv.rows[0].slice(4), ["20.0%", "0.50", "4.25", "3.39"]);
});

test("progress says what runs and how far", () => {
  const base = { results: [row], total: 600, error: null, current: "dynamo_kv" };
  assert.deepEqual(describeRun({ ...base, state: "running", done: 150 }),
    { frac: 0.25, text: "routing dynamo_kv: 150 / 600 requests", state: "running" });
  assert.equal(describeRun({ ...base, state: "finished", done: 600 }).text, "finished: 1 policies over 600 requests");
  assert.equal(describeRun({ ...base, state: "failed", done: 0, error: "boom" }).text, "failed: boom");
  assert.equal(describeRun({ ...base, state: "stopped", done: 10, total: 0 }).frac, 0);
});

test("decisions read newest first with the rule, the matches and the loads", () => {
  const run = { decisions: [
    { request: 4, replica: 1, rule: "next in turn", matches: [0, 2], loads: [3, 4] },
    { request: 5, replica: 0, rule: "lowest cost 6.0", matches: [2, 0], loads: [3, 5] },
  ] };
  assert.deepEqual(decisionLines(run), [
    "request 5 → replica 0: lowest cost 6.0 (cached blocks [2, 0], in flight [3, 5])",
    "request 4 → replica 1: next in turn (cached blocks [0, 2], in flight [3, 4])",
  ]);
  assert.deepEqual(decisionLines({}), []);
});

test("a live start sends the first ticked policy and the speed", () => {
  assert.deepEqual(
    routingBody({ policies: ["dynamo_kv", "session"], replicas: "3", capacity: "400,000", limit: "50", mode: "live", speed: "20" }),
    { action: "start", mode: "live", policy: "dynamo_kv", replicas: 3, capacity_tokens: 400000, limit: 50, speed: 20 },
  );
});

test("a live run shows its replicas, its policy and a link to its fleet until released", () => {
  const run = { id: "r3", mode: "live", state: "running", policy: "session", done: 10, total: 40, hit_ratio: 0.25,
    fleet: "route-r3", error: null, results: [], decisions: [
      { request: 9, replica: 1, policy: "session", rule: "hash of the first block", matches: [0, 1], loads: [5, 5] }],
    replica_figures: [{ replica: 0, requests: 5, hit_ratio: 0.5, cached_blocks: 1200, num_blocks: 2000, refused: 0 }] };
  assert.deepEqual(resultTable(run), { headers: ["Replica", "Requests", "Hit ratio", "Cached blocks", "Refused"],
    rows: [["r0", "5", "50.0%", "1,200 / 2,000", "0"]] });
  assert.equal(describeRun(run).text, "live, session: 10 / 40 requests, hit 25.0%");
  assert.equal(fleetHref(run), "/?fleet=route-r3#fleet");
  assert.equal(fleetHref({ ...run, fleet: null }), null);
  assert.equal(fleetHref({ ...run, mode: "sequence" }), null);
  assert.deepEqual(decisionLines(run),
    ["request 9 → replica 1 [session]: hash of the first block (cached blocks [0, 1], in flight [5, 5])"]);
});
