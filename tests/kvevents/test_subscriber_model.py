"""The subscriber's sequencing against a model: random drops, replay buffers of any size, engine
restarts. Sockets are replaced by an in-memory engine (same frames); the logic is the real one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.kve_source import RefPrefixCache

from allocator.prefix.mirror import MirrorPool
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


def live(seq: int, hashes=(), parent=None) -> list[bytes]:
    from kvevents.codec import Stored

    events = [Stored(list(hashes), parent, [0] * len(hashes), 1, "GPU")] if hashes else []
    return [b"kv", seq_bytes(seq), encode_batch(events, 1.0)]


def mirror_and_subscriber(replay: bool = False):
    pool = MirrorPool(64, name="m", device="cpu")
    restarts = []
    sub = MemSubscriber("inproc://unused", replay_endpoint="inproc://replay" if replay else None, topic="kv",
                        on_batch=lambda s, b: pool.apply(b.events),
                        on_restart=lambda: (restarts.append(1), pool.apply([Cleared()])))
    sub.engine = MemEngine(8, 0)
    return pool, sub, restarts


def test_one_garbage_seq_far_ahead_is_dropped_as_a_jump_not_billions_lost():
    pool, sub, restarts = mirror_and_subscriber()
    sub.handle(live(0, [1, 2]))
    sub.handle(live(2**63 - 1, [66]))  # held: garbage or a new numbering?
    assert sub.lost_batches == 0 and sub.last_seq == 0
    sub.handle(live(1, [3], 2))  # the old numbering goes on: it was garbage
    st = sub.status()
    assert st["lost_batches"] == 0 and st["restarts"] == 0 and st["gaps"] == 0, st
    assert st["errors"]["seq_jump"] == 1 and str(2**63 - 1) in st["last_error"]
    assert pool.cached_hashes() == {1, 2, 3} and sub.last_seq == 1 and restarts == []
    for first in (2**40, 2**63 - 2):  # far ahead even of a fresh subscriber
        pool, sub, restarts = mirror_and_subscriber()
        sub.handle(live(first, [5]))
        sub.handle(live(0, [6]))
        assert sub.errors["seq_jump"] == 1 and sub.lost_batches == 0 and pool.cached_hashes() == {6}


def test_a_jump_the_next_batch_continues_is_a_restart_on_a_new_numbering():
    pool, sub, restarts = mirror_and_subscriber(replay=True)
    for s in range(3):
        sub.handle(live(s, [10 + s]))
    base = 5 * 2**32
    sub.handle(live(base, [100]))
    sub.handle(live(base + 1, [101], 100))
    st = sub.status()
    assert st["restarts"] == 1 and restarts == [1] and st["lost_batches"] == 0 and st["replays"] == 0, st
    assert st["errors"]["seq_jump"] == 0 and sub.last_seq == base + 1
    assert pool.cached_hashes() == {100, 101} and pool.check() == []
    sub.handle(live(base + 3, [103]))  # an ordinary gap on the new numbering is still a gap
    assert sub.status()["gaps"] == 1 and sub.lost_batches == 1


def test_a_jump_within_the_gap_bound_is_still_counted_lost():
    pool, sub, _ = mirror_and_subscriber()
    sub.max_gap = 100
    sub.handle(live(0, [1]))
    sub.handle(live(100, [2]))
    assert sub.lost_batches == 99 and sub.errors["seq_jump"] == 0
    sub.handle(live(202, [3]))
    assert sub.lost_batches == 99 and sub.last_seq == 100  # 101 past: held


def test_a_replay_answering_a_seq_far_past_the_ask_is_an_error_not_a_loss():
    pool, sub, _ = mirror_and_subscriber(replay=True)
    sub.handle(live(0, [1]))
    sub.engine.buffer = [(2**62, encode_batch([], 1.0))]
    sub.handle(live(3, [4]))  # asks from 1; the answer is garbage
    st = sub.status()
    assert st["errors"]["replay"] == 1 and st["lost_batches"] == 2 and sub.last_seq == 3, st


def test_a_payload_nested_100000_deep_is_malformed_not_internal():
    pool, sub, _ = mirror_and_subscriber()
    sub.handle(live(0, [1]))
    sub.handle([b"kv", seq_bytes(1), b"\x93\x00\x91" + b"\x91" * 100_000 + b"\x90\x00"])
    sub.handle([b"kv", seq_bytes(2), b"\x91" * 100_000 + b"\x90"])
    sub.handle(live(3, [2]))
    st = sub.status()
    assert st["errors"]["malformed"] == 2, st
    assert st["errors"]["internal"] == 0 and pool.cached_hashes() == {1, 2} and st["lost_batches"] == 0
