"""The KV-event wire format of vLLM and SGLang, and kvscope's normalised form of it.

Encoding: msgspec structs that mirror `vllm/distributed/kv_events.py` (vLLM 0.33): a batch is a
positional array `[ts, events, data_parallel_rank]`; each event a map tagged `"type"`. Fields
without a default in vLLM (`lora_id`, `medium`, `lora_name`) are always written, since vLLM's own
typed decoder requires them.

Decoding is lenient and typed by hand, so one bad event never costs the rest of its batch:
- an event is a map with `"type"` (vLLM >= 0.24, SGLang) or an array whose first item is the type
  name followed by the fields in declaration order (vLLM <= 0.23);
- a hash is an unsigned 64-bit int (vLLM's default), a signed one (SGLang), or bytes (vLLM with
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); all become ints in [0, 2**64), bytes the way vLLM
  itself folds them (`int.from_bytes(b, "big") & (2**64 - 1)`), so every form names a block alike;
- unknown event types are skipped and counted; unknown fields are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

HASH_MASK = (1 << 64) - 1
# A batch holding more events than this is refused whole: no engine step produces it, and
# decoding it could hold the subscriber for seconds.
MAX_BATCH_EVENTS = 100_000
MAX_BATCH_BYTES = 64 << 20

MEDIUM_GPU = "GPU"


# -- vLLM's structs (for encoding; vLLM's own decoder reads what these write) ---------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three event kinds; encoded as a map with `"type": <class name>`."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


# -- kvscope's normalised form ------------------------------------------------------------------
@dataclass(slots=True)
class Stored:
    """Blocks the engine cached: `block_hashes[i]`'s parent is `block_hashes[i-1]` (the first's is
    `parent`, None for a root). `token_ids` covers all the blocks, or is None when not sent."""

    block_hashes: list[int]
    parent: int | None
    token_ids: list[int] | None
    block_size: int | None
    medium: str | None = None
    lora_id: int | None = None
    kind: str = "stored"


@dataclass(slots=True)
class Removed:
    block_hashes: list[int]
    medium: str | None = None
    kind: str = "removed"


@dataclass(slots=True)
class Cleared:
    kind: str = "cleared"


@dataclass(slots=True)
class Batch:
    """One decoded payload: its events in order, and how many were skipped (unknown type) or
    malformed, with the first problem of each for the page."""

    ts: float
    events: list
    dp_rank: int | None = None
    unknown: int = 0
    malformed: int = 0
    problems: list[str] = field(default_factory=list)


class WireError(ValueError):
    """A payload or frame set kvscope cannot read. `kind` names the counter it lands in:
    malformed, frames, too_large, unknown_type."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def norm_hash(h: object) -> int:
    """A block hash as an int in [0, 2**64). Raises WireError for anything else."""
    if h.__class__ is int:
        if 0 <= h <= HASH_MASK:
            return h
        if -(1 << 63) <= h < 0:
            return h & HASH_MASK
        raise WireError("malformed", f"block hash {h} is outside 64 bits")
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if not b:
            raise WireError("malformed", "empty block hash")
        return int.from_bytes(b, "big") & HASH_MASK
    raise WireError("malformed", f"block hash of type {type(h).__name__}")


def _hashes(v: object) -> list[int]:
    if not isinstance(v, list):
        raise WireError("malformed", f"block_hashes is {type(v).__name__}, not a list")
    return [norm_hash(h) for h in v]


def _opt_int(v: object, what: str) -> int | None:
    if v is None or v.__class__ is int:
        return v
    raise WireError("malformed", f"{what} is {type(v).__name__}, not an int")


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


# Positional fields of the pre-0.24 array form, after the type name.
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_event(raw: object):
    """One event (map or array form) as Stored / Removed / Cleared, or None for an unknown
    type. Raises WireError when it cannot be read."""
    if isinstance(raw, dict):
        name = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        name = raw[0]
        names = _ARRAY_FIELDS.get(name)
        if names is None:
            return None
        fields = dict(zip(names, raw[1:]))
    else:
        raise WireError("malformed", f"event is {type(raw).__name__}, not a tagged map or array")
    if name == "BlockStored":
        hashes = _hashes(fields.get("block_hashes"))
        parent = fields.get("parent_block_hash")
        tokens = fields.get("token_ids")
        if tokens is not None and not isinstance(tokens, list):
            raise WireError("malformed", "token_ids is not a list")
        return Stored(hashes, None if parent is None else norm_hash(parent), tokens,
                      _opt_int(fields.get("block_size"), "block_size"),
                      _opt_str(fields.get("medium")), _opt_int(fields.get("lora_id"), "lora_id"))
    if name == "BlockRemoved":
        return Removed(_hashes(fields.get("block_hashes")), _opt_str(fields.get("medium")))
    if name == "AllBlocksCleared":
        return Cleared()
    if isinstance(name, str):
        return None
    raise WireError("malformed", "event has no 'type'")


