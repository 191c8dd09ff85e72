import assert from "node:assert/strict";
import { test } from "node:test";

import { FRAME_DELTA, FRAME_SNAPSHOT, FrameError, decodeFrame, encodeFrame } from "../frames.js";

/** Build a frame byte by byte, exactly as docs/STREAM.md lays it out (independent of encodeFrame). */
function handFrame(kind, frameNo, blocks, runs) {
  const bytes = [0x4b, 1, kind, 0];
  const u32 = (v) => bytes.push(v & 255, (v >>> 8) & 255, (v >>> 16) & 255, (v >>> 24) & 255);
  u32(frameNo);
  u32(blocks);
  u32(runs.length);
  for (const r of runs) {
    u32(r.start);
    u32(r.owner.length);
    for (const o of r.owner) u32(o >>> 0);
    for (const s of r.state) bytes.push(s);
    while (bytes.length % 4) bytes.push(0);
  }
  return new Uint8Array(bytes).buffer;
}

test("decodes a snapshot with one run and padding", () => {
  const owner = [-1, 7, 7, -1, 9];
  const state = [0, 1, 1, 0, 3];
  const buf = handFrame(1, 0, 5, [{ start: 0, owner, state }]);
  assert.equal(buf.byteLength, 16 + 8 + 20 + 5 + 3); // 5 state bytes padded to 8
  const f = decodeFrame(buf);
  assert.equal(f.kind, FRAME_SNAPSHOT);
  assert.equal(f.frame, 0);
  assert.equal(f.blocks, 5);
  assert.equal(f.runs.length, 1);
  assert.deepEqual(Array.from(f.runs[0].owner), owner);
  assert.deepEqual(Array.from(f.runs[0].state), state);
});

test("decodes a delta whose second run starts after padding", () => {
  const runs = [
    { start: 64, owner: [3, 3, 3], state: [1, 1, 2] }, // 8 + 12 + 3 = 23 -> padded to 24
    { start: 200, owner: [-1, 4], state: [0, 1] },     // 8 + 8 + 2 = 18 -> 20
  ];
  const f = decodeFrame(handFrame(2, 17, 256, runs));
  assert.equal(f.kind, FRAME_DELTA);
  assert.equal(f.frame, 17);
  assert.equal(f.runs[1].start, 200);
  assert.deepEqual(Array.from(f.runs[1].owner), [-1, 4]);
  assert.deepEqual(Array.from(f.runs[1].state), [0, 1]);
  assert.deepEqual(Array.from(f.runs[0].state), [1, 1, 2]);
});

test("a run whose size is already a multiple of 4 has no padding", () => {
  const runs = [{ start: 0, owner: [1, 1, 1, 1], state: [1, 1, 1, 1] }, { start: 4, owner: [2, 2, 2, 2], state: [3, 3, 3, 3] }];
  const buf = handFrame(2, 1, 8, runs);
  assert.equal(buf.byteLength, 16 + 2 * (8 + 16 + 4));
  const f = decodeFrame(buf);
  assert.deepEqual(Array.from(f.runs[1].owner), [2, 2, 2, 2]);
});

test("encodeFrame produces what the spec lays out", () => {
  const runs = [{ start: 10, owner: [5, -1, 6], state: [1, 0, 2] }];
  const mine = new Uint8Array(encodeFrame({ kind: 2, frame: 3, blocks: 64, runs }));
  const hand = new Uint8Array(handFrame(2, 3, 64, runs));
  assert.deepEqual(mine, hand);
});

test("an empty delta decodes to no runs", () => {
  const f = decodeFrame(handFrame(2, 5, 1000, []));
  assert.equal(f.runs.length, 0);
  assert.equal(f.blocks, 1000);
});

test("rejects bad magic, version, kind and truncation", () => {
  const good = new Uint8Array(handFrame(1, 0, 2, [{ start: 0, owner: [1, 1], state: [1, 1] }]));
  const bad = (i, v) => {
    const c = good.slice();
    c[i] = v;
    return c.buffer;
  };
  assert.throws(() => decodeFrame(bad(0, 0x4c)), FrameError);
  assert.throws(() => decodeFrame(bad(1, 2)), FrameError);
  assert.throws(() => decodeFrame(bad(2, 9)), FrameError);
  assert.throws(() => decodeFrame(good.slice(0, 30).buffer), FrameError);
  assert.throws(() => decodeFrame(new ArrayBuffer(8)), FrameError);
  // a run past the end of the pool
  assert.throws(() => decodeFrame(handFrame(2, 0, 4, [{ start: 3, owner: [1, 1], state: [1, 1] }])), FrameError);
});
