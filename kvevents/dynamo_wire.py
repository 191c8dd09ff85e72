"""Following a Dynamo worker's KV events: its ZeroMQ frames and envelopes over a Subscriber."""

from __future__ import annotations

import time

from .codec import Batch, WireError, encode_batch
from .dynamo import decode_envelope, decode_router_events, unframe

MAX_SEQUENCE = (1 << 63) - 1


class DynamoWire:
    """Mixin over a `Subscriber` for a Dynamo worker's PUB socket: messages `[topic,
    publisher_id u64 BE, sequence u64 BE, frame]`, sequenced per publisher. A new publisher_id
    on the socket is the worker's publisher started again (its sequence counts from 0): a
    restart, as a vLLM engine's seq going back is. Dynamo has no replay socket (its routers
    recover a gap from the worker's own indexer over its request plane), so a gap is counted in
    `lost_batches`. The storage tier of every stored block is counted (`tier_blocks`); the
    recording keeps the decoded batches in vLLM's format, so a fleet recording plays back the
    same whatever the engines spoke."""

    publisher_id: int | None = None
    worker_id: int | None = None

    def handle(self, frames: list[bytes]) -> None:
        if len(frames) != 4:
            self._error("frames", f"message of {len(frames)} frames, expected 4 (topic, "
                                  "publisher_id, sequence, frame)")
            return
        _topic, pid, seq, payload = frames
        if len(pid) != 8 or len(seq) != 8:
            self._error("frames", "publisher_id and sequence frames must be 8 bytes each")
            return
        publisher, sequence = int.from_bytes(pid, "big"), int.from_bytes(seq, "big")
        if sequence > MAX_SEQUENCE:
            self._error("frames", f"sequence {sequence} past 2**63")
            return
        if self.publisher_id is not None and publisher != self.publisher_id:
            self.restarted()
        self.publisher_id = publisher
        self.sequenced(sequence, payload)

    def restarted(self) -> None:
        """Another publisher took over the stream: what the last one said no longer holds."""
        self.restarts += 1
        self.last_seq = self.last_live = None
        self._held = None
        if self._on_restart is not None:
            self._call(self._on_restart)

    def decode(self, payload: bytes) -> list[Batch]:
        envelope = decode_envelope(unframe(payload) if self.framed else payload)
        return self.batches_of(envelope.payload, envelope.published_at)

    framed = True  # ZeroMQ wraps the envelope in a frame; NATS does not

    def batches_of(self, payload: bytes, published_at: int | None) -> list[Batch]:
        routed = decode_router_events(payload)
        ts = published_at / 1000.0 if published_at else time.time()
        tiers = getattr(self, "tier_blocks", None)
        if tiers is None:
            tiers = self.tier_blocks = {}
        for tier, n in routed.tier_blocks.items():
            tiers[tier] = tiers.get(tier, 0) + n
        out = []
        for worker, batch in routed.parts:
            self.worker_id = worker
            batch.ts = ts
            out.append(batch)
        if not out:
            out.append(Batch(ts, [], None))
        out[0].malformed += routed.malformed
        out[0].problems.extend(routed.problems)
        if self.recorder is not None:
            for batch in out:
                self._record_batch(batch)
        return out

    def _record(self, seq: int, payload: bytes) -> None:
        """Recorded once decoded (`_record_batch`), in vLLM's format."""

    def _record_batch(self, batch: Batch) -> None:
        try:
            self.recorder.write(time.time(), self.last_seq or 0, b"",
                                encode_batch(batch.events, batch.ts, batch.dp_rank))
        except (OSError, ValueError, WireError) as exc:
            self._error("internal", f"recording: {exc}")

    def status(self) -> dict:
        out = super().status()
        out["wire"] = "dynamo"
        out["worker_id"] = self.worker_id
        out["publisher_id"] = self.publisher_id
        out["tier_blocks"] = dict(getattr(self, "tier_blocks", None) or {})
        return out
