// Prefix caching on the page: the `prefix` message, reference counts, hit ratio, log lines.
import { test } from "node:test";
import assert from "node:assert/strict";

import { CACHED, FREE, PoolModel, SHARED, USED, hitRateOf } from "../model.js";
import { describeEvent, selectedTypes, shortHash, FILTER_GROUPS } from "../panels.js";

test("a prefix message ranks cached blocks and sets reference counts of shared blocks", () => {
  const m = new PoolModel();
  m.applyMessage({ type: "hello", protocol: 1, pool: { name: "p", strategy: "paged", num_blocks: 8, block_bytes: 64, prefix_caching: { policy: "lru" } }, states: {}, last_event_seq: 0 });
  m.state.set([SHARED, SHARED, USED, CACHED, CACHED, FREE, FREE, FREE]);
  const before = m.orderVersion;
  m.applyMessage({ type: "prefix", order: [4, 3], truncated: false, shared: { blocks: [0, 1], refcounts: [3, 2] } });
  assert.equal(m.orderVersion, before + 1);
  assert.equal(m.blockRank.get(4), 0);
  assert.equal(m.blockRank.get(3), 1);
  assert.equal(m.orderLength, 2);
  assert.deepEqual([0, 1, 2, 3, 5].map((i) => m.refcountOf(i)), [3, 2, 1, 0, 0]);
  // a block that became shared after the last message still counts as at least 2
  m.state[2] = SHARED;
  assert.equal(m.refcountOf(2), 2);
});

test("hit rate of a prefix-caching pool is token-weighted hits over queries", () => {
  assert.equal(hitRateOf({ prefix: { queries: 0, hits: 0 } }), null);
  assert.equal(hitRateOf({ prefix: { queries: 200, hits: 150 } }), 0.75);
  assert.equal(hitRateOf({ prefix: { queries: 10, hits: 0 }, cache: { hits: 5, misses: 0 } }), 0);
});

test("log lines for stored, removed, open and close events", () => {
  const h = 0xdeadbeef12345678;
  const stored = describeEvent({ seq: 1, ts: 0, type: "stored", blocks: [3, 4], block_hashes: [h, 1], parent_block_hash: null, token_ids: null, block_size: 16, seq_id: 7 });
  assert.equal(stored[0], `2 blocks · ${shortHash(h)}…`);
  assert.match(stored[2], /seq #7 · root/);
  const removed = describeEvent({ seq: 2, ts: 0, type: "removed", blocks: [5], block_hashes: [2], reason: "evicted" });
  assert.deepEqual(removed, ["1 block · 00000000…", "", "evicted"]);
  const open = describeEvent({ seq: 3, ts: 0, type: "open", seq_id: 9, num_tokens: 40, cached_tokens: 32, blocks: [1, 2, 3] });
  assert.deepEqual(open, ["seq #9", "40 tok", "32 cached (80.0%)"]);
  assert.equal(shortHash(2 ** 60), "10000000");
});

test("the stored/removed filter selects the prefix-cache event types", () => {
  const box = { querySelectorAll: () => [{ value: "prefix" }] };
  const types = selectedTypes(/** @type {any} */ (box));
  for (const t of FILTER_GROUPS.prefix) assert.ok(types.has(t));
  assert.ok(types.has("stored") && types.has("removed") && types.has("cleared"));
});
