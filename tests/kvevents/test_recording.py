"""Recordings: written in apply order, read back (a cut tail tolerated), replayed like live."""

from __future__ import annotations

import threading
import time

import pytest
from support.kve_source import RefPrefixCache

from allocator.prefix.mirror import MirrorPool
from kvevents.codec import WireError, encode_batch
from kvevents.recording import Recorder, read, replay_into


def record(path, batches_by_seq):
    rec = Recorder(str(path), "tcp://engine:5557", "kv")
    for seq, payload in batches_by_seq:
        rec.write(time.time(), seq, b"kv", payload)
    rec.close()
    return rec


def test_replay_equals_the_source_and_restarts_clear(tmp_path):
    a, b = RefPrefixCache(seed=1), RefPrefixCache(seed=2)
    rows = [(i, encode_batch(a.step(), 1.0)) for i in range(30)]
    rows += [(i, encode_batch(b.step(), 2.0)) for i in range(10)]  # the engine restarted
    rows[5] = (5, b"\xc1 garbage")  # what the engine sent, undecodable, kept as received
    rows.insert(7, rows[6])  # the same batch twice: skipped, not a restart
    path = tmp_path / "r.kvevents"
    assert record(path, rows).records == 41
    pool = MirrorPool(128, name="r", device="cpu")
    counts = replay_into(str(path), pool)
    assert counts["restarts"] == 1 and counts["errors"] == 1 and counts["batches"] == 39
    assert pool.cached_hashes() == b.cached and pool.check() == []


def test_cut_tail_is_tolerated_and_foreign_files_refused(tmp_path):
    a = RefPrefixCache(seed=3)
    path = tmp_path / "r.kvevents"
    record(path, [(i, encode_batch(a.step(), 1.0)) for i in range(5)])
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a crash while writing the last record
    assert [seq for _, seq, _ in read(str(path))] == [0, 1, 2, 3]
    other = tmp_path / "x"
    other.write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(WireError, match="not a kvscope recording"):
        list(read(str(other)))


def test_speed_and_stop(tmp_path):
    path = tmp_path / "r.kvevents"
    rec = Recorder(str(path))
    a = RefPrefixCache(seed=4)
    for i in range(3):
        rec.write(100.0 + i * 0.05, i, b"", encode_batch(a.step(), 1.0))  # 50 ms apart
    rec.close()
    pool = MirrorPool(64, name="r", device="cpu")
    t = time.monotonic()
    replay_into(str(path), pool, speed=1.0)
    assert time.monotonic() - t >= 0.09
    stop = threading.Event()
    stop.set()
    assert replay_into(str(path), MirrorPool(8, name="s", device="cpu"), stop=stop)["batches"] == 0


def test_a_pool_history_recording_is_named_with_the_command_that_opens_it(tmp_path):
    from allocator import create_pool
    from allocator.history.recording import Recorder as HistoryRecorder

    pool = create_pool("paged", num_blocks=16, block_bytes=64, device="cpu", history=True)
    rec = HistoryRecorder(pool, tmp_path / "history.kvrec")
    pool.allocate(100)
    rec.stop()
    with pytest.raises(WireError, match="pool history recording .*kvscope open FILE"):
        list(read(str(tmp_path / "history.kvrec")))


def test_a_kv_event_recording_named_kvrec_from_before_the_suffixes_split_still_reads(tmp_path):
    a = RefPrefixCache(seed=6)
    rows = [(i, encode_batch(a.step(), 1.0)) for i in range(6)]
    new, old = tmp_path / "r.kvevents", tmp_path / "r.kvrec"
    record(new, rows)
    old.write_bytes(new.read_bytes())  # the same bytes under the old name: read by their magic
    assert [s for _, s, _ in read(str(old))] == [s for _, s, _ in read(str(new))] == list(range(6))
    pools = [MirrorPool(64, name=f"m{i}", device="cpu") for i in range(2)]
    for pool, path in zip(pools, (old, new)):
        replay_into(str(path), pool)
    assert pools[0].cached_hashes() == pools[1].cached_hashes() == a.cached
