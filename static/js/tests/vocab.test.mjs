import assert from "node:assert/strict";
import { test } from "node:test";

import { PoolModel } from "../model.js";
import { compareStrategies, eventTypesOf, scatterFails, setVocab, stateCodes, usesCache, vocab } from "../vocab.js";

const meta = {
  strategies: {
    paged: { name: "paged", label: "paged", scatter_fails: false, options: [], compare: true, description: "" },
    contiguous: { name: "contiguous", label: "contiguous", scatter_fails: true, options: ["fit"], compare: true, description: "" },
    mirror: { name: "mirror", label: "mirror", scatter_fails: false, options: [], compare: false, description: "" },
  },
  fits: ["first"],
  policies: {},
  block_states: {},
  events: { allocate: { fields: [], group: "alloc" }, free: { fields: [], group: "alloc" }, oom: { fields: [], group: "oom" } },
  event_groups: {},
  scenarios: { chat: { name: "chat", description: "", uses_cache: true }, burst: { name: "burst", description: "", uses_cache: false } },
  workload_kinds: ["scenario"],
};

test("a strategy's meaning comes from the vocabulary, so a new one needs no JS edit", () => {
  assert.equal(scatterFails("paged", meta), false);
  assert.equal(scatterFails("mirror", meta), false);
  assert.equal(scatterFails("contiguous", meta), true);
  assert.equal(scatterFails("unknown", meta), true); // unknown: assume the worse
  assert.deepEqual(compareStrategies(meta), ["paged", "contiguous"]);
});

test("log-filter groups expand to the event kinds the vocabulary puts in them", () => {
  assert.deepEqual(eventTypesOf("alloc", meta), ["allocate", "free"]);
  assert.deepEqual(eventTypesOf("stored", meta), ["stored"]); // a group with no member is a kind
  assert.equal(usesCache("chat", meta), true);
  assert.equal(usesCache("burst", meta), false);
});

test("the model learns block-state codes and the vocabulary from hello", () => {
  assert.deepEqual(stateCodes({ 0: "free", 1: "used", 4: "shared" }), { free: 0, used: 1, shared: 4 });
  const m = new PoolModel();
  m.applyHello({ type: "hello", protocol: 1, pool: { name: "p", strategy: "mirror", num_blocks: 4, block_bytes: 16 }, states: { 0: "free", 4: "shared" }, last_event_seq: 0, meta });
  assert.equal(m.codes.shared, 4);
  assert.equal(m.stateNames[4], "shared");
  assert.equal(vocab(), meta);
  setVocab(null); // ignored: keeps the last good one
  assert.equal(vocab(), meta);
});
