"""A pool's history: events and keyframes kept so any past block map can be rebuilt,
recordings (SQLite), exports (memory_viz, CSV) and the charts' series."""
