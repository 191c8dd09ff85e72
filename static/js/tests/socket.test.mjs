import assert from "node:assert/strict";
import { test } from "node:test";

import { BACKOFF_MAX_MS, BACKOFF_START_MS, backoffDelay } from "../socket.js";

test("backoff doubles from the start delay and stays under the cap", () => {
  const mid = () => 0.5; // no jitter
  assert.equal(backoffDelay(0, mid), BACKOFF_START_MS);
  assert.equal(backoffDelay(1, mid), 2 * BACKOFF_START_MS);
  assert.equal(backoffDelay(30, mid), BACKOFF_MAX_MS);
  for (let i = 0; i < 50; i++) assert.ok(backoffDelay(i) <= BACKOFF_MAX_MS * 1.2);
});
