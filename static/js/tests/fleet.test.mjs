import assert from "node:assert/strict";
import { test } from "node:test";

import { COLUMNS, MAX_ROWS, SHARED, SHARED_COLOR, colorOf, engineHeadHtml, figuresHtml, groupByServer, healthOf, keyedNote, legendHtml, mapLayout, matchHtml, parseTokens, prefixesHtml, recentOptionsHtml, seriesOf } from "../fleet.js";

test("one colour group gets one colour everywhere, neighbouring groups differ, the trunk is grey", () => {
  assert.equal(colorOf(12345), colorOf(12345));
  assert.notEqual(colorOf(1), colorOf(2));
  assert.match(colorOf(7), /^hsl\(\d+, 65%, \d+%\)$/);
  assert.equal(colorOf(SHARED), SHARED_COLOR);
  assert.ok(![1, 2, 3, 4, 5].map(colorOf).includes(SHARED_COLOR));
});

test("the legend says what a colour is, how large a group may be, the trunk and any cycles", () => {
  const blocks = { max_group_blocks: 125, shared_blocks: 3, cycles: 2, engines: { a: { colors: [0, 0, 5, 6] }, b: { colors: [0, 6, 9] } } };
  const html = legendHtml(blocks);
  assert.match(html, /at most 125 blocks \(1\/8 of the fleet's\)/);
  assert.match(html, /3 shown/);
  assert.match(html, /shared trunk, 3 blocks/);
  assert.match(html, /2 parent-hash cycles cut/);
  const plain = legendHtml({ max_group_blocks: 64, shared_blocks: 0, cycles: 0, engines: {} });
  assert.doesNotMatch(plain, /trunk|cycles/);
  assert.equal(legendHtml(null), "");
});

test("DP ranks are grouped under their server, in rank order", () => {
  const g = groupByServer([{ name: "b:dp1", server: "b", dp_rank: 1 }, { name: "a", server: "a", dp_rank: 0 }, { name: "b", server: "b", dp_rank: 0 }]);
  assert.deepEqual([...g.keys()], ["b", "a"]);
  assert.deepEqual(g.get("b").map((e) => e.name), ["b", "b:dp1"]);
});

test("the figures name duplication and missed reuse", () => {
  const html = figuresHtml({ engines: 2, unique_blocks: 10, duplicated_blocks: 3, duplicate_copies: 4, cross_engine_recomputes: 5, recompute_tokens: 80 });
  assert.match(html, /duplicated blocks<\/label><b>3/);
  assert.match(html, /missed reuse<\/label><b>5/);
  assert.match(html, /80 tokens/);
});

test("an unreachable engine says so, with its retry, and counts as bad", () => {
  const e = { name: "e0", dp_rank: 0, cached_blocks: 0, block_size: null, keyed_by: "tokens", errors: [], stream: { state: "unreachable", retries: 3, retry_in_ms: 800, lag_s: null } };
  assert.equal(healthOf(e).bad, true);
  const html = engineHeadHtml(e);
  assert.match(html, /unreachable/);
  assert.match(html, /retry 3 in 800 ms/);
  assert.match(html, /no batch yet/);
});

test("an engine keyed by its own hashes and a block size mismatch are said out loud", () => {
  const e = { name: "x<y", dp_rank: 1, cached_blocks: 5, block_size: 16, keyed_by: "engine hashes", fallback_blocks: 5, errors: ["events say 16 tokens per block, the engine was configured with 32"], metrics: { prefix_cache_queries: 100, prefix_cache_hits: 40, kv_usage: 0.5 }, stream: { state: "live", lag_s: 0.05, error_count: 0, apply_lag_p99_ms: 12.4 } };
  const html = engineHeadHtml(e, 2);
  assert.match(html, /x&lt;y/);
  assert.match(html, /keyed by its own hashes, so they match another engine&#39;s only where both hash alike/);
  assert.doesNotMatch(html, /cannot be seen/);
  assert.match(html, /configured with 32/);
  assert.match(html, /40 \/ 100 prefix hits, KV 50%/);
  assert.match(html, /50 ms since last batch \(p99 12 ms from engine to index\)/);
});

test("the own-hashes note is said only where it applies", () => {
  const own = { keyed_by: "engine hashes", fallback_blocks: 9 };
  assert.equal(keyedNote(own, 1), ""); // alone in the fleet: nothing to match with
  assert.match(keyedNote(own, 3), /^its events carry no token ids/);
  assert.equal(keyedNote({ keyed_by: "tokens", fallback_blocks: 0 }, 3), "");
  assert.match(keyedNote({ keyed_by: "tokens", fallback_blocks: 4 }, 3), /^4 of its blocks came without token ids/);
  assert.doesNotMatch(engineHeadHtml({ name: "a", keyed_by: "tokens", fallback_blocks: 0, stream: {} }, 2), /own hashes/);
});

test("maps are cut to MAX_ROWS rows and say how many are hidden", () => {
  const colors = Array.from({ length: COLUMNS * MAX_ROWS + 7 }, (_, i) => i);
  const m = mapLayout(colors);
  assert.equal(m.rows, MAX_ROWS);
  assert.equal(m.hidden, 7);
  assert.deepEqual(mapLayout([]), { cells: [], rows: 1, hidden: 0 });
});

test("token ids parse from commas, spaces and JSON; anything else is refused", () => {
  assert.deepEqual(parseTokens("[1, 2,3\n4]"), { tokens: [1, 2, 3, 4] });
  assert.match(parseTokens("1, x").error, /not a token id: x/);
  assert.match(parseTokens("  ").error, /paste token ids/);
  assert.match(parseTokens("-1").error, /not a token id/);
});

test("match rows are longest first with tokens", () => {
  const html = matchHtml({ a: 1, b: 3 }, { a: 16, b: 16 });
  assert.ok(html.indexOf('data-engine="b"') < html.indexOf('data-engine="a"'));
  assert.match(html, /48 tokens/);
});

test("prefixes list the engine sets, shared ones marked", () => {
  const html = prefixesHtml([{ color: 5, blocks: 3, sets: [{ engines: ["a", "b"], blocks: 2 }, { engines: ["a"], blocks: 1 }] }]);
  assert.match(html, /class="fleet-set shared"[^>]*>a \+ b: 2/);
  assert.match(prefixesHtml([]), /no blocks yet/);
  assert.match(prefixesHtml([{ color: SHARED, shared: true, blocks: 2, sets: [{ engines: ["a"], blocks: 2 }] }]), /<b>2<\/b> blocks <small>shared trunk<\/small>/);
});

test("series columns follow the samples", () => {
  const s = seriesOf([{ at: 1, duplicated_blocks: 2, cross_engine_recomputes: 3, unique_blocks: 4 }]);
  assert.deepEqual(s, { t: [1], duplicated: [2], recomputes: [3], unique: [4] });
});

test("recent chains are offered newest first with their engine, length and age", () => {
  const html = recentOptionsHtml([{ engine: "e1", key: "00000000000000ab", blocks: 7, at: 95 }], 100);
  assert.match(html, /<option value="">—<\/option>/);
  assert.match(html, /value="00000000000000ab">e1 · 7 blocks · 5 s ago/);
});
