import assert from "node:assert/strict";
import { test } from "node:test";

import { COLUMNS, GROUPS_PER_PAGE, MAX_OPEN_ENGINES, MAX_ROWS, SHARED, SHARED_COLOR, colorOf, engineHeadHtml, figuresHtml, groupByServer, groupRowHtml, healthOf, keyedNote, legendHtml, mapLayout, matchHtml, pagerText, parseTokens, prefixesHtml, ranksText, recentOptionsHtml, seriesOf, statesHtml, summaryHtml, tiersHtml, viewParams } from "../fleet.js";

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

test("a large fleet's list asks for the summary and a page of servers; opened servers for their ranks", () => {
  const list = viewParams({ q: "server-1", state: "unreachable", offset: 40 });
  assert.deepEqual([...list], [["engines_q", "server-1"], ["engines_state", "unreachable"], ["engines_limit", "0"], ["groups_offset", "40"], ["groups_limit", String(GROUPS_PER_PAGE)]]);
  const open = viewParams({ q: "", open: ["a", "b:c"] });
  assert.deepEqual(open.getAll("engines_group"), ["a", "b:c"]);
  assert.equal(open.get("engines_limit"), String(MAX_OPEN_ENGINES));
  assert.equal(open.get("groups_offset"), null);
  assert.equal(viewParams({ limit: 32 }).get("engines_limit"), "32");
  assert.equal(viewParams({}).toString(), `engines_limit=0&groups_offset=0&groups_limit=${GROUPS_PER_PAGE}`);
});

test("the summary names engines, servers, blocks, states, the hit ratio and the largest holders", () => {
  const s = { engines: 1024, servers: 128, by_state: { live: 1000, unreachable: 24 }, lagging: 3, errors: 24, cached_blocks: 123456,
    top_engines: [{ name: "s1:dp3", server: "s1", cached_blocks: 99 }], top_servers: [{ name: "s1", engines: 8, cached_blocks: 500 }],
    hit_ratio: 0.4567, prefix_cache_hits: 4567, prefix_cache_queries: 10000, engines_with_metrics: 8 };
  const html = summaryHtml(s);
  assert.match(html, /engines<\/label><b>1,024<\/b><small>on 128 servers/);
  assert.match(html, /123,456/);
  assert.match(html, /45\.7%/);
  assert.ok(html.indexOf('data-state="live">1,000 live') < html.indexOf('data-state="unreachable">24 unreachable'));
  assert.match(html, /24 with errors/);
  assert.match(html, /3 lagging/);
  assert.match(html, /title="s1:dp3: 99 blocks, server s1"><b>s1:dp3<\/b><small>99<\/small>/);
  assert.match(html, /title="s1: 500 blocks, 8 engines"><b>s1<\/b><small>500<\/small>/);
  const none = summaryHtml({ ...s, hit_ratio: null, lagging: 0, errors: 0 });
  assert.match(none, /no engine's \/metrics read/);
  assert.match(none, /none lagging, none with errors/);
  assert.equal(summaryHtml(null), "");
});

test("a server is one row: its ranks, states, blocks; opened, a place for its maps", () => {
  const g = { name: "server-<7>", engines: 8, dp_ranks: { first: 0, last: 7 }, states: { live: 7, unreachable: 1 }, lagging: 0, errors: 1, cached_blocks: 1234, models: ["llama"] };
  const closed = groupRowHtml(g, false, 2000);
  assert.match(closed, /data-group="server-&lt;7&gt;"/);
  assert.match(closed, /aria-expanded="false"/);
  assert.match(closed, /8 ranks · dp 0–7 · llama/);
  assert.match(closed, /1 with errors/);
  assert.match(closed, /max="2000" value="1234"/);
  assert.match(closed, /class="fleet-group-ranks" hidden/);
  assert.match(groupRowHtml(g, true, 2000), /fleet-group open bad[\s\S]*aria-expanded="true"[\s\S]*class="fleet-group-ranks"><\/div>/);
  assert.equal(ranksText({ engines: 1, dp_ranks: { first: 0, last: 0 } }), "1 engine");
  assert.equal(ranksText({ engines: 3, dp_ranks: { first: 0, last: 9, some: [0, 4, 9] } }), "3 ranks · dp 0, 4, 9");
  assert.equal(statesHtml({ b: 1, a: 1, c: 2 }).match(/data-state="(\w)"/g).join(), 'data-state="c",data-state="a",data-state="b"');
});

test("the pager says which servers are shown, of how many, and whether a search narrows them", () => {
  assert.equal(pagerText({ offset: 20, limit: 20, matched: 128, total: 128 }, false), "servers 21–40 of 128");
  assert.equal(pagerText({ offset: 120, limit: 20, matched: 128, total: 128 }, false), "servers 121–128 of 128");
  assert.equal(pagerText({ offset: 0, limit: 20, matched: 1, total: 128 }, true), "servers 1–1 of 1 matching (128 in all)");
  assert.equal(pagerText({ offset: 0, limit: 20, matched: 0, total: 128 }, true), "no server matches");
});

test("a match over many engines lists the best and says what the rest hold", () => {
  const engines = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`e${i}`, i < 35 ? 40 - i : 0]));
  const html = matchHtml(engines, {}, 32);
  assert.equal((html.match(/fleet-match-row/g) || []).length, 32);
  assert.match(html, /8 more engines: 3 hold part of it, 5 none/);
  assert.doesNotMatch(matchHtml({ a: 1, b: 0 }, {}, 32), /more engines/);
});

