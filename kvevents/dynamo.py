"""NVIDIA Dynamo's KV-event wire (its event plane, ai-dynamo 1.x), decoded to kvscope's form.

What a Dynamo worker's `KvEventPublisher` sends (read from `lib/runtime/src/transports/
event_plane/` and `lib/kv-router/src/protocols.rs`, and checked against the 1.6.1 wheel):

- ZeroMQ (the default event plane): the worker binds a PUB socket (its endpoint is in Dynamo's
  discovery) and sends `[topic, publisher_id u64 BE, sequence u64 BE, frame]`; the frame is a
  5-byte header (version 1, payload length u32 BE) and the envelope. NATS core: the message on
  subject `namespace.{ns}.component.{comp}[.endpoint.{ep}].kv-events` is the envelope itself.
- The envelope, MessagePack with named fields (`rmp_serde::to_vec_named`): `{publisher_id,
  sequence, published_at (ms), topic, payload}`; the sequence counts from 0 per publisher.
- The payload: a list of `RouterEvent {worker_id, storage_tier (device | host_pinned | disk |
  external), residency_domain?, event: KvCacheEvent {event_id, data, dp_rank}}` (one
  RouterEvent alone in older releases); `data` is `{"stored": {parent_hash, start_position?,
  blocks: [{block_hash, tokens_hash, mm_extra_info?}]}}`, `{"removed": {block_hashes}}`, or
  `"cleared"` (also `{"cleared": null}`). Each struct may come positional (an array in
  declaration order) instead of named.

Keys: `block_hash` is the engine's own (chained) hash, `tokens_hash` Dynamo's content hash of
the block's tokens (XXH3-64, seed 1337, over the token ids as little-endian u32), the same on
every worker. A stored block is keyed by its `tokens_hash` under its parent's key (Dynamo's
radix tree walks the same chain), so workers share blocks; kvscope's index takes them as blocks
of one "token", the token being the tokens_hash (`HASH_KEYED_BLOCK_SIZE`). An event whose blocks
lack a tokens_hash is keyed by the engine's hashes. `storage_tier` is kept as each event's
medium (`GPU` for device, `TIERS`), a `cleared` one's included (it clears that tier, as
Dynamo's per-tier indexers do); the index keeps each tier apart (kvevents/tiers.py).

Bounded: a payload past MAX_BATCH_BYTES is refused; lists are checked against the caps before
they are built (typed decoding); the positional form, decoded generically, only up to
MAX_POSITIONAL_BYTES a RouterEvent. Unknown fields are ignored; a missing required field makes
that event malformed (counted), never an error of the batch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from .codec import (
    HASH_MASK,
    MAX_BATCH_BLOCKS,
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_DP_RANK,
    MAX_EVENT_BLOCKS,
    Batch,
    Cleared,
    Removed,
    Stored,
    WireError,
    norm_hash,
)

FRAME_VERSION = 1
FRAME_HEADER = 5
TOKENS_HASH_SEED = 1337
HASH_KEYED_BLOCK_SIZE = 1  # a tokens_hash-keyed block is one "token" (its hash) to the index
MAX_POSITIONAL_BYTES = 1 << 20
# Dynamo's StorageTier as an event's medium (vLLM's names where vLLM has one; kvevents/tiers.py
# maps each to kvscope's tier: gpu, cpu, disk, external).
TIERS = {"device": "GPU", "host_pinned": "CPU_PINNED", "disk": "DISK", "external": "EXTERNAL"}
TIER_OF_MEDIUM = {v: k for k, v in TIERS.items()}
KV_EVENTS_TOPIC = "kv-events"


@dataclass(slots=True)
class Envelope:
    publisher_id: int
    sequence: int
    payload: bytes
    topic: str = ""
    published_at: int | None = None  # ms since the epoch


@dataclass(slots=True)
class RouterBatch:
    """One payload's RouterEvents, as kvscope batches: one per run of events of one (worker,
    DP rank), in order, plus what was skipped."""

    parts: list[tuple[int, Batch]] = field(default_factory=list)  # (worker_id, batch)
    malformed: int = 0
    problems: list[str] = field(default_factory=list)
    tier_blocks: dict[str, int] = field(default_factory=dict)  # stored blocks per tier


# -- typed decoders (the named form; caps checked before a list is built) -------------------------
class _Envelope(msgspec.Struct, gc=False):
    publisher_id: int
    sequence: int
    payload: bytes
    topic: str = ""
    published_at: int | None = None


class _Block(msgspec.Struct, gc=False):
    block_hash: int
    tokens_hash: int | None = None


class _Stored(msgspec.Struct, gc=False):
    blocks: Annotated[list[_Block], msgspec.Meta(max_length=MAX_EVENT_BLOCKS)]
    parent_hash: int | None = None


class _Removed(msgspec.Struct, gc=False):
    block_hashes: Annotated[list[int], msgspec.Meta(max_length=MAX_EVENT_BLOCKS)]


class _Event(msgspec.Struct, gc=False):
    event_id: int
    data: Annotated[dict[str, msgspec.Raw], msgspec.Meta(min_length=1, max_length=1)] | str
    dp_rank: int = 0


class _RouterEvent(msgspec.Struct, gc=False):
    worker_id: int
    event: _Event
    storage_tier: str = "device"


_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)
_EVENTS = msgspec.msgpack.Decoder(Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BATCH_EVENTS)])
_ROUTER = msgspec.msgpack.Decoder(_RouterEvent)
_STORED = msgspec.msgpack.Decoder(_Stored)
_REMOVED = msgspec.msgpack.Decoder(_Removed)
_ANY = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


def signed64(h: int) -> int:
    """A u64 as the signed int the index's token keys take."""
    return h - (1 << 64) if h >= 1 << 63 else h