def decode_batch(payload: bytes, max_events: int = MAX_BATCH_EVENTS) -> Batch:
    """A payload `[ts, events, dp_rank]` as a Batch. Raises WireError when the payload as a whole
    is unreadable or too large; a bad event inside is skipped and counted in the Batch."""
    if len(payload) > MAX_BATCH_BYTES:
        raise WireError("too_large", f"payload of {len(payload)} bytes (cap {MAX_BATCH_BYTES})")
    try:
        raw = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise WireError("malformed", f"not msgpack: {exc}") from None
    except RecursionError:  # msgspec stops a payload nested deeper than the interpreter allows
        raise WireError("malformed", "payload nested too deep to be a batch") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise WireError("malformed", "payload is not [ts, events, dp_rank]")
    ts = raw[0]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise WireError("malformed", f"batch timestamp is {type(ts).__name__}")
    if len(raw[1]) > max_events:
        raise WireError("too_large", f"batch of {len(raw[1])} events (cap {max_events})")
    rank = raw[2] if len(raw) > 2 and raw[2].__class__ is int else None
    out = Batch(float(ts), [], rank)
    for item in raw[1]:
        try:
            ev = decode_event(item)
        except WireError as exc:
            out.malformed += 1
            if len(out.problems) < 4:
                out.problems.append(str(exc))
            continue
        if ev is None:
            out.unknown += 1
            if len(out.problems) < 4:
                name = item.get("type") if isinstance(item, dict) else item[0]
                out.problems.append(f"unknown event type {str(name)[:40]!r}")
            continue
        out.events.append(ev)
    return out


# -- encoding -----------------------------------------------------------------------------------
def to_wire(ev) -> KVCacheEvent:
    """A normalised event as vLLM's struct."""
    if ev.kind == "stored":
        return BlockStored(list(ev.block_hashes), ev.parent, list(ev.token_ids or []),
                           int(ev.block_size or 0), ev.lora_id, ev.medium, None)
    if ev.kind == "removed":
        return BlockRemoved(list(ev.block_hashes), ev.medium)
    return AllBlocksCleared()


def encode_batch(events, ts: float, dp_rank: int | None = 0) -> bytes:
    """msgpack of `[ts, events, dp_rank]` in vLLM's current format."""
    return _ENCODER.encode(KVEventBatch(ts, [to_wire(e) for e in events], dp_rank))


def encode_positional(events, ts: float, dp_rank: int | None = 0) -> bytes:
    """The pre-0.24 form (each event an array led by its type name), for tests and old routers."""
    rows = []
    for e in events:
        if e.kind == "stored":
            rows.append(["BlockStored", list(e.block_hashes), e.parent, list(e.token_ids or []),
                         int(e.block_size or 0), e.lora_id, e.medium])
        elif e.kind == "removed":
            rows.append(["BlockRemoved", list(e.block_hashes), e.medium])
        else:
            rows.append(["AllBlocksCleared"])
    return _ENCODER.encode([ts, rows, dp_rank])


def from_pool_event(ev: dict):
    """A kvscope pool event (`stored` / `removed` / `cleared`, the prefix-cache contract) as a
    normalised event, or None for any other kind."""
    kind = ev.get("type")
    if kind == "stored":
        return Stored([int(h) for h in ev["block_hashes"]], ev.get("parent_block_hash"),
                      ev.get("token_ids"), ev.get("block_size"), MEDIUM_GPU)
    if kind == "removed":
        return Removed([int(h) for h in ev["block_hashes"]], MEDIUM_GPU)
    if kind == "cleared":
        return Cleared()
    return None


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    """The sequence number of an 8-byte big-endian frame (-1 is the replay end marker)."""
    if len(frame) != 8:
        raise WireError("frames", f"sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)
