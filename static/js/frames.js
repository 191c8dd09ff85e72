// Binary block-map frames of the stream (docs/STREAM.md, protocol 1). Pure: no DOM, no globals.
// Writer: app/stream.py `encode_frame`. A layout change bumps PROTOCOL_VERSION on both sides.

export const PROTOCOL_VERSION = 1;
export const FRAME_MAGIC = 0x4b; // 'K'
export const FRAME_SNAPSHOT = 1;
export const FRAME_DELTA = 2;
export const HEADER_BYTES = 16;
export const RUN_HEADER_BYTES = 8;

/**
 * One run of consecutive blocks. `owner` and `state` are views into the frame's buffer when the
 * run's owner array is 4-byte aligned (it always is by the layout), so decoding copies nothing.
 * @typedef {Object} FrameRun
 * @property {number} start    first block of the run
 * @property {number} count    blocks in the run
 * @property {Int32Array} owner allocation id per block, -1 = free
 * @property {Uint8Array} state 0 free, 1 used, 2 cached, 3 pinned
 */

/**
 * @typedef {Object} Frame
 * @property {number} version
 * @property {number} kind     FRAME_SNAPSHOT or FRAME_DELTA
 * @property {number} frame    per-connection frame counter (0 = the first snapshot)
 * @property {number} blocks   total blocks in the pool
 * @property {FrameRun[]} runs
 */

export class FrameError extends Error {}

/**
 * Decode one binary frame.
 * @param {ArrayBuffer} buffer
 * @returns {Frame}
 * @throws {FrameError} on a bad magic, an unknown version or kind, or a truncated run
 */
export function decodeFrame(buffer) {
  if (buffer.byteLength < HEADER_BYTES) throw new FrameError(`frame too short: ${buffer.byteLength} bytes`);
  const view = new DataView(buffer);
  const magic = view.getUint8(0);
  if (magic !== FRAME_MAGIC) throw new FrameError(`bad magic 0x${magic.toString(16)}`);
  const version = view.getUint8(1);
  if (version !== PROTOCOL_VERSION) throw new FrameError(`unsupported frame version ${version}`);
  const kind = view.getUint8(2);
  if (kind !== FRAME_SNAPSHOT && kind !== FRAME_DELTA) throw new FrameError(`unknown frame kind ${kind}`);
  const frame = view.getUint32(4, true);
  const blocks = view.getUint32(8, true);
  const runCount = view.getUint32(12, true);
  const runs = new Array(runCount);
  let offset = HEADER_BYTES;
  for (let i = 0; i < runCount; i++) {
    if (offset + RUN_HEADER_BYTES > buffer.byteLength) throw new FrameError(`run ${i} header truncated`);
    const start = view.getUint32(offset, true);
    const count = view.getUint32(offset + 4, true);
    offset += RUN_HEADER_BYTES;
    const end = offset + 5 * count;
    if (end > buffer.byteLength) throw new FrameError(`run ${i} body truncated`);
    if (start + count > blocks) throw new FrameError(`run ${i} [${start}, ${start + count}) exceeds ${blocks} blocks`);
    const owner = new Int32Array(buffer, offset, count);
    const state = new Uint8Array(buffer, offset + 4 * count, count);
    runs[i] = { start, count, owner, state };
    offset = alignUp(end, 4);
  }
  return { version, kind, frame, blocks, runs };
}

/** @param {number} n @param {number} a */
export function alignUp(n, a) {
  return Math.ceil(n / a) * a;
}

/**
 * Encode a frame (the inverse of decodeFrame). Used by tests and the benchmark's fake frames;
 * the server has its own writer.
 * @param {{kind:number, frame?:number, blocks:number, runs:{start:number, owner:ArrayLike<number>, state:ArrayLike<number>}[]}} f
 * @returns {ArrayBuffer}
 */
export function encodeFrame(f) {
  let size = HEADER_BYTES;
  for (const r of f.runs) size += alignUp(RUN_HEADER_BYTES + 5 * r.owner.length, 4);
  const buffer = new ArrayBuffer(size);
  const view = new DataView(buffer);
  view.setUint8(0, FRAME_MAGIC);
  view.setUint8(1, PROTOCOL_VERSION);
  view.setUint8(2, f.kind);
  view.setUint32(4, f.frame ?? 0, true);
  view.setUint32(8, f.blocks, true);
  view.setUint32(12, f.runs.length, true);
  let offset = HEADER_BYTES;
  for (const r of f.runs) {
    const count = r.owner.length;
    view.setUint32(offset, r.start, true);
    view.setUint32(offset + 4, count, true);
    offset += RUN_HEADER_BYTES;
    for (let i = 0; i < count; i++) view.setInt32(offset + 4 * i, r.owner[i], true);
    offset += 4 * count;
    for (let i = 0; i < count; i++) view.setUint8(offset + i, r.state[i]);
    offset = alignUp(offset + count, 4);
  }
  return buffer;
}
