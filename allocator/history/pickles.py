"""The restricted unpickling of what the history stores: plain data only, every pickle from a
file walked before it is loaded."""

from __future__ import annotations

import io
import pickle
import pickletools


class _PlainUnpickler(pickle.Unpickler):
    """Loads only plain data (tuples, lists, dicts, numbers, strings, bytes, None) and ranges:
    a recording file from elsewhere cannot make the loader import or call anything else."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("builtins", "range"):
            return range
        raise pickle.UnpicklingError(f"recording data may not name {module}.{name}")


def safe_loads(blob: bytes, bounded: bool = False, refs: bool = True):
    """`pickle.loads` restricted to what the history writes. `bounded` (bytes from a file):
    `check_pickle(blob, refs)` first, so no size the pickle declares is allocated before it is
    seen to fit. Raises pickle.UnpicklingError."""
    if bounded:
        check_pickle(blob, refs)
    return _PlainUnpickler(io.BytesIO(blob)).load()


_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def check_pickle(blob, refs: bool = True) -> None:
    """Raises pickle.UnpicklingError unless `blob` is bytes whose every opcode is whole: each
    frame, bytes and string it declares fits in what is left of it. The C unpickler allocates
    a declared size before reading it (a 2^50-byte BINBYTES8 is a MemoryError, a 2^63-byte
    frame an OverflowError); this walk allocates at most the blob's own size, in time linear
    in its opcodes.
    `refs` False: no object may be used twice (segments are written without a memo; a list
    of lists each holding the one before twice is 2^depth elements to whoever walks it)."""
    if blob.__class__ is not bytes:
        raise pickle.UnpicklingError(f"recording data is {type(blob).__name__}, not bytes")
    f = io.BytesIO(blob)
    try:
        for op, arg, pos in pickletools.genops(f):
            if op.name == "FRAME" and arg > len(blob) - f.tell():
                raise pickle.UnpicklingError(f"a pickle frame of {arg} bytes at offset {pos} "
                                             f"runs past the data's {len(blob)} bytes")
            if not refs and op.name in _MEMO_GETS:
                raise pickle.UnpicklingError(f"recorded events refer back to an object (offset {pos}); "
                                             "events are written with no shared objects")
    except (ValueError, OverflowError) as exc:  # pickletools: a length past the end, a bad opcode
        raise pickle.UnpicklingError(f"recording data is not a whole pickle: {exc}") from None


__all__ = ["check_pickle", "safe_loads"]
