"""BlockMap: who owns each block and in what state, with change tracking for the stream.

The class is compiled (allocator/_blockmap.pxi, part of the `_core` extension) so the pool's C
code stamps its arrays directly; this module names its constants.
"""

from __future__ import annotations

from .._core import BlockMap
from ..errors import ALLOCATION_STATES
from ..vocab import BLOCK_STATES, STATE_NAMES

# State codes (allocator/vocab.py names them; the codes are the stream's wire format).
FREE, USED, CACHED, PINNED, SHARED = (BLOCK_STATES[n] for n in ("free", "used", "cached", "pinned", "shared"))
NO_OWNER = -1
assert ALLOCATION_STATES == (USED, CACHED, PINNED), "errors.block_state and the vocabulary disagree"

# A change marks the chunk of CHUNK blocks holding it. 64 blocks keep a delta's overhead small
# (a run of 64 changed cells costs 64*5 bytes) while the version array of a 1M-block pool stays
# at 15,625 entries, scanned with numpy in microseconds. (The compiled map uses the same 6.)
CHUNK_SHIFT = 6
CHUNK = 1 << CHUNK_SHIFT

__all__ = ["BlockMap", "CACHED", "CHUNK", "CHUNK_SHIFT", "FREE", "NO_OWNER", "PINNED",
           "SHARED", "STATE_NAMES", "USED"]
