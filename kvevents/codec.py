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
from typing import Annotated, Any

import msgspec

HASH_MASK = (1 << 64) - 1
# A batch holding more events than this is refused whole: no engine step produces it, and
# decoding it could hold the subscriber for seconds.
MAX_BATCH_EVENTS = 100_000
# The same for a batch's bytes (also the SUB socket's ZMQ_MAXMSGSIZE: a bigger message is dropped
# by ZeroMQ before it is buffered), its block hashes and its token ids, and one event's: a batch
# past a cap is refused whole as `too_large`, an event past its own cap is a malformed event.
# One vLLM step stores a few thousand blocks; 128k-token prompts in blocks of 16 are 8,192.
MAX_BATCH_BYTES = 16 << 20
MAX_BATCH_BLOCKS = 1 << 17
MAX_BATCH_TOKENS = 1 << 22
MAX_EVENT_BLOCKS = 1 << 16
MAX_EVENT_TOKENS = 1 << 22
MAX_DP_RANK = 1024  # data-parallel ranks 0..1023 (a batch naming another is malformed)

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
    cont: bool = False  # a later part of one event split to be applied in parts


@dataclass(slots=True)
class Removed:
    block_hashes: list[int]
    medium: str | None = None
    kind: str = "removed"
    cont: bool = False


@dataclass(slots=True)
class Cleared:
    """The engine dropped every block: of one tier when `medium` names it (Dynamo's RouterEvent
    carries its tier), else of every tier (vLLM's and SGLang's AllBlocksCleared, pod-wide as
    llm-d reads it)."""

    kind: str = "cleared"
    medium: str | None = None


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
    """One event (map or array form), already decoded to Python objects, as Stored / Removed /
    Cleared, or None for an unknown type. Raises WireError when it cannot be read."""
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


# -- bounded decoding -------------------------------------------------------------------------------
# msgspec reads an array's length from its header before it decodes a single item, so these typed
# decoders refuse an oversized list without building it: no payload costs more than its caps.
class _WireStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    block_hashes: Annotated[list[int], msgspec.Meta(max_length=MAX_EVENT_BLOCKS)]
    parent_block_hash: int | None = None
    token_ids: Annotated[list[int], msgspec.Meta(max_length=MAX_EVENT_TOKENS)] | None = None
    block_size: int | None = None
    lora_id: int | None = None
    medium: str | None = None


class _WireRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: Annotated[list[int], msgspec.Meta(max_length=MAX_EVENT_BLOCKS)]
    medium: str | None = None


class _WireCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


_OUTER = msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], msgspec.Meta(max_length=16)])
_TS = msgspec.msgpack.Decoder(float)
_RANK = msgspec.msgpack.Decoder(int | None)
_FAST = msgspec.msgpack.Decoder(_WireStored | _WireRemoved | _WireCleared)
_SHAPE = msgspec.msgpack.Decoder(Annotated[dict[str, msgspec.Raw], msgspec.Meta(max_length=64)]
                                 | Annotated[list[msgspec.Raw], msgspec.Meta(max_length=64)])
_ANY = msgspec.msgpack.Decoder()
_LISTS = {"block_hashes": (msgspec.msgpack.Decoder(Annotated[list[Any], msgspec.Meta(
              max_length=MAX_EVENT_BLOCKS)]), MAX_EVENT_BLOCKS, "block hashes"),
          "token_ids": (msgspec.msgpack.Decoder(Annotated[list[Any], msgspec.Meta(
              max_length=MAX_EVENT_TOKENS)]), MAX_EVENT_TOKENS, "token ids")}
_SMALL_FIELD = 4096  # bytes: a scalar field longer than this is not one (read as its wrong type)


def _events_decoder(max_events: int) -> msgspec.msgpack.Decoder:
    if max_events == MAX_BATCH_EVENTS:
        return _EVENTS
    return msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], msgspec.Meta(max_length=max_events)])


_EVENTS = msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BATCH_EVENTS)])


def _fast_event(ev):
    """A typed event as the normalised form (hashes folded to [0, 2**64))."""
    if ev.__class__ is _WireStored:
        hashes = ev.block_hashes
        if any(h < 0 for h in hashes):
            hashes = [h & HASH_MASK for h in hashes]
        parent = ev.parent_block_hash
        return Stored(hashes, None if parent is None else parent & HASH_MASK,
                      ev.token_ids, ev.block_size,
                      ev.medium, ev.lora_id)
    if ev.__class__ is _WireRemoved:
        hashes = ev.block_hashes
        if any(h < 0 for h in hashes):
            hashes = [h & HASH_MASK for h in hashes]
        return Removed(hashes, ev.medium)
    return Cleared()


def _bounded_field(name: str, raw: msgspec.Raw):
    """One field of an event read generically, its lists within their caps."""
    entry = _LISTS.get(name)
    if entry is not None:
        decoder, cap, what = entry
        try:
            return decoder.decode(raw)
        except msgspec.ValidationError as exc:
            if "length" in str(exc):
                raise WireError("malformed", f"event of more than {cap} {what} (cap {cap})") from None
            return _ANY.decode(raw) if len(raw) <= _SMALL_FIELD else None
    if len(raw) > _SMALL_FIELD:
        return _Unreadable
    return _ANY.decode(raw)


