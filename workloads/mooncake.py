"""The Mooncake trace: requests with the hashes of their prompt's 512-token blocks.

One JSON object per line: `timestamp` (ms from the start), `input_length`, `output_length`
(tokens) and `hash_ids` (one id per 512-token block of the prompt, `ceil(input_length / 512)`
of them). Parsing is strict, like the Azure reader: a malformed line raises
`allocator.InvalidRequest` naming the file, the line number and what is wrong.

A block is reusable only as part of a prefix: request B reuses request A's block k only if the
ids of blocks 0..k all agree. The reader therefore numbers the prefix tree: `nodes` gives every
block the id of the node (distinct prefix) it ends, so two blocks share a node exactly when their
whole prefixes agree. Everything downstream (pool block hashes, Bélády's next uses) keys on
nodes, never on raw ids, and stays right even for a trace whose ids repeat under other prefixes.

`block_hashes(i, tokens_per_block)` expands request i's trace blocks into pool blocks of
`tokens_per_block` tokens (a divisor of 512): sub-block j of node n hashes to
`splitmix64(n * (512 // tokens_per_block) + j)`, a bijection of 64-bit integers, so distinct
(node, sub-block) pairs never collide and the hashes lie in [0, 2**64) as the events require.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocator import InvalidRequest

from .trace import TRACES_DIR, Trace

DEFAULT_MOONCAKE = TRACES_DIR / "mooncake_conversation.jsonl"
TRACE_BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_HASH_ID = 2**53  # ids beyond JSON's exact-integer range would not survive a round trip
ATTRIBUTION = (
    "Trace: Mooncake conversation trace (Kimi), kvcache-ai/Mooncake, Apache-2.0; Qin et al., "
    '"Mooncake: Trading More Storage for Less Computation", USENIX FAST 2025.'
)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 values: a bijection of [0, 2**64) that scrambles bits."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _M64


def sub_blocks(tokens_per_block: int) -> int:
    """Pool blocks per 512-token trace block. Raises InvalidRequest unless it divides 512."""
    if (isinstance(tokens_per_block, bool) or not isinstance(tokens_per_block, int)
            or tokens_per_block <= 0 or TRACE_BLOCK_TOKENS % tokens_per_block):
        raise InvalidRequest(
            f"tokens_per_block must divide {TRACE_BLOCK_TOKENS} (1, 2, 4, ..., 512), got {tokens_per_block!r}")
    return TRACE_BLOCK_TOKENS // tokens_per_block


@dataclass(frozen=True, slots=True)
class MooncakeTrace:
    """Requests in arrival order with their prompt blocks.

    Invariants: all arrays of one length per request except `hash_ids` / `nodes`, which are flat
    (request i's blocks are `[offsets[i], offsets[i+1])`); `arrival_s[0] == 0`;
    `offsets[i+1] - offsets[i] == ceil(input_length[i] / 512)`; `nodes` numbers distinct prefixes
    densely from 0 in order of first appearance (`num_nodes` of them).
    """

    arrival_s: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    offsets: np.ndarray
    hash_ids: np.ndarray
    nodes: np.ndarray
    num_nodes: int
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival_s)

    def block_nodes(self, i: int) -> np.ndarray:
        """Prefix-tree nodes of request i's trace blocks, first block first."""
        return self.nodes[self.offsets[i]:self.offsets[i + 1]]

    def block_hashes(self, i: int, tokens_per_block: int = TRACE_BLOCK_TOKENS) -> list[int]:
        """Pool block hashes of request i: each trace block expanded into 512 // tokens_per_block
        blocks (the last trace block too, so a cached block always stands for 512 tokens)."""
        return expand(self.block_nodes(i), tokens_per_block)

    def head(self, n: int) -> MooncakeTrace:
        """The first n requests (prefix-tree numbering kept: it is still dense in first use)."""
        end = int(self.offsets[n])
        nodes = self.nodes[:end]
        return MooncakeTrace(self.arrival_s[:n], self.input_length[:n], self.output_length[:n],
                             self.offsets[:n + 1], self.hash_ids[:end], nodes,
                             int(nodes.max()) + 1 if end else 0, self.source)

    def to_trace(self) -> Trace:
        """The request lengths as an Azure-style `Trace` (for the serving simulator)."""
        return Trace(self.arrival_s, self.input_length, self.output_length, self.source)

    def summary(self) -> dict:
        n = len(self)
        return {
            "source": self.source,
            "requests": n,
            "duration_s": float(self.arrival_s[-1]) if n else 0.0,
            "input_tokens_total": int(self.input_length.sum()),
            "input_tokens_mean": float(self.input_length.mean()) if n else 0.0,
            "input_tokens_max": int(self.input_length.max()) if n else 0,
            "output_tokens_mean": float(self.output_length.mean()) if n else 0.0,
            "blocks": int(self.offsets[-1]),
            "distinct_blocks": self.num_nodes,
            "block_tokens": TRACE_BLOCK_TOKENS,
        }


def expand(nodes: np.ndarray, tokens_per_block: int) -> list[int]:
    """Pool block hashes (Python ints in [0, 2**64)) for trace-block prefix nodes."""
    k = sub_blocks(tokens_per_block)
    keys = np.asarray(nodes, dtype=np.uint64)
    if k > 1:
        keys = (keys[:, None] * np.uint64(k) + np.arange(k, dtype=np.uint64)).ravel()
    return splitmix64(keys).tolist()


def _int(obj: dict, name: str, minimum: int) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {value!r} is not an integer")
    if value < minimum:
        raise ValueError(f"{name} {value} is below {minimum}")
    return value


def _record(text: str) -> tuple[float, int, int, list[int]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object with {', '.join(FIELDS)}, got {type(obj).__name__}")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    stamp = obj["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0:
        raise ValueError(f"timestamp {stamp!r} is not a non-negative number of milliseconds")
    inputs = _int(obj, "input_length", 1)
    outputs = _int(obj, "output_length", 1)
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ValueError(f"hash_ids is {type(ids).__name__}, expected a list of integers")
    want = -(-inputs // TRACE_BLOCK_TOKENS)
    if len(ids) != want:
        raise ValueError(f"hash_ids has {len(ids)} ids, expected ceil(input_length {inputs} / "
                         f"{TRACE_BLOCK_TOKENS}) = {want}")
    for k, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < MAX_HASH_ID:
            raise ValueError(f"hash_ids[{k}] {h!r} is not an integer in [0, 2**53)")
    return float(stamp), inputs, outputs, ids


def parse_mooncake(lines, source: str = "<trace>", limit: int | None = None) -> MooncakeTrace:
    """Parse JSONL text lines (blank lines skipped). Raises InvalidRequest naming the line."""
    stamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    offsets = [0]
    ids: list[int] = []
    nodes: list[int] = []
    tree: dict[tuple[int, int], int] = {}  # (parent node or -1, hash id) -> node
    for number, line in enumerate(lines, 1):
        if limit is not None and len(stamps) >= limit:
            break
        if not line.strip():
            continue
        try:
            stamp, n_in, n_out, block_ids = _record(line)
        except ValueError as exc:
            raise InvalidRequest(f"{source}: line {number}: {exc}") from None
        if stamps and stamp < stamps[-1]:
            # Blocks are numbered per request in file order; sorting would renumber the tree.
            raise InvalidRequest(f"{source}: line {number}: timestamp {stamp:g} is before the "
                                 f"previous request's {stamps[-1]:g}; timestamps must not decrease")
        stamps.append(stamp)
        inputs.append(n_in)
        outputs.append(n_out)
        parent = -1
        for h in block_ids:
            node = tree.setdefault((parent, h), len(tree))
            nodes.append(node)
            parent = node
        ids.extend(block_ids)
        offsets.append(len(ids))
    if not stamps:
        raise InvalidRequest(f"{source}: no requests (expected one JSON object per line)")
    t = np.asarray(stamps, dtype=np.float64) / 1000.0
    return MooncakeTrace(
        t - t[0], np.asarray(inputs, np.int64), np.asarray(outputs, np.int64),
        np.asarray(offsets, np.int64), np.asarray(ids, np.int64), np.asarray(nodes, np.int64),
        len(tree), source)


def load_mooncake(path: str | Path | None = None, limit: int | None = None) -> MooncakeTrace:
    """Load a Mooncake JSONL trace (default: the bundled conversation trace). Raises InvalidRequest."""
    path = Path(path) if path is not None else DEFAULT_MOONCAKE
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise InvalidRequest(f"limit must be a positive integer, got {limit!r}")
    try:
        with open(path, encoding="utf-8") as f:
            return parse_mooncake(f, source=path.name, limit=limit)
    except OSError as exc:
        raise InvalidRequest(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path.name}: not a UTF-8 text file") from None
@functools.lru_cache(maxsize=1)
def bundled_trace() -> MooncakeTrace:
    """The bundled conversation trace, loaded once per process (the server's routing runs share
    it; a MooncakeTrace is not changed by its readers)."""
    return load_mooncake()
