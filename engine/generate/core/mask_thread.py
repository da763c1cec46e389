"""The constrained rows' next grammar masks, computed on a thread of their own while the engine's thread runs
the model, where that pays.

After each step's draws the sampler hands every constrained row that will draw again to `start_next_masks`:
one job on a one-thread executor fills their masks (grammar.py `Constraint.fill`), and each row's next
`allowed` waits for it. llguidance releases the GIL while it computes a mask and ONNX Runtime while it runs
the model, so where a core is free the masks leave the step's critical path (vLLM and xgrammar overlap the
mask with the GPU's forward pass the same way). A matcher is the job's from `start` until its `allowed` (or
`advance`) waits for it; the engine's thread reads only what the advance kept meanwhile.

Where no core is free (a loaded machine) the hand-off costs more than it saves: the engine's thread gives up
its core at each wait and takes its turn again behind other work, which on a 2-core machine at load 8 cost
more than the masks themselves. So each job is weighed when the next one starts: the engine's thread waited
`waited_s` for it, where computing its masks itself would have cost the job's CPU time. While the thread
saves nothing (`PROBE_JOBS` jobs, or a smoothed balance below zero) the masks are computed inline, each when
its row asks, for `INLINE_STEPS` steps; then the thread is tried again.

One per `GrammarCompiler` (so per engine), called from the engine's thread only; the thread starts with the
first job and ends at `close` (the engine's), which waits for the job running and drops the queued one. A
request cancelled or finished while its mask is computed costs that one mask: nothing reads it, and its
matcher is its own.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .grammar import Constraint

MASK_THREAD_NAME = "hubserve-grammar-mask"
PROBE_JOBS = 4      # jobs weighed before the thread may be given up (and after each inline stretch)
INLINE_STEPS = 256  # steps whose masks are computed inline once the thread did not pay
SMOOTHING = 0.25    # weight of the newest job in the balance


class MaskThread:
    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.waited_s = 0.0      # the engine's thread blocked on jobs since the last start (grammar.py)
        self._last: Future[float] | None = None  # the last job: its CPU seconds
        self._handoff_s = 0.0    # what submitting it cost the engine's thread
        self._balance_s = 0.0    # smoothed CPU saved per job: the masks' CPU - the wait - the hand-off
        self._weighed = 0        # jobs weighed since the thread was (re)tried
        self._inline_steps = 0   # steps left whose masks are computed inline
        self.jobs = 0            # jobs run, and the times the thread was given up (for benchmarks, tests)
        self.given_up = 0

    @property
    def overlapping(self) -> bool:
        """Whether the next step's masks go to the thread (False: computed inline, when asked)."""
        return not self._closed and self._inline_steps == 0

    def start(self, constraints: list[Constraint]) -> None:
        """Compute `constraints`' next masks on the thread, in one job; each is the job's until its
        `allowed` (or `advance`) waits for it. Inline (nothing here) after `close` or while the thread does
        not pay."""
        self._weigh()
        if self._closed or not constraints:
            return
        if self._inline_steps:
            self._inline_steps -= 1
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=MASK_THREAD_NAME)
        begin = time.perf_counter()
        job = self._executor.submit(_fill_all, constraints)
        for constraint in constraints:
            constraint._pending = job
        self._last, self._handoff_s = job, time.perf_counter() - begin
        self.jobs += 1

    def _weigh(self) -> None:
        """The last job's balance, once its rows waited for it (a job whose rows all left is not weighed)."""
        job, self._last = self._last, None
        waited, self.waited_s = self.waited_s, 0.0
        if job is None or not job.done() or job.cancelled():
            return
        saved = job.result() - waited - self._handoff_s
        self._balance_s += SMOOTHING * (saved - self._balance_s)
        self._weighed += 1
        if self._weighed >= PROBE_JOBS and self._balance_s < 0:
            self._inline_steps, self._balance_s, self._weighed = INLINE_STEPS, 0.0, 0
            self.given_up += 1

    def close(self) -> None:
        """End the thread: the job running finishes (it holds matchers), the queued ones are dropped."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _fill_all(constraints: list[Constraint]) -> float:
    """The job: every row's mask; returns the CPU seconds it took (what the engine's thread would have
    spent computing them)."""
    begin = time.thread_time()
    for constraint in constraints:
        constraint.fill()
    return time.thread_time() - begin


def start_next_masks(constraints: list[Constraint]) -> None:
    """The sampler's hand-off after a step's advances: the rows that will draw again under a grammar get
    their next masks computed on their compiler's mask thread (all one compiler's: the engine's)."""
    wanting = [c for c in constraints if c.wants_mask]
    if wanting and wanting[0]._next is not None:
        wanting[0]._next.start(wanting)
