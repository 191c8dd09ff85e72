"""Recordings: what a Recorder writes replays exactly like the live history, from its start."""

from __future__ import annotations

import random
import sqlite3

import numpy as np
import pytest
from support.kvtest_util import block_past_the_map, prefix_churn

from allocator import KVCache, OutOfMemory, create_pool
from allocator.errors import Conflict, InvalidRequest
from allocator.history.recording import ReadOnly, RecordedPool, Recorder, read_recording

BLOCK = 32


def churn(pool, rng, steps, ids, captured):
    for _ in range(steps):
        try:
            if rng.random() < 0.55 or not ids:
                ids.append(pool.allocate(rng.randint(1, 8 * BLOCK)))
            else:
                pool.free(ids.pop(rng.randrange(len(ids))))
        except OutOfMemory:
            pass
        captured[pool.events.last_seq] = (pool.blockmap.owners_np().copy(), pool.stats())


@pytest.mark.parametrize("strategy", ["paged", "contiguous", "tiered"])
def test_recording_replays_every_point_from_its_start(tmp_path, strategy) -> None:
    pool = create_pool(strategy, num_blocks=128, block_bytes=BLOCK, device="cpu", history=True, event_capacity=16)
    rng, ids, captured = random.Random(7), [], {}
    churn(pool, rng, 40, ids, {})  # before the recording: not in it
    rec = Recorder(pool, tmp_path / "r.kvrec")
    start = pool.events.last_seq
    for _ in range(6):  # flushes land mid-segment, on segment edges and on the ring's tail
        churn(pool, rng, rng.randint(3, 40), ids, captured)
        rec.flush()
    churn(pool, rng, 25, ids, captured)
    info = rec.stop()
    assert info["start_seq"] == start and info["last_seq"] == pool.events.last_seq
    meta, view = read_recording(tmp_path / "r.kvrec")
    assert meta["config"]["strategy"] == strategy and view.first_seq == start
    for seq, (owner, stats) in captured.items():
        assert np.array_equal(view.replay_to(seq).owner, owner)
        assert view.stats_at(seq) == {k: v for k, v in stats.items() if k != "cache"}
    with pytest.raises(Conflict, match="already exists"):
        Recorder(pool, tmp_path / "r.kvrec")
    with pytest.raises(Exception, match="outside the history"):
        view.replay_to(start - 1)


def test_recorded_pool_serves_the_last_state_and_refuses_changes(tmp_path) -> None:
    pool = create_pool("paged", num_blocks=64, block_bytes=BLOCK, device="cpu", history=True)
    KVCache(pool, 32 * BLOCK, "lru")
    rec = Recorder(pool, tmp_path / "p.kvrec")
    pool.cache.put("a", 3 * BLOCK)
    pool.cache.pin("a")
    aid = pool.allocate(5 * BLOCK)
    rec.stop()
    rp = RecordedPool(tmp_path / "p.kvrec", "rec-p")
    live = pool.stats()
    live["cache"].pop("refusals")  # the one cache figure a recording cannot know (no event)
    assert rp.stats() == live and rp.events.last_seq == pool.events.last_seq
    assert np.array_equal(rp.blockmap.states_np(), pool.blockmap.states_np())
    assert [e["type"] for e in rp.events.after(0)] == ["allocate", "put", "state", "allocate"]
    assert rp.config()["recording"]["complete"] is True
    with pytest.raises(ReadOnly):
        rp.allocate(10)
    with pytest.raises(Conflict):
        rp.free(aid)
    assert not hasattr(rp, "defragment")


def test_not_a_recording_is_refused_clearly(tmp_path) -> None:
    (tmp_path / "x.kvrec").write_bytes(b"hello")
    with pytest.raises(InvalidRequest, match="not a kvscope recording"):
        read_recording(tmp_path / "x.kvrec")
    db = sqlite3.connect(tmp_path / "y.kvrec")
    db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    db.commit()
    db.close()
    with pytest.raises(InvalidRequest, match="not a kvscope recording"):
        read_recording(tmp_path / "y.kvrec")
    with pytest.raises(InvalidRequest, match="no recording file"):
        read_recording(tmp_path / "missing.kvrec")


