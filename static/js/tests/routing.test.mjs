import assert from "node:assert/strict";
import { test } from "node:test";

import { boundsLine, decisionLines, describeRun, fleetHref, resultTable, routingBody, runOptions, runToShow, sideColumns } from "../routing-model.js";

const row = { policy: "dynamo_kv", hit_ratio: 0.12345, imbalance: 1.0234, duplicated_blocks: 1534,
  of_pooled_bound: 0.3349, available_hit_ratio: 0.2, ttft_p50_s: 0.5, ttft_p99_s: 4.25, throughput_rps: 3.391 };

test("the form's values become the POST body, capacities with separators included", () => {
  assert.deepEqual(
    routingBody({ policies: ["round_robin"], replicas: "8", capacity: "1,000 000", limit: "300", mode: "serving" }),
    { action: "start", policies: ["round_robin"], replicas: 8, capacity_tokens: 1000000, limit: 300, mode: "serving" },
  );
});

test("sequence runs show hit ratio, its share of the pooled bound, imbalance and duplicates; serving adds TTFT", () => {
  const seq = resultTable({ mode: "sequence", results: [row] });
  assert.deepEqual(seq.headers, ["Policy", "Hit ratio", "Of pooled bound", "Imbalance", "Duplicated blocks"]);
  assert.deepEqual(seq.rows, [["dynamo_kv", "12.3%", "33%", "1.02", "1,534"]]);
  const srv = resultTable({ mode: "serving", results: [row] });
  assert.deepEqual(srv.rows[0].slice(5), ["20.0%", "0.50", "4.25", "3.39"]);
  // a bound of 0 (nothing could be hit) has no share
  assert.equal(resultTable({ mode: "sequence", results: [{ ...row, of_pooled_bound: null }] }).rows[0][2], "—");
});

