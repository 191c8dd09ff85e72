"""A pool's history: events and keyframes kept so any past block map can be rebuilt,
recordings (SQLite), exports (memory_viz, CSV) and the charts' series.

    columns.py    the stored forms of events, named (EventColumns, OldColumns, row fields)
    pickles.py    the restricted unpickler every stored pickle goes through
    keyframes.py  Keyframe: the map and numbers right after one event, pages shared
    segments.py   Segment: a run of events as kept in memory or stored in a file
    replay.py     Replayer: what each kind of event does, applied row by row or vectorised
    view.py       HistoryView: a frozen history read at any kept event; stats_of, map_runs
    history.py    History: the pool extension that keeps the history as the pool runs
    recording.py  Recorder, read_recording, RecordedPool: the history in a SQLite file
    exports.py    memory_viz snapshot and CSV; series.py: the charts' figures over a stretch
"""

from .history import DEFAULT_HISTORY_BYTES, History, pool_geometry
from .keyframes import Keyframe
from .recording import RecordedPool, Recorder, read_recording
from .replay import Replayer
from .segments import Segment
from .view import HistoryView, OutsideHistory, map_runs, stats_of

__all__ = ["DEFAULT_HISTORY_BYTES", "History", "HistoryView", "Keyframe", "OutsideHistory", "RecordedPool",
           "Recorder", "Replayer", "Segment", "map_runs", "pool_geometry", "read_recording", "stats_of"]