def test_a_recording_that_names_code_is_refused_not_run(tmp_path) -> None:
    import os
    import pickle

    pool = create_pool("paged", num_blocks=16, block_bytes=BLOCK, device="cpu", history=True)
    rec = Recorder(pool, tmp_path / "evil.kvrec")
    pool.allocate(BLOCK)
    rec.stop()

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    db = sqlite3.connect(tmp_path / "evil.kvrec")
    db.execute("UPDATE segments SET blob = ?", (pickle.dumps([Boom()]),))
    db.commit()
    db.close()
    with pytest.raises(InvalidRequest, match="may not name"):
        read_recording(tmp_path / "evil.kvrec")
    assert not (tmp_path / "pwned").exists()


def test_a_kv_event_recording_is_named_with_the_command_that_reads_it(tmp_path) -> None:
    from kvevents.recording import Recorder as EventRecorder

    events = EventRecorder(str(tmp_path / "mirror.kvevents"))
    events.write(1.0, 0, b"kv", b"\x93\x00\x90\x00")
    events.close()
    with pytest.raises(InvalidRequest, match="KV-event recording .*kvscope recording FILE"):
        read_recording(tmp_path / "mirror.kvevents")


@pytest.mark.parametrize("blob", [b"\0" * (16 * 4 * 1000), b"\0" * 8, b"not zlib"])
def test_an_untrusted_recording_whose_keyframe_is_not_the_maps_size_is_refused(tmp_path, blob) -> None:
    import zlib

    from allocator.history.recording import open_untrusted

    pool = create_pool("paged", num_blocks=16, block_bytes=BLOCK, device="cpu", history=True)
    rec = Recorder(pool, tmp_path / "k.kvrec")
    pool.allocate(BLOCK)
    rec.stop()
    assert open_untrusted(tmp_path / "k.kvrec", "ok", 1 << 20, "the file").used_blocks == 1
    db = sqlite3.connect(tmp_path / "k.kvrec")
    db.execute("UPDATE keyframes SET owner_z = ?", (zlib.compress(blob) if blob != b"not zlib" else blob,))
    db.commit()
    db.close()
    with pytest.raises(InvalidRequest, match="the file is corrupt: keyframe"):
        open_untrusted(tmp_path / "k.kvrec", "bad", 1 << 20, "the file")
    with pytest.raises(InvalidRequest, match="too large"):
        open_untrusted(tmp_path / "k.kvrec", "bad", 8, "the file")


def test_recording_of_a_prefix_caching_pool_replays_every_point(tmp_path) -> None:
    pool = create_pool("paged", num_blocks=12, block_bytes=30, tokens_per_block=4, device="cpu", history=True,
                       prefix_caching={"policy": "lru"}, event_capacity=8)
    rec = Recorder(pool, tmp_path / "p.kvrec")
    captured = {}

    def capture():
        stats = pool.stats()
        stats.pop("prefix")
        captured[pool.events.last_seq] = (pool.blockmap.owners_np().copy(), pool.blockmap.states_np().copy(), stats)

    prefix_churn(pool, rec, 120, capture)
    rec.stop()
    assert pool.prefix_stats()["evicted"] > 0
    meta, view = read_recording(tmp_path / "p.kvrec")
    assert view.geometry["prefix_caching"] == {"policy": "lru", "kv_cache": False}
    for seq, (owner, state, stats) in captured.items():
        rep = view.replay_to(seq)
        assert np.array_equal(rep.owner, owner) and np.array_equal(rep.state, state)
        assert view.stats_at(seq) == stats


def test_a_pickle_declaring_more_than_it_holds_is_refused_before_anything_is_allocated() -> None:
    """check_pickle walks the opcodes: a frame, bytes or string longer than what follows it is
    an UnpicklingError, whatever size it claims; a whole pickle of what the history writes passes."""
    import pickle
    import struct

    from allocator.history.pickles import check_pickle, safe_loads
    from allocator.history.segments import Segment

    def claiming(op: bytes, size: int) -> bytes:
        return b"\x80\x05" + op + struct.pack("<Q", size) + b"abc."

    for blob in (claiming(b"\x95", 2**63), claiming(b"\x95", 2**63 - 1), claiming(b"\x8e", 2**50),
                 claiming(b"\x8d", 2**40), claiming(b"\x96", 2**45), b"\x80\x05B" + struct.pack("<I", 2**31) + b".",
                 b"\x80\x05\xff.", b""):
        with pytest.raises(pickle.UnpicklingError):
            check_pickle(blob)
        with pytest.raises(pickle.UnpicklingError):
            safe_loads(blob, bounded=True)
    rows = [(1, 0.5, "allocate", 3, 100, 128, 1, b"\x00" * 8, 1), (2, 0.6, "free", 3, 1, 5, 100)]
    seg = Segment.pack(rows)
    check_pickle(seg.blob)
    assert Segment(1, 2, seg.blob, untrusted=True).rows() == rows


