"""Giving a retired model's memory back to the operating system.

Called by the repository after versions are unloaded (never on the request path). Closing a backend frees its
sessions, weights and arenas, but glibc keeps freed heap memory in its malloc arenas instead of returning it:
each instance thread allocates from an arena of its own, and a freed region in the middle of an arena is only
handed back by `malloc_trim`. Without it, resident memory stays at its peak after an unload, and a
load/unload cycle leaves more behind (see perf/README.md, "Memory across load/unload cycles").

Elsewhere (musl, macOS, Windows) there is nothing to call, and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Any

log = logging.getLogger("hubserve.memory")

_libc: Any = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        _libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc
        _libc = None


def release_freed_memory() -> bool:
    """Return free heap pages of every malloc arena to the OS. Takes milliseconds; call it on a worker thread
    after an unload. Returns whether anything was released."""
    if _libc is None:
        return False
    return bool(_libc.malloc_trim(0))


__all__ = ["release_freed_memory"]