def tokens_hash_seed(lora_name: str | None = None) -> int:
    """The XXH3 seed of Dynamo's tokens_hash: 1337, plus the XXH3-64 of the LoRA adapter's name
    for a LoRA's blocks (wrapping; an empty name is no adapter), as Dynamo's
    `compute_block_hash_for_seq` mixes it in."""
    if not lora_name:
        return TOKENS_HASH_SEED
    import xxhash

    return (TOKENS_HASH_SEED + xxhash.xxh3_64_intdigest(lora_name.encode())) & HASH_MASK


def tokens_hashes(tokens: list[int], block_size: int, lora_name: str | None = None) -> list[int]:
    """Dynamo's tokens_hash of each full block of `tokens` (XXH3-64 over the token ids as
    little-endian u32, seeded by `tokens_hash_seed`), as signed ints: what a tokens_hash-keyed
    engine's blocks are keyed by. Token ids must fit in a u32 (struct.error otherwise)."""
    import xxhash

    seed = tokens_hash_seed(lora_name)
    out = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        raw = struct.pack(f"<{block_size}I", *tokens[i:i + block_size])
        out.append(signed64(xxhash.xxh3_64_intdigest(raw, seed=seed)))
    return out


# -- the ZeroMQ frame and the envelope ---------------------------------------------------------------
def unframe(frame: bytes) -> bytes:
    """The envelope inside a ZeroMQ data frame (5-byte header: version, length u32 BE)."""
    if len(frame) < FRAME_HEADER:
        raise WireError("frames", f"data frame of {len(frame)} bytes, shorter than its header")
    if frame[0] != FRAME_VERSION:
        raise WireError("frames", f"frame version {frame[0]}, expected {FRAME_VERSION}")
    n = int.from_bytes(frame[1:5], "big")
    if n != len(frame) - FRAME_HEADER:
        raise WireError("frames", f"frame says {n} payload bytes, carries {len(frame) - FRAME_HEADER}")
    return frame[FRAME_HEADER:]


def decode_envelope(data: bytes) -> Envelope:
    """An EventEnvelope, named (Dynamo's form) or positional `[publisher_id, sequence,
    published_at, topic, payload]`. Raises WireError."""
    if len(data) > MAX_BATCH_BYTES + 4096:
        raise WireError("too_large", f"envelope of {len(data)} bytes (cap {MAX_BATCH_BYTES})")
    try:
        e = _ENVELOPE.decode(data)
        return Envelope(e.publisher_id, e.sequence, e.payload, e.topic, e.published_at)
    except msgspec.ValidationError as exc:
        named_error = str(exc)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WireError("malformed", f"envelope is not msgpack: {exc}") from None
    try:
        arr = msgspec.msgpack.decode(data, type=list[Any])
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        raise WireError("malformed", f"envelope: {named_error}") from None
    if len(arr) < 5 or not all(isinstance(x, int) and not isinstance(x, bool) for x in arr[:2]) \
            or not isinstance(arr[4], bytes):
        raise WireError("malformed", f"envelope: {named_error}")
    return Envelope(arr[0], arr[1], arr[4], arr[3] if isinstance(arr[3], str) else "",
                    arr[2] if isinstance(arr[2], int) else None)