def test_a_local_recording_with_a_crafted_meta_or_geometry_is_invalid_not_a_crash(tmp_path) -> None:
    """read_recording (listing the directory, `kvscope open`) refuses what an upload refuses."""
    import json

    pool = create_pool("tiered", num_blocks=64, block_bytes=BLOCK, device="cpu", history=True)
    Recorder(pool, tmp_path / "base.kvrec").stop()
    base = (tmp_path / "base.kvrec").read_bytes()
    geo = json.dumps({"strategy": "tiered", "num_blocks": 64, "block_bytes": BLOCK, "scatter_fails": True})
    for i, (sql, params, says) in enumerate([
        ("UPDATE meta SET value = ? WHERE key = 'config'", ("[" * 100_000 + "]" * 100_000,), "recursion"),
        ("UPDATE meta SET value = ? WHERE key = 'pool'", ("{" + '"a":{' * 40 + "}" * 41,), "nested more than"),
        ("UPDATE meta SET value = ? WHERE key = 'geometry'", (geo,), "lacks its tiers"),
        ("UPDATE meta SET value = 'Infinity' WHERE key = 'start_seq'", (), "Infinity"),
        ("UPDATE keyframes SET scalars = ?", (b"\x80\x05\x95" + (2**63).to_bytes(8, "little") + b"N.",), "frame"),
    ]):
        path = tmp_path / f"bad{i}.kvrec"
        path.write_bytes(base)
        db = sqlite3.connect(path)
        db.execute(sql, params)
        db.commit()
        db.close()
        with pytest.raises(InvalidRequest, match=f"(?i){says}"):
            read_recording(path)


def test_verdicts_check_a_file_once_while_it_is_unchanged_and_again_once_it_changes(tmp_path) -> None:
    """A file judged (trusted as written, or checked whole) is opened as it is while its size,
    mtime and inode stay; changed, it is checked whole again; a damaged one is refused with the
    kept reason, and after it is mended it opens."""
    from allocator.history import History
    from allocator.history.recording import Verdicts

    pool = create_pool("contiguous", num_blocks=64, block_bytes=BLOCK, device="cpu", event_capacity=8)
    pool.history = History(pool, max_bytes=1 << 26, keyframe_every=16)
    path = tmp_path / "r.kvrec"
    rec = Recorder(pool, path)
    churn(pool, random.Random(5), 120, [], {})
    rec.stop()
    good = path.read_bytes()
    block_past_the_map(path)  # an early event names a block past the map; the end still replays
    RecordedPool(path)  # reading alone does not see it

    verdicts = Verdicts()
    verdicts.trust(path)  # as if this process wrote it: not checked whole
    assert verdicts.sound(path) and verdicts.open(path, "x", 1024, "recording 'r'").name == "x"
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 4096)  # changed: checked whole this time
    assert not verdicts.sound(path)
    with pytest.raises(InvalidRequest, match="recording 'r' is corrupt: its events do not replay"):
        verdicts.open(path, "x", 1024, "recording 'r'")
    assert verdicts.problem(path).startswith("recording 'r' is corrupt")
    with pytest.raises(InvalidRequest, match="recording 'r' is corrupt"):  # the kept verdict
        verdicts.open(path, "x", 1024, "recording 'r'")
    path.write_bytes(good)
    assert verdicts.problem(path) is None
    stats = verdicts.open(path, "x", 1024, "recording 'r'").stats()
    for key in ("used_blocks", "requested_bytes", "allocation_count", "external_fragmentation"):
        assert stats[key] == pool.stats()[key], key
    assert verdicts.sound(path)
