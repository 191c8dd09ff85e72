"""Typed errors of the allocator core.

Every failure is an exception carrying plain values, never a sentinel return. The server maps
them to HTTP statuses in one place (app/http/errors.py): NotFound -> 404, Conflict -> 409,
InvalidRequest -> 422, TooLarge (ExceedsCapacity among them) -> 413, OutOfMemory -> 507.
"""

from __future__ import annotations

from .vocab import OOM_CAUSES


class KVScopeError(Exception):
    """Base class: `code` is a stable machine-readable name, `details()` plain JSON values."""

    code = "error"

    def details(self) -> dict:
        return {}


class InvalidRequest(KVScopeError, ValueError):
    """The caller asked for something malformed (zero size, bad name, unknown policy...)."""

    code = "invalid_request"


class TooLarge(InvalidRequest):
    """A request exceeds a configured cap (pool size, batch length, body size)."""

    code = "too_large"


class ExceedsCapacity(TooLarge):
    """A request larger than everything the pool (or a cache's budget) could ever hold: it can
    never succeed, unlike OutOfMemory, which may once memory is freed."""

    def __init__(self, requested: int, capacity: int, what: str = "pool") -> None:
        super().__init__(f"requested {requested} bytes, more than the {what}'s whole capacity of "
                         f"{capacity} bytes: it can never fit")
        self.requested = requested
        self.capacity = capacity
        self.what = what

    def details(self) -> dict:
        return {"requested_bytes": self.requested, "capacity_bytes": self.capacity, "of": self.what}


class NotFound(KVScopeError, KeyError):
    """An allocation id, cache key or pool name that does not exist."""

    code = "not_found"

    def __init__(self, kind: str, ident: object) -> None:
        super().__init__(f"{kind} {ident!r} not found")
        self.kind = kind
        self.ident = ident

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return self.args[0]

    def details(self) -> dict:
        return {"kind": self.kind, "id": self.ident}


class CorruptState(RuntimeError):
    """The compiled bookkeeping contradicts itself (a broken chain, a slot outside its array):
    a bug or a memory overwrite, never the caller's input. Raised by the readers that walk a
    compiled structure instead of following a bad index; `check()` names the same damage as a
    problem string. Deliberately not a KVScopeError: the server answers it as an internal error."""


class Conflict(KVScopeError):
    """The request clashes with current state (name taken, entry pinned, pool busy...)."""

    code = "conflict"


class OutOfMemory(KVScopeError):
    """Not enough memory for a request.

    `cause` is "capacity" when the free total is below the request, "fragmentation" when the
    free total would suffice but no free extent is large enough (a contiguous arena's holes, or
    a tiered pool's memory sitting in tiers the request cannot use).
    All sizes are bytes.
    """

    code = "out_of_memory"

    def __init__(self, requested: int, free: int, largest_free: int, cause: str) -> None:
        assert cause in OOM_CAUSES, cause
        super().__init__(
            f"out of memory ({cause}): requested {requested} bytes, {free} bytes free, "
            f"largest free extent {largest_free} bytes"
        )
        self.requested = requested
        self.free = free
        self.largest_free = largest_free
        self.cause = cause

    def details(self) -> dict:
        return {
            "requested_bytes": self.requested,
            "free_bytes": self.free,
            "largest_free_bytes": self.largest_free,
            "cause": self.cause,
        }


def positive_int(value: object, what: str, *, minimum: int = 1) -> int:
    """`value` if it is an int (not a bool) of at least `minimum`, else InvalidRequest naming
    `what`. The one check for every count and size a caller hands the core."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidRequest(f"{what} must be {'positive' if minimum == 1 else f'at least {minimum}'}, got {value}")
    return value


# The states an allocation's blocks may take (allocator/vocab.py BLOCK_STATES: used, cached,
# pinned); free and shared are the pool's own to set.
ALLOCATION_STATES = (1, 2, 3)


def block_state(state: object) -> int:
    """`state` if it is a state an allocation's blocks may take (USED, CACHED, PINNED), else
    InvalidRequest: the block map keeps it in a byte that check() reads back."""
    if state.__class__ is not int or state not in ALLOCATION_STATES:
        raise InvalidRequest(f"block state must be 1 (used), 2 (cached) or 3 (pinned), got {state!r}")
    return state


class PrefixOutOfMemory(OutOfMemory):
    """A prefix-caching pool cannot find the blocks a sequence needs: every block is held
    (free + idle cached blocks fall short). Carries the block counts that explain why."""

    def __init__(self, needed_blocks: int, available_blocks: int, block_bytes: int,
                 held_blocks: int, cached_blocks: int) -> None:
        free = available_blocks * block_bytes
        super().__init__(needed_blocks * block_bytes, free, free, "capacity")
        self.args = (
            f"out of memory: {needed_blocks} blocks needed, {available_blocks} free or evictable "
            f"({held_blocks} held by sequences or allocations, {cached_blocks} idle cached)",
        )
        self.needed_blocks = needed_blocks
        self.available_blocks = available_blocks
        self.held_blocks = held_blocks
        self.cached_blocks = cached_blocks

    def details(self) -> dict:
        return {**super().details(), "needed_blocks": self.needed_blocks,
                "available_blocks": self.available_blocks, "held_blocks": self.held_blocks,
                "cached_blocks": self.cached_blocks}
