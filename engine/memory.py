"""When the server's freed heap goes back to the operating system: after an unload, and once large requests
stop coming, never while they flow.

Closing a backend frees its sessions, weights and arenas, but glibc keeps freed heap memory in its malloc
arenas instead of returning it: each instance thread allocates from an arena of its own, and a freed region in
the middle of an arena is only handed back by `malloc_trim`. Without it, resident memory stays at its peak
after an unload, and a load/unload cycle leaves more behind (see perf/README.md, "Memory across load/unload
cycles").

The opposite cost, under load: glibc gives the top of the heap back by itself whenever more than its trim
threshold is free there, and raises that threshold only as far as twice the largest block it had to map. Large
requests (a 600 KB image each, a batch of them concatenated) free that much at once many times a second, so
the heap shrank and the next requests faulted it back in, page by page: 3-8 page faults per inference at
`image` c = 16 (perf/history/peers.md, twenty-fifth session). `keep_heap_while_serving` fixes both thresholds
instead, and the frontends hand the heap back themselves once large buffers stop passing (`MemoryReturn`).

Elsewhere (musl, macOS, Windows) there is nothing to call, and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Any

log = logging.getLogger("hubserve.memory")

_libc: Any = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        _libc.malloc_trim.restype = ctypes.c_int
        _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc
        _libc = None

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own ceiling for its moving threshold: a block below it is heap
TRIM_THRESHOLD_BYTES = 128 << 20  # free heap top kept while serving; frontends trim once quiet
_OPERATOR_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def release_freed_memory() -> bool:
    """Return free heap pages of every malloc arena to the OS. Takes milliseconds; call it on a worker thread
    after an unload. Returns whether anything was released."""
    if _libc is None:
        return False
    return bool(_libc.malloc_trim(0))


def keep_heap_while_serving() -> bool:
    """Fix glibc's mmap and trim thresholds for a serving process (see the module's docstring); called once,
    before the loop starts. An operator's own malloc settings (environment, GLIBC_TUNABLES) win. Returns
    whether the thresholds were set."""
    if _libc is None or any(os.environ.get(name) for name in _OPERATOR_SETTINGS) or \
            "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return bool(_libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(_libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


class MemoryReturn:
    """Per frontend: once large buffers adding up to `threshold_bytes` have passed through (handed on or
    dropped) and then none for a whole sweep tick, hand free heap back to the OS (`release_freed_memory`), at
    most once per `min_interval_secs`. Waiting for a quiet tick is the point: a trim while they still flow
    gives back the pages the next requests are about to fault in again, and holds the arena's lock for
    milliseconds while the loop wants to allocate."""

    __slots__ = ("_busy", "_last", "min_interval_secs", "pending_bytes", "threshold_bytes")

    def __init__(self, threshold_bytes: int = 8 << 20, min_interval_secs: float = 2.0) -> None:
        self.threshold_bytes = threshold_bytes
        self.min_interval_secs = min_interval_secs
        self.pending_bytes = 0
        self._busy = False
        self._last = float("-inf")

    def freed(self, size: int) -> None:
        self.pending_bytes += size
        self._busy = True

    def due(self, now: float) -> bool:
        """Asked once per sweep tick: whether to trim now; if so, the count starts again."""
        busy, self._busy = self._busy, False
        if busy or self.pending_bytes < self.threshold_bytes or now - self._last < self.min_interval_secs:
            return False
        self.pending_bytes = 0
        self._last = now
        return True


__all__ = ["MemoryReturn", "keep_heap_while_serving", "release_freed_memory"]
