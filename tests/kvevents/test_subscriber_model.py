"""The subscriber's sequencing against a model: random drops, replay buffers of any size, engine
restarts. Sockets are replaced by an in-memory engine (same frames); the logic is the real one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kve_source import RefPrefixCache

from allocator.mirror import MirrorPool
from kvevents.codec import Cleared, encode_batch, seq_bytes
from kvevents.subscriber import Subscriber


class MemEngine:
    """Publishes batches with seqs from 0 and keeps the last `buffer_steps` for replay."""

    def __init__(self, buffer_steps: int, seed: int):
        self.buffer_steps = buffer_steps
        self.source = RefPrefixCache(capacity=24, seed=seed)
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = -1

    def publish(self, events) -> list[bytes]:
        self.seq += 1
        payload = encode_batch(events, 1.0)
        self.buffer = (self.buffer + [(self.seq, payload)])[-self.buffer_steps:]
        return [b"kv", seq_bytes(self.seq), payload]


class MemSubscriber(Subscriber):
    engine: MemEngine
    old_framing = False

    def _replay_frames(self, start):
        for seq, payload in list(self.engine.buffer):
            if seq >= start:
                yield [b"", seq_bytes(seq), payload] if self.old_framing else \
                    [b"", b"kv", seq_bytes(seq), payload]
        yield [b"", b"", seq_bytes(-1), b""]


STEP = st.tuples(st.booleans(), st.integers(0, 12))  # (delivered?, restart after it when 0)


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=40), buffer_steps=st.integers(1, 8),
       old_framing=st.booleans(), seed=st.integers(0, 5))
def test_sequencing_matches_the_model(steps, buffer_steps, old_framing, seed):
    pool = MirrorPool(256, name="m", device="cpu")
    sub = MemSubscriber("inproc://unused", replay_endpoint="inproc://replay", topic="kv",
                        on_batch=lambda s, b: pool.apply(b.events),
                        on_restart=lambda: pool.apply([Cleared()]))
    sub.old_framing = old_framing
    engine = sub.engine = MemEngine(buffer_steps, seed)
    expected_lost = lost_in_epoch = 0
    last_applied = None   # the model's last applied seq in the current epoch
    restarts = 0
    fresh = False         # a restart happened: the next message must arrive (else undetectable)
    for i, (delivered, restart_roll) in enumerate(steps + [(True, 1)]):
        frames = engine.publish(engine.source.step())
        if delivered or fresh or i == len(steps):
            s = engine.seq
            nxt = 0 if last_applied is None else last_applied + 1
            if s > nxt:  # replay gives what the buffer still holds from nxt
                oldest = engine.buffer[0][0]
                expected_lost += max(0, oldest - nxt)
                lost_in_epoch += max(0, oldest - nxt)
            last_applied = s
            fresh = False
            sub.handle(frames)
            assert sub.last_seq == s
        if restart_roll == 0 and i < len(steps) and last_applied is not None:
            restarts += 1
            engine.seq, engine.buffer = -1, []
            engine.source = RefPrefixCache(capacity=24, seed=seed + restarts)
            last_applied, fresh, lost_in_epoch = None, True, 0
    assert sub.lost_batches == expected_lost
    assert sub.restarts == restarts
    assert sub.status()["error_count"] == 0
    # A mirror is exact whenever nothing of the current epoch was lost (a restart clears it).
    if lost_in_epoch == 0:
        assert pool.cached_hashes() == engine.source.cached
    assert pool.check() == []
