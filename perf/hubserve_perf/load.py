"""Drive load on one event loop and record every completed request.

Two shapes of load, as perf_analyzer's:
  concurrency   closed loop: N coroutines, each sends its next request as soon as its last one answered
  request rate  open loop: requests leave on a schedule (constant spacing or Poisson arrivals) whatever
                the server does. The scheduler wakes at most once a millisecond (the event loop's timer
                resolution) and sends every request whose slot has come, so at high rates requests leave
                in small bursts of up to 1 ms of slots; one that leaves more than LATE_NS after its slot
                counts as delayed (the client could not keep up: add --workers)

`LoadGenerator` is a `LoadSource`; so is `workers.ProcessLoad`, which runs one LoadGenerator per process.
measure.py calls start() once per sweep step, drain() once per measurement window and stop() at the step's
end.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Coroutine
from typing import Any
from typing import Protocol as TypingProtocol

import numpy as np

from .client import InferClient
from .types import Distribution, Drained, LoadPlan, PerfError, Records

LATE_NS = 2_000_000  # an open-loop request leaving this late behind its slot is "delayed"
MIN_SLEEP_S = 0.001  # uvloop's timers have millisecond resolution: a shorter sleep returns at once (a spin)
# past this an open-loop request waits for one to finish (and counts as delayed)
MAX_OPEN_LOOP_IN_FLIGHT = 4096
STOP_TIMEOUT_S = 30.0  # how long stop() waits for requests in flight


class LoadSource(TypingProtocol):
    async def start(self, plan: LoadPlan) -> None:
        """Begin sending; any previous step must have been stopped."""

    async def drain(self) -> Drained:
        """What happened since the last drain. Raises PerfError when a request failed: the measurement is
        void."""

    async def stop(self) -> None:
        """Stop sending and wait for the requests in flight."""

    async def close(self) -> None: ...


class LoadGenerator:
    """Owns its client and its coroutines; all on the caller's event loop."""

    def __init__(self, client: InferClient, wires: list[bytes]) -> None:
        if not wires:
            raise ValueError("no requests to send")
        self._client = client
        self._wires = wires
        self._next_wire = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._error: PerfError | None = None
        self._late = 0
        self._cpu_mark_ns = time.process_time_ns()
        self._columns = tuple(array("q") for _ in range(4))  # start, end, send, recv

    async def start(self, plan: LoadPlan) -> None:
        if self._tasks:
            raise RuntimeError("start() while the previous step still runs")
        self._running = True
        if plan.open_loop:
            self._spawn(self._schedule(plan))
        else:
            for _ in range(plan.concurrency):
                self._spawn(self._closed_loop())

    async def drain(self) -> Drained:
        if self._error is not None:
            raise self._error
        columns = [np.frombuffer(c, dtype=np.int64).copy() for c in self._columns]
        for c in self._columns:
            del c[:]
        late, self._late = self._late, 0
        cpu_ns, self._cpu_mark_ns = time.process_time_ns() - self._cpu_mark_ns, time.process_time_ns()
        return Drained(Records(*columns), late, cpu_ns)

    async def stop(self) -> None:
        self._running = False
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def close(self) -> None:
        await self.stop()
        await self._client.close()

    # ----------------------------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wire(self) -> bytes:
        wires = self._wires
        if len(wires) == 1:
            return wires[0]
        i = self._next_wire
        self._next_wire = (i + 1) % len(wires)
        return wires[i]

    async def _one(self) -> None:
        """Send one request and record it; a failure stops the load and is raised by the next drain()."""
        start_ns = time.monotonic_ns()
        try:
            send_ns, recv_ns = await self._client.infer(self._wire())
        except Exception as e:  # PerfError, or a bug: either way the measurement is void
            self._running = False
            if self._error is None:
                self._error = e if isinstance(e, PerfError) else PerfError(f"a request failed: {e!r}")
            return
        end_ns = time.monotonic_ns()
        starts, ends, sends, recvs = self._columns
        starts.append(start_ns)
        ends.append(end_ns)
        sends.append(send_ns)
        recvs.append(recv_ns)

    async def _closed_loop(self) -> None:
        one = self._one
        while self._running:
            await one()

    async def _schedule(self, plan: LoadPlan) -> None:
        """Open loop: launch each request at its slot; catch up at once when the loop woke up late."""
        rng = np.random.default_rng(plan.seed)
        mean_gap_ns = 1e9 / plan.request_rate
        poisson = plan.distribution is Distribution.POISSON

        def gap() -> float:
            return float(rng.exponential(mean_gap_ns)) if poisson else mean_gap_ns

        slot = float(time.monotonic_ns()) + plan.phase * mean_gap_ns
        while self._running:
            now = time.monotonic_ns()
            while slot <= now and self._running and len(self._tasks) <= MAX_OPEN_LOOP_IN_FLIGHT:
                if now - slot > LATE_NS:
                    self._late += 1
                self._spawn(self._one())
                slot += gap()
            await asyncio.sleep(max((slot - time.monotonic_ns()) / 1e9, MIN_SLEEP_S))
