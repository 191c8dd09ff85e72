"""Recordings written by an earlier build still open and replay as that build replayed them.

The files in tests/allocator/recordings/ hold their events mostly as "cols1" segments (the
columns format before "cols2", written by commit 6302427; `make_cols1.py` there made them).
Beside each, the live pool's block map and stats at a few points, taken while it ran: a replay
of the file must answer them again, and the file must open as a file from elsewhere too (every
event checked and replayed). The prefix-caching pool's sequence events have the shorter shapes
that build recorded, without what each block became: its map cannot be rebuilt, its counters
can.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
from pathlib import Path

import pytest

from allocator.history import map_runs
from allocator.history.recording import RecordedPool, open_untrusted, read_recording

HERE = Path(__file__).resolve().parent / "recordings"
FILES = sorted(HERE.glob("cols1-*.kvrec"))
EXACT = [p for p in FILES if p.stem != "cols1-prefix"]


def segment_formats(path: Path) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = set()
        for (blob,) in db.execute("SELECT blob FROM segments"):
            data = pickle.loads(blob)
            out.add(data[0] if isinstance(data, tuple) else "rows")
        return out
    finally:
        db.close()


def test_the_fixtures_are_there() -> None:
    assert [p.stem for p in FILES] == ["cols1-contiguous", "cols1-paged", "cols1-prefix", "cols1-tiered"]


@pytest.mark.parametrize("path", EXACT, ids=lambda p: p.stem)
def test_an_old_recording_replays_every_point_as_the_pool_was(path: Path) -> None:
    assert "cols1" in segment_formats(path)  # the fixture still holds the old format
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    meta, view = read_recording(path)
    assert view.first_seq == expected[0]["seq"] and view.last_seq == expected[-1]["seq"]
    for point in expected:
        rep = view.replay_to(point["seq"])
        assert map_runs(rep.owner, rep.state) == point["map"], point["seq"]
        assert view.stats_at(point["seq"]) == point["stats"], point["seq"]
    events = view.events(after=view.first_seq, limit=10_000)
    assert [e["seq"] for e in events] == list(range(view.first_seq + 1, view.last_seq + 1))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_an_old_recording_opens_as_a_file_from_elsewhere(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    pool = open_untrusted(path, "old", max_blocks=1 << 20, label=path.name)
    assert isinstance(pool, RecordedPool)
    stats = pool.stats()
    if path in EXACT:
        assert stats == expected[-1]["stats"]
    assert stats["counters"] == expected[-1]["stats"]["counters"]
    assert pool.history.view().first_seq == expected[0]["seq"]


def test_an_old_prefix_recording_keeps_its_counters_and_its_events() -> None:
    path = HERE / "cols1-prefix.kvrec"
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    _, view = read_recording(path)
    for point in expected:
        stats = view.stats_at(point["seq"])
        assert stats["counters"] == point["stats"]["counters"], point["seq"]
        assert stats["allocation_count"] == point["stats"]["allocation_count"], point["seq"]
    first = view.replay_to(view.first_seq)
    assert map_runs(first.owner, first.state) == expected[0]["map"]
    shapes = {(e["type"], len(e)) for e in view.events(after=view.first_seq, limit=10_000)}
    assert {("open", 7), ("append", 6), ("close", 5), ("stored", 9)} <= shapes  # seq, ts, type + the old fields
