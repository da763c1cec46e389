"""Sub-millisecond timers for batching windows and queue timeouts.

The event loop's timers have millisecond resolution: uvloop fires a 100 µs timer at once (so a batcher that
re-arms it spins until the window ends), the standard loop fires it about 1 ms late. A window of a few hundred
microseconds needs better. `PreciseTimer` keeps its deadlines on one thread that sleeps until the earliest
(clock_nanosleep-grade precision) and hands the callback to the loop with `call_soon_threadsafe`. The batcher
uses it only for waits under `THRESHOLD_S`; longer waits use the loop's own timers, whose error is then small
relative to the wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
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
        self._thread = threading.Thread(target=self._run, name=f"{name}.timer", daemon=True)
        self._thread.start()

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
