import assert from "node:assert/strict";
import { test } from "node:test";

import { PoolModel } from "../model.js";
import { applyRuns, fraction } from "../timeline.js";

test("applyRuns fills owner and state from RLE runs and marks the whole map dirty", () => {
  const m = new PoolModel();
  applyRuns(m, 8, [[0, 3, 5, 1], [3, 2, -1, 0], [5, 3, 7, 3]]);
  assert.deepEqual(Array.from(m.owner), [5, 5, 5, -1, -1, 7, 7, 7]);
  assert.deepEqual(Array.from(m.state), [1, 1, 1, 0, 0, 3, 3, 3]);
  assert.equal(m.takeDirty(), "all");
  applyRuns(m, 8, [[0, 8, -1, 0]]); // same size: every cell rewritten, none left over
  assert.deepEqual(Array.from(m.owner), new Array(8).fill(-1));
});

test("fraction places a seq on the track, clamped, and an empty history at the end", () => {
  assert.equal(fraction(5, 0, 10), 0.5);
  assert.equal(fraction(-3, 0, 10), 0);
  assert.equal(fraction(30, 0, 10), 1);
  assert.equal(fraction(4, 4, 4), 1);
});