# -- RouterEvents ------------------------------------------------------------------------------------
def decode_router_events(payload: bytes) -> RouterBatch:
    """A payload's RouterEvents (a list of them, or one alone) as kvscope batches. Raises
    WireError when the payload as a whole is unreadable or too large; a bad event is counted."""
    if len(payload) > MAX_BATCH_BYTES:
        raise WireError("too_large", f"payload of {len(payload)} bytes (cap {MAX_BATCH_BYTES})")
    try:
        raws = _EVENTS.decode(payload)
    except msgspec.ValidationError as exc:
        if "length" in str(exc):
            raise WireError("too_large", f"more than {MAX_BATCH_EVENTS} events (cap)") from None
        raws = [msgspec.Raw(payload)]  # one RouterEvent alone (a map)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise WireError("malformed", f"payload is not msgpack: {exc}") from None
    if raws and _looks_positional_router_event(raws):
        raws = [msgspec.Raw(payload)]
    out = RouterBatch()
    blocks = 0
    for raw in raws:
        try:
            worker, rank, tier, ev = _router_event(raw)
        except WireError as exc:
            out.malformed += 1
            if len(out.problems) < 4:
                out.problems.append(str(exc))
            continue
        except RecursionError:
            out.malformed += 1
            continue
        if ev.kind != "cleared":
            blocks += len(ev.block_hashes)
            if blocks > MAX_BATCH_BLOCKS:
                raise WireError("too_large", f"more than {MAX_BATCH_BLOCKS} block hashes (cap)")
            if ev.kind == "stored":
                out.tier_blocks[tier] = out.tier_blocks.get(tier, 0) + len(ev.block_hashes)
        if out.parts and out.parts[-1][0] == worker and out.parts[-1][1].dp_rank == rank:
            out.parts[-1][1].events.append(ev)
        else:
            out.parts.append((worker, Batch(0.0, [ev], rank)))
    return out


def _looks_positional_router_event(raws: list) -> bool:
    """A payload that is itself one positional RouterEvent `[worker_id, ...]` decodes as a list
    too: its first item is an int, where a list of RouterEvents holds maps or arrays."""
    head = bytes(raws[0])[:1]
    return bool(head) and (head[0] <= 0x7F or head[0] in (0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3)
                           or head[0] >= 0xE0)


def _router_event(raw: msgspec.Raw):
    """(worker_id, dp_rank, tier, normalised event) of one RouterEvent."""
    try:
        r = _ROUTER.decode(raw)
    except msgspec.ValidationError:
        return _positional_router_event(raw)
    except msgspec.DecodeError as exc:
        raise WireError("malformed", f"RouterEvent is not msgpack: {exc}") from None
    tier = _tier(r.storage_tier)
    rank = _rank(r.event.dp_rank)
    data = r.event.data
    if isinstance(data, str):
        if data != "cleared":
            raise WireError("malformed", f"event data {data[:40]!r}, not stored/removed/cleared")
        return _worker(r.worker_id), rank, tier, Cleared(medium=TIERS[tier])
    (kind, body), = data.items()
    return _worker(r.worker_id), rank, tier, _typed_data(kind, body, tier)


def _typed_data(kind: str, body: msgspec.Raw, tier: str):
    medium = TIERS[tier]
    try:
        if kind == "stored":
            s = _STORED.decode(body)
            return _stored([b.block_hash for b in s.blocks], [b.tokens_hash for b in s.blocks],
                           s.parent_hash, medium)
        if kind == "removed":
            return Removed([norm_hash(h) for h in _REMOVED.decode(body).block_hashes], medium)
        if kind == "cleared":
            return Cleared(medium=medium)
    except msgspec.ValidationError as exc:
        if "length" in str(exc):
            raise WireError("malformed", f"{kind} event of more than {MAX_EVENT_BLOCKS} blocks") from None
        if len(body) > MAX_POSITIONAL_BYTES:
            raise WireError("malformed", f"{kind} event: {exc}") from None
        return _generic_data(kind, _ANY.decode(body), tier)
    raise WireError("malformed", f"event data {kind[:40]!r}, not stored/removed/cleared")


def _stored(hashes: list, tokens: list, parent, medium: str) -> Stored:
    block_hashes = [norm_hash(h) for h in hashes]
    keyed = bool(tokens) and all(t is not None for t in tokens)
    token_ids = [signed64(norm_hash(t)) for t in tokens] if keyed else None
    return Stored(block_hashes, None if parent is None else norm_hash(parent), token_ids,
                  HASH_KEYED_BLOCK_SIZE if keyed else None, medium)


