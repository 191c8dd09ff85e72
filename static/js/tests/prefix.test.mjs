// Prefix caching on the page: the `prefix` message, reference counts, hit ratio, log lines.
import { test } from "node:test";
import assert from "node:assert/strict";

import { PoolModel, hitRateOf } from "../model.js";
import { describeEvent, numbersHtml } from "../panels.js";

const [FREE, USED, CACHED, SHARED] = [0, 1, 2, 4];
const STATES = { 0: "free", 1: "used", 2: "cached", 3: "pinned", 4: "shared" };

test("a prefix message ranks cached blocks and sets reference counts of shared blocks", () => {
  const m = new PoolModel();
  m.applyMessage({ type: "hello", protocol: 1, pool: { name: "p", strategy: "paged", num_blocks: 8, block_bytes: 64, prefix_caching: { policy: "lru" } }, states: STATES, last_event_seq: 0 });
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

test("log lines for sequence events", () => {
  const open = describeEvent({ seq: 3, ts: 0, type: "open", seq_id: 9, num_tokens: 40, cached_tokens: 32, blocks: [1, 2, 3] });
  assert.deepEqual(open, ["seq #9", "40 tok", "32 cached (80.0%)"]);
  const close = describeEvent({ seq: 4, ts: 0, type: "close", seq_id: 9, blocks: [1, 2, 3] });
  assert.deepEqual(close, ["seq #9", "3 blocks", "released"]);
  const stored = describeEvent({ seq: 1, ts: 0, type: "stored", blocks: [3, 4], block_hashes: [2 ** 60, 1], parent_block_hash: null, token_ids: null, block_size: 16, seq_id: 7 });
  assert.match(stored[0], /^2 blocks 10000000/);
});

test("a past moment's numbers say the cache's own figures are not kept, not that there is no cache", () => {
  const base = { strategy: "paged", total_blocks: 8, used_blocks: 2, blocks_by_state: { cached: 3 }, utilization: 0.25,
    ooms: { capacity: 0, fragmentation: 0 }, scatter_fails: false };
  assert.match(numbersHtml({ ...base, past: true }, 0), /not kept for past moments/);
  // once the history holds the cache's figures, a past moment shows them like a live one
  const pastCache = { hits: 3, misses: 1, hit_rate: 0.75, entries: 2, used_bytes: 64, capacity_bytes: 128 };
  const past = numbersHtml({ ...base, past: true, cache: pastCache }, 0);
  assert.match(past, /3 hits · 1 misses/);
  assert.match(past, /2 entries/);
  assert.match(numbersHtml(base, 0), /no cache on this pool/);
  const live = numbersHtml({ ...base, prefix: { hits: 8, queries: 16, blocks: { shared: 1 } } }, 0);
  assert.match(live, /8 of 16 prompt tokens cached/);
});