test("the bounds line names both limits of the run's N and C, and only when there are bounds", () => {
  const bounds = { pooled_bound_hit_ratio: 0.37264, pooled_bound_blocks: 7812, infinite_bound_hit_ratio: 0.37363 };
  const run = { mode: "sequence", replicas: 4, capacity_tokens: 1000000, results: [], bounds };
  assert.equal(boundsLine(run),
    "No routing of these requests over 4 replicas of 1,000,000 tokens can hit more than 37.3% " +
    "(pooled bound: Bélády's MIN on one cache of all 7,812 blocks) or 37.4% (infinite cache).");
  assert.equal(boundsLine({ ...run, bounds: null }), "");
  assert.equal(boundsLine({ ...run, mode: "live" }), "");
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

test("a live comparison sends the first two ticked policies instead of one", () => {
  assert.deepEqual(
    routingBody({ policies: ["round_robin", "longest_prefix", "session"], replicas: "2", capacity: "400,000",
      limit: "50", mode: "live", speed: "20", compare: true }),
    { action: "start", mode: "live", compare: ["round_robin", "longest_prefix"], replicas: 2,
      capacity_tokens: 400000, limit: 50, speed: 20 },
  );
  // a sequence run ignores the box: it compares every ticked policy already
  assert.equal(routingBody({ policies: ["session"], replicas: "1", capacity: "512", limit: "1", mode: "sequence",
    compare: true }).compare, undefined);
});

test("a live comparison shows two columns, each with its figures and its own fleet", () => {
  const side = (label, policy, hit, fleet) => ({ label, policy, requests: 10, hit_ratio: hit, fleet,
    replica_figures: [{ replica: 0, requests: 10, hit_ratio: hit, cached_blocks: 7, num_blocks: 100, refused: 0 }],
    decisions: [{ request: 9, replica: 0, policy, rule: "next in turn", matches: [1], loads: [10] }] });
  const run = { id: "r4", mode: "live", compare: true, state: "running", policy: null, done: 10, total: 40,
    hit_ratio: null, fleet: null, error: null, results: [], decisions: [], replica_figures: [],
    sides: [side("a", "round_robin", 0.25, "route-r4-a"), side("b", "longest_prefix", 0.5, "route-r4-b")] };
  assert.equal(describeRun(run).text,
    "live, round_robin vs longest_prefix: 10 / 40 requests, hit 25.0% (round_robin) vs 50.0% (longest_prefix)");
  const cols = sideColumns(run);
  assert.deepEqual(cols.map((c) => [c.title, c.fleet, c.hit]), [
    ["a: round_robin", "/?fleet=route-r4-a#fleet", "hit 25.0% over 10 requests"],
    ["b: longest_prefix", "/?fleet=route-r4-b#fleet", "hit 50.0% over 10 requests"],
  ]);
  assert.deepEqual(cols[1].table.rows, [["r0", "10", "50.0%", "7 / 100", "0"]]);
  assert.deepEqual(cols[0].decisions,
    ["request 9 → replica 0 [round_robin]: next in turn (cached blocks [1], in flight [10])"]);
  // released: no fleet links; a single-policy run has no columns
  const released = { ...run, sides: run.sides.map((s) => ({ ...s, fleet: null })) };
  assert.deepEqual(sideColumns(released).map((c) => c.fleet), [null, null]);
  assert.deepEqual(sideColumns({ ...run, compare: false }), []);
  assert.equal(fleetHref(run), null);
});

test("the decision explorer's query leaves empty filters out and refuses what is not a whole number", async () => {
  const { decisionsQuery } = await import("../routing-model.js");
  assert.equal(decisionsQuery({ policy: "dynamo_kv", rule: "", replica: " 2 ", request: "", offset: 100 }),
    "policy=dynamo_kv&replica=2&offset=100&limit=50");
  assert.equal(decisionsQuery({}), "offset=0&limit=50");
  assert.throws(() => decisionsQuery({ replica: "-1" }), /replica must be a whole number/);
  assert.throws(() => decisionsQuery({ request: "1.5" }), /request must be a whole number/);
});

test("an explorer page says where it is and whether there is more; a decision lists its candidates", async () => {
  const { candidateTable, decisionPolicies, decisionTable } = await import("../routing-model.js");
  const d = { request: 41, policy: "dynamo_kv", replica: 1, rule: "score", why: "lowest cost",
    best_matched_blocks: 6, captured_tokens: 3072, available_tokens: 3072,
    candidates: [{ replica: 0, matched_blocks: 6, load: 3, score: 12.25 }, { replica: 1, matched_blocks: 6, load: 1, score: 10.5 },
      { replica: 2, matched_blocks: 0, load: 0, score: null }] };
  const t = decisionTable({ total: 120, offset: 50, decisions: [d] });
  assert.deepEqual(t.rows, [["41", "1", "score", "lowest cost", "6", "3,072", "3,072"]]);
  assert.equal(t.where, "51–51 of 120 decisions");
  assert.equal(t.prev, 0);
  assert.equal(t.next, 100);
  assert.equal(decisionTable({ total: 0, offset: 0, decisions: [] }).next, null);
  const c = candidateTable(d);
  assert.equal(c.title, "request 41 → replica 1 (dynamo_kv: score)");
  assert.deepEqual(c.rows.map((r) => r[4]), ["held the most", "chosen", ""]);
  assert.equal(c.rows[2][3], "—");
  assert.deepEqual(decisionPolicies({ mode: "sequence", results: [{ policy: "a" }], current: "b" }), ["a", "b"]);
  assert.deepEqual(decisionPolicies({ mode: "live", sides: [{ label: "a", policy: "x" }, { label: "b", policy: "y" }] }), ["a", "b"]);
});

test("a router run: its body, its engines while it goes, its row when done, its fleet", () => {
  assert.deepEqual(
    routingBody({ policies: ["round_robin"], replicas: "2", capacity: "300,000", limit: "150", mode: "router", router: "vllm", speed: "" }),
    { action: "start", mode: "router", router: "vllm", replicas: 2, capacity_tokens: 300000, limit: 150 },
  );
  assert.equal(routingBody({ policies: [], replicas: "2", capacity: "1", limit: "1", mode: "router", router: "sglang", speed: "20" }).speed, 20);
  const engines = [{ name: "e-0", requests: 1234, completed: 1200, hit_ratio: 0.25, cached_blocks: 1500 }];
  const going = { mode: "router", router: "sglang", state: "running", replicas: 1, done: 300, total: 600,
    hit_ratio: 0.25, results: [], replica_figures: engines, fleet: "route-r1", error: null };
  assert.deepEqual(resultTable(going), {
    headers: ["Engine", "Requests", "Completed", "Hit ratio (its counters)", "Cached blocks"],
    rows: [["e-0", "1,234", "1,200", "25.0%", "1,500"]],
  });
  assert.deepEqual(describeRun(going),
    { frac: 0.5, text: "the real sglang router over 1 simulated engines: 300 / 600 requests, hit 25.0% (engines' counters)", state: "running" });
  // the demo's run has no end: no total, the bar full
  assert.equal(describeRun({ ...going, total: null }).frac, 1);
  assert.match(describeRun({ ...going, total: null }).text, /300 requests sent/);
  assert.equal(fleetHref(going), "/?fleet=route-r1#fleet");
  const done = { ...going, state: "finished", results: [{ ...row, policy: "router:sglang", engine_hit_ratio: 0.1229, available_hit_ratio: null }] };
  const t = resultTable(done);
  assert.deepEqual(t.headers.slice(0, 4), ["Router", "Hit ratio (decisions)", "Engines' counters", "Available hit"]);
  assert.deepEqual(t.rows[0].slice(0, 5), ["router:sglang", "12.3%", "12.3%", "—", "33%"]);
});

test("the runs list: newest first, and the view opens on the newest running run, if any", () => {
  const runs = [
    { id: "r1", mode: "sequence", policies: ["a", "b"], state: "finished" },
    { id: "r2", mode: "router", router: "sglang", policies: ["router:sglang"], state: "running" },
    { id: "r3", mode: "live", policies: ["a", "b"], state: "stopped" },
  ];
  assert.deepEqual(runOptions(runs).map((o) => o.label),
    ["r3: live a vs b (stopped)", "r2: router sglang (running)", "r1: sequence, 2 policies (finished)"]);
  assert.equal(runToShow(runs).id, "r2");
  assert.equal(runToShow(runs.filter((r) => r.state !== "running")), null);
  assert.equal(runToShow([]), null);
});