# -- the positional forms, decoded generically (bounded by size) ---------------------------------------
def _positional_router_event(raw: msgspec.Raw):
    if len(raw) > MAX_POSITIONAL_BYTES:
        raise WireError("malformed", f"RouterEvent of {len(raw)} bytes is not in the named form "
                                     f"(the positional form is read up to {MAX_POSITIONAL_BYTES})")
    obj = _ANY.decode(raw)
    if isinstance(obj, dict):
        missing = [k for k in ("worker_id", "event") if k not in obj]
        if missing:
            raise WireError("malformed", f"RouterEvent without {missing}")
        worker, tier, event = obj["worker_id"], obj.get("storage_tier", "device"), obj["event"]
    elif isinstance(obj, list) and obj:
        # [worker_id, storage_tier?, residency_domain?, event, state_source?]: the event is the
        # first map or array after the worker (the optional strings before it told by value)
        worker, tier, event = obj[0], "device", None
        for item in obj[1:]:
            if isinstance(item, str) and item in TIERS:
                tier = item
            elif isinstance(item, (dict, list)):
                event = item
                break
    else:
        raise WireError("malformed", "RouterEvent is neither a map nor an array")
    if not isinstance(event, (dict, list)):
        raise WireError("malformed", "RouterEvent without an event")
    if isinstance(event, dict):
        if "event_id" not in event or "data" not in event:
            raise WireError("malformed", "KvCacheEvent without event_id or data")
        data, rank = event["data"], event.get("dp_rank", 0)
    else:
        if len(event) < 2:
            raise WireError("malformed", "KvCacheEvent array shorter than [event_id, data]")
        data, rank = event[1], event[2] if len(event) > 2 else 0
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise WireError("malformed", "dp_rank is not an int")
    return _worker(worker), _rank(rank), _tier(tier), _data(data, _tier(tier))


def _data(data, tier: str):
    if isinstance(data, str):
        if data == "cleared":
            return Cleared(medium=TIERS[tier])
        raise WireError("malformed", f"event data {data[:40]!r}, not stored/removed/cleared")
    if isinstance(data, dict) and len(data) == 1:
        (kind, body), = data.items()
    elif isinstance(data, list) and len(data) == 2 and isinstance(data[0], (str, int)):
        kind, body = data  # an enum as [variant, fields]
        kind = {0: "stored", 1: "removed", 2: "cleared"}.get(kind, kind)
    else:
        raise WireError("malformed", "event data is not a one-key map or 'cleared'")
    if not isinstance(kind, str):
        raise WireError("malformed", "event data's variant is not a name")
    return _generic_data(kind, body, tier)


def _generic_data(kind: str, body, tier: str):
    medium = TIERS[tier]
    if kind == "cleared":
        return Cleared(medium=medium)
    if kind == "stored":
        if isinstance(body, dict):
            if "blocks" not in body:
                raise WireError("malformed", "stored event without blocks")
            parent, blocks = body.get("parent_hash"), body["blocks"]
        elif isinstance(body, list) and len(body) in (2, 3):
            parent, blocks = body[0], body[-1]  # [parent_hash, start_position?, blocks]
        else:
            raise WireError("malformed", "stored event is neither a map nor [parent_hash, blocks]")
        if not isinstance(blocks, list) or len(blocks) > MAX_EVENT_BLOCKS:
            raise WireError("malformed", "stored event's blocks is not a list within the cap")
        hashes, tokens = [], []
        for b in blocks:
            if isinstance(b, dict):
                if "block_hash" not in b:
                    raise WireError("malformed", "stored block without block_hash")
                hashes.append(b["block_hash"])
                tokens.append(b.get("tokens_hash"))
            elif isinstance(b, list) and b:
                hashes.append(b[0])
                tokens.append(b[1] if len(b) > 1 else None)
            else:
                raise WireError("malformed", "stored block is neither a map nor an array")
        return _stored(hashes, tokens, parent, medium)
    if kind == "removed":
        hashes = body.get("block_hashes") if isinstance(body, dict) else \
            body[0] if isinstance(body, list) and body else None
        if not isinstance(hashes, list) or len(hashes) > MAX_EVENT_BLOCKS:
            raise WireError("malformed", "removed event without a block_hashes list within the cap")
        return Removed([norm_hash(h) for h in hashes], medium)
    raise WireError("malformed", f"event data {kind[:40]!r}, not stored/removed/cleared")


def _tier(tier) -> str:
    if tier not in TIERS:
        raise WireError("malformed", f"storage_tier {str(tier)[:40]!r}, not one of {sorted(TIERS)}")
    return tier


def _rank(rank: int) -> int:
    if not 0 <= rank < MAX_DP_RANK:
        raise WireError("malformed", f"dp_rank {rank} is outside 0..{MAX_DP_RANK - 1}")
    return rank


def _worker(worker) -> int:
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker <= HASH_MASK:
        raise WireError("malformed", f"worker_id {str(worker)[:40]} is not a u64")
    return worker


# -- encoding (tests, and a simulated Dynamo worker) ---------------------------------------------------
def encode_router_events(events: list[dict]) -> bytes:
    return _ENCODER.encode(events)


def encode_envelope(publisher_id: int, sequence: int, payload: bytes, topic: str = KV_EVENTS_TOPIC,
                    published_at: int = 0) -> bytes:
    return _ENCODER.encode({"publisher_id": publisher_id, "sequence": sequence,
                            "published_at": published_at, "topic": topic, "payload": payload})


def frame(envelope: bytes) -> bytes:
    return bytes([FRAME_VERSION]) + len(envelope).to_bytes(4, "big") + envelope