test("a set of a subset's maps names some engines and counts the others", () => {
  const html = prefixesHtml([{ color: 5, blocks: 10, sets: [{ engines: ["a", "b"], more_engines: 1014, blocks: 10 }, { engines: ["c"], blocks: 2 }] }]);
  assert.match(html, /a \+ b \+ 1,014 more: 10/);
  assert.match(html, /fleet-set shared/);
  assert.match(html, /class="fleet-set" title="2 blocks held by c">c: 2/);
});

test("a large fleet's largest groups list their largest sets and count the others", () => {
  const sets = Array.from({ length: 6 }, (_, i) => ({ engines: [`e${i}`], blocks: 10 - i }));
  const html = prefixesHtml([{ color: 5, blocks: 60, sets, other_sets: 3, other_sets_blocks: 4 }], 4);
  assert.equal((html.match(/title=/g) || []).length, 4);
  assert.match(html, /\+ 5 more sets: 15/);
  assert.doesNotMatch(prefixesHtml([{ color: 5, blocks: 60, sets }]), /more sets/);
});

test("an engine's blocks per tier are shown once its fleet has a tier below the GPU", () => {
  const gpuOnly = { name: "e0", cached_blocks: 4, tiers: { gpu: 4 }, errors: [], stream: { state: "live", lag_s: 0.1 } };
  assert.equal(tiersHtml(gpuOnly), "");
  assert.doesNotMatch(engineHeadHtml(gpuOnly), /fleet-tier/);
  const offloaded = { ...gpuOnly, cached_blocks: 1, tiers: { gpu: 1, cpu: 1234, disk: 0 } };
  const html = engineHeadHtml(offloaded);
  assert.match(html, /1 blocks · <span class="fleet-tiers">/);
  assert.match(html, /data-tier="gpu">GPU 1</);
  assert.match(html, /data-tier="cpu">CPU 1,234</);
  assert.match(html, /class="fleet-tier none" data-tier="disk">disk 0</);
  const blocks = { max_group_blocks: 64, shared_blocks: 0, cycles: 0, engines: {} };
  assert.doesNotMatch(legendHtml(blocks, ["gpu"]), /per tier/);
  assert.match(legendHtml(blocks, ["gpu", "cpu"]), /The maps are the GPU's blocks/);
  assert.match(legendHtml(blocks, ["gpu", "cpu", "disk"]), /per tier \(GPU, CPU, disk\)/);
});
