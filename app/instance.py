"""Which server process this is: a random id and the start time, in `hello` and `/healthz`.

Everything the server holds (pools, their bytes, event history, workloads) lives in memory and
is gone after a restart; a client that sees another `instance_id` after reconnecting knows its
history was reset rather than that the pool emptied.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Instance:
    """Identity of one server process; never changes while it runs."""

    id: str
    started_at: float  # Unix time, seconds

    @classmethod
    def new(cls) -> Instance:
        return cls(secrets.token_hex(8), time.time())

    def describe(self) -> dict:
        return {"instance_id": self.id, "started_at": self.started_at}
