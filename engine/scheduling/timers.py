"""Sub-millisecond timers for batching windows and queue timeouts.

The event loop's timers have millisecond resolution: uvloop fires a 100 µs timer at once (so a batcher that
re-arms it spins until the window ends), the standard loop fires it about 1 ms late. A window of a few hundred
microseconds needs better. The batcher uses these only for waits under `THRESHOLD_S`; longer waits use the
loop's own timers, whose error is then small relative to the wait.

`FdTimer` (Linux): a timerfd the loop watches (`add_reader`). The kernel makes it readable at the deadline,
to the microsecond, and the loop's next poll returns at once; arming it is one `timerfd_settime` call. No
thread: nothing contends for the GIL, and a window costs one syscall to arm, one readiness event and one read.
Issue 13 measured why that matters (perf/history/batching.md "Issue 13: the window at c = 32"): with the
thread below, a 1 ms window at 32 clients cost about 5 context switches and 14 futex calls per batch, 10 µs of
the timer thread's CPU per inference, and the loop thread's own time rose with the GIL hand-offs.

`PreciseTimer` (anywhere): one thread that sleeps until the earliest of its deadlines (clock_nanosleep-grade
precision) and hands the callback to the loop with `call_soon_threadsafe`. Used where timerfd is missing.
"""

from __future__ import annotations

# mypyc compiles `class _Timespec(ctypes.Structure)` as a load of `_ctypes.Structure` (typeshed's name for
# it), and its C declares that module's cache only if this module imports it.
import _ctypes  # noqa: F401
import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable

THRESHOLD_S = 0.002


class PreciseTimer:
    """One thread serving many deadlines. `call_later` and `cancel` are called from the loop thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        # not `_thread`: mypyc's C names an attribute `_<name>`, and `__thread` is a C keyword
        self._worker = threading.Thread(target=self._run, name=f"{name}.timer", daemon=True)
        self._worker.start()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> int:
        when = time.perf_counter() + delay_s
        token = next(self._seq)
        with self._cond:
            heapq.heappush(self._heap, (when, token, callback))
            if self._heap[0][1] == token:
                self._cond.notify()
        return token

    def cancel(self, token: int) -> None:
        with self._cond:
            self._cancelled.add(token)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if not self._heap:
                        self._cancelled.clear()  # tokens cancelled after they fired: nothing left to skip
                        self._cond.wait()
                        continue
                    when, token, callback = self._heap[0]
                    if token in self._cancelled:
                        heapq.heappop(self._heap)
                        self._cancelled.discard(token)
                        continue
                    remaining = when - time.perf_counter()
                    if remaining <= 0:
                        heapq.heappop(self._heap)
                        break  # fire it (outside the lock)
                    if remaining > 0.001:
                        self._cond.wait(remaining - 0.0005)  # coarse wait, then a precise sleep below
                        continue
                    self._cond.release()
                    try:
                        time.sleep(remaining)
                    finally:
                        self._cond.acquire()
                if self._closed:
                    return
            try:
                self._loop.call_soon_threadsafe(callback)
            except RuntimeError:  # the loop closed under us
                return


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_libc: ctypes.CDLL | None = None
_probed = False


def _timerfd_libc() -> ctypes.CDLL | None:
    """libc with timerfd_create/timerfd_settime typed, or None where there is no timerfd (not Linux).
    Looked up once."""
    global _libc, _probed
    if not _probed:
        _probed = True
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
            libc.timerfd_create.restype = ctypes.c_int
            libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                             ctypes.c_void_p]
            libc.timerfd_settime.restype = ctypes.c_int
        except (OSError, AttributeError):
            return None
        _libc = libc
    return _libc


class FdTimer:
    """One deadline, one callback, on the loop thread (see the module doc). `arm` replaces the deadline;
    `disarm` drops it. The callback runs from the loop's poll, never inside `arm`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        libc = _timerfd_libc()
        if libc is None:
            raise OSError("timerfd is not available here")
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._libc = libc
        self._fd = fd
        self._loop = loop
        self._callback = callback
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        loop.add_reader(fd, self._on_ready)

    @staticmethod
    def available() -> bool:
        return _timerfd_libc() is not None

    def arm(self, delay_s: float) -> None:
        """Fire once, `delay_s` from now (a delay of 0 or less fires on the next poll)."""
        ns = max(int(delay_s * 1e9), 1)  # an all-zero value would disarm it
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        self._settime()

    def disarm(self) -> None:
        value = self._spec.it_value
        value.tv_sec = value.tv_nsec = 0
        self._settime()

    def _settime(self) -> None:
        if self._libc.timerfd_settime(self._fd, 0, self._spec_ref, None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _on_ready(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count; re-arming before the loop got here leaves nothing
        except BlockingIOError:
            return
        self._callback()

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