class _Unreadable:
    """Stands for a field too large to be what it names: decoding it reports its wrong type."""


def _slow_event(raw: msgspec.Raw):
    """An event the typed decoder refused (the pre-0.24 array form, a hash as bytes, a field of
    the wrong type, an unknown type): read field by field within the caps, then as before."""
    try:
        shape = _SHAPE.decode(raw)
    except msgspec.ValidationError as exc:
        if "length" in str(exc):
            raise WireError("malformed", "event with more than 64 fields") from None
        raise WireError("malformed", "event is not a tagged map or array") from None
    if isinstance(shape, dict):
        obj = {k: _bounded_field(k, v) for k, v in shape.items()}
    elif shape:
        head = _ANY.decode(shape[0]) if len(shape[0]) <= _SMALL_FIELD else None
        names = _ARRAY_FIELDS.get(head, ()) if isinstance(head, str) else ()
        obj = [head] + [_bounded_field(names[i] if i < len(names) else "", v)
                        for i, v in enumerate(shape[1:])]
    else:
        obj = []
    return decode_event(obj)


def decode_batch(payload: bytes, max_events: int = MAX_BATCH_EVENTS) -> Batch:
    """A payload `[ts, events, dp_rank]` as a Batch. Raises WireError when the payload as a whole
    is unreadable or too large (past MAX_BATCH_BYTES, `max_events`, MAX_BATCH_BLOCKS hashes or
    MAX_BATCH_TOKENS token ids: refused before more than the cap is decoded) or its DP rank is
    outside 0..MAX_DP_RANK - 1; a bad event inside (past MAX_EVENT_BLOCKS hashes, say) is
    skipped and counted in the Batch."""
    if len(payload) > MAX_BATCH_BYTES:
        raise WireError("too_large", f"payload of {len(payload)} bytes (cap {MAX_BATCH_BYTES})")
    try:
        outer = _OUTER.decode(payload)
    except RecursionError:  # msgspec stops a payload nested deeper than the interpreter allows
        raise WireError("malformed", "payload nested too deep to be a batch") from None
    except msgspec.ValidationError:
        raise WireError("malformed", "payload is not [ts, events, dp_rank]") from None
    except (msgspec.DecodeError, ValueError) as exc:
        raise WireError("malformed", f"not msgpack: {exc}") from None
    if len(outer) < 2:
        raise WireError("malformed", "payload is not [ts, events, dp_rank]")
    try:
        ts = _TS.decode(outer[0])
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise WireError("malformed", "batch timestamp is not a number") from None
    try:
        raws = _events_decoder(max_events).decode(outer[1])
    except msgspec.ValidationError as exc:
        if "length" in str(exc):
            raise WireError("too_large", f"batch of more than {max_events} events (cap {max_events})") from None
        raise WireError("malformed", "payload is not [ts, events, dp_rank]") from None
    except (msgspec.DecodeError, ValueError) as exc:
        raise WireError("malformed", f"not msgpack: {exc}") from None
    rank = None
    if len(outer) > 2:
        try:
            rank = _RANK.decode(outer[2])
        except (msgspec.ValidationError, msgspec.DecodeError):
            rank = None  # not an int: read as "no rank", as vLLM's own decoder would fail to
        if rank is not None and not 0 <= rank < MAX_DP_RANK:
            raise WireError("malformed", f"data_parallel_rank {rank} is outside 0..{MAX_DP_RANK - 1}")
    out = Batch(float(ts), [], rank)
    blocks = tokens = 0
    for raw in raws:
        try:
            try:
                ev = _fast_event(_FAST.decode(raw))
            except (msgspec.ValidationError, msgspec.DecodeError):
                ev = _slow_event(raw)
        except WireError as exc:
            out.malformed += 1
            if len(out.problems) < 4:
                out.problems.append(str(exc))
            continue
        except RecursionError:  # msgspec stops an event nested deeper than the interpreter allows
            out.malformed += 1
            if len(out.problems) < 4:
                out.problems.append("event nested too deep")
            continue
        if ev is None:
            out.unknown += 1
            if len(out.problems) < 4:
                out.problems.append(f"unknown event type {_type_name(raw)!r}")
            continue
        if ev.kind != "cleared":
            blocks += len(ev.block_hashes)
            if ev.kind == "stored" and ev.token_ids:
                tokens += len(ev.token_ids)
            if blocks > MAX_BATCH_BLOCKS or tokens > MAX_BATCH_TOKENS:
                raise WireError("too_large", f"batch of more than {MAX_BATCH_BLOCKS} block hashes "
                                f"or {MAX_BATCH_TOKENS} token ids (the caps)")
        out.events.append(ev)
    return out


def _type_name(raw: msgspec.Raw) -> str:
    try:
        shape = _SHAPE.decode(raw)
    except msgspec.ValidationError:
        return "?"
    head = shape.get("type") if isinstance(shape, dict) else shape[0] if shape else None
    if head is None or len(head) > _SMALL_FIELD:
        return "?"
    return str(_ANY.decode(head))[:40]


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
