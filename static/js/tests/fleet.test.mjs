import assert from "node:assert/strict";
import { test } from "node:test";

import { COLUMNS, MAX_ROWS, colorOf, engineHeadHtml, figuresHtml, groupByServer, healthOf, mapLayout, matchHtml, parseTokens, prefixesHtml, recentOptionsHtml, seriesOf } from "../fleet.js";

test("one prefix gets one colour everywhere, neighbouring prefixes differ", () => {
  assert.equal(colorOf(12345), colorOf(12345));
  assert.notEqual(colorOf(1), colorOf(2));
  assert.match(colorOf(7), /^hsl\(\d+, 65%, \d+%\)$/);
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
  const e = { name: "x<y", dp_rank: 1, cached_blocks: 5, block_size: 16, keyed_by: "engine hashes", errors: ["events say 16 tokens per block, the engine was configured with 32"], metrics: { prefix_cache_queries: 100, prefix_cache_hits: 40, kv_usage: 0.5 }, stream: { state: "live", lag_s: 0.05, error_count: 0, apply_lag_p99_ms: 12.4 } };
  const html = engineHeadHtml(e);
  assert.match(html, /x&lt;y/);
  assert.match(html, /keyed by engine hashes/);
  assert.match(html, /configured with 32/);
  assert.match(html, /40 \/ 100 prefix hits, KV 50%/);
  assert.match(html, /50 ms since last batch \(p99 12 ms from engine to index\)/);
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
