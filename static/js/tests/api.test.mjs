import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, pool, pools } from "../api.js";

/** Record each request and answer with `reply(method, url)`: [status, body]. */
function fakeFetch(reply) {
  const calls = [];
  globalThis.window = { sessionStorage: { getItem: () => null } };
  globalThis.fetch = async (url, init) => {
    calls.push([init.method, url, init.body === undefined ? undefined : JSON.parse(init.body)]);
    const [status, body] = reply(init.method, url);
    return { status, ok: status < 400, statusText: "", text: async () => (body === undefined ? "" : JSON.stringify(body)) };
  };
  return calls;
}

test("the typed client builds every URL of a pool, escaping names, ids and keys", async () => {
  const calls = fakeFetch((method) => (method === "DELETE" ? [204] : [200, { ok: true }]));
  const p = pool("a b");
  await p.allocate({ bytes: 10 });
  await p.extend(7, { tokens: 2 });
  await p.free(7);
  await p.put("k/1", { bytes: 4, pinned: true });
  await p.evict("k/1");
  await p.batch([{ op: "allocate", bytes: 1 }]);
  await p.setPolicy("lfu");
  await p.startWorkload({ kind: "trace" });
  await p.events({ after: 3, limit: 9 });
  await pools.create({ name: "x" });
  assert.deepEqual(calls, [
    ["POST", "/api/pools/a%20b/allocations", { bytes: 10 }],
    ["POST", "/api/pools/a%20b/allocations/7/extend", { tokens: 2 }],
    ["DELETE", "/api/pools/a%20b/allocations/7", undefined],
    ["PUT", "/api/pools/a%20b/entries/k%2F1", { bytes: 4, pinned: true }],
    ["POST", "/api/pools/a%20b/entries/k%2F1/evict", undefined],
    ["POST", "/api/pools/a%20b/ops", { ops: [{ op: "allocate", bytes: 1 }], stop_on_error: false }],
    ["PUT", "/api/pools/a%20b/cache/policy", { policy: "lfu" }],
    ["POST", "/api/pools/a%20b/workload", { kind: "trace" }],
    ["GET", "/api/pools/a%20b/events?after=3&limit=9", undefined],
    ["POST", "/api/pools", { name: "x" }],
  ]);
});

test("the server's error body becomes an ApiError with its code", async () => {
  fakeFetch(() => [409, { error: { code: "conflict", message: "pinned", details: { key: "k" } } }]);
  await assert.rejects(pool("p").evict("k"), (err) => err instanceof ApiError && err.status === 409 && err.code === "conflict" && err.details.key === "k");
});

test("a recording file is uploaded as its bytes (octet-stream), the series URL carries its range", async () => {
  const seen = [];
  globalThis.window = { sessionStorage: { getItem: () => "tok" } };
  globalThis.fetch = async (url, init) => {
    seen.push({ url, method: init.method, headers: init.headers, body: init.body });
    return { status: 201, ok: true, statusText: "", text: async () => JSON.stringify({ name: "rec-upload-x" }) };
  };
  const { recordings } = await import("../api.js");
  const file = new Blob([new Uint8Array([83, 81, 76])]);
  assert.deepEqual(await recordings.upload(file), { name: "rec-upload-x" });
  await pool("p").historySeries(3, 90, 300);
  assert.equal(seen[0].url, "/api/recordings/upload");
  assert.equal(seen[0].method, "POST");
  assert.equal(seen[0].headers["Content-Type"], "application/octet-stream");
  assert.equal(seen[0].headers.Authorization, "Bearer tok");
  assert.equal(seen[0].body, file); // the bytes themselves, not JSON
  assert.equal(seen[1].url, "/api/pools/p/history/series?from_seq=3&to_seq=90&points=300");
});
