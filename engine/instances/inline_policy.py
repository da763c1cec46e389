"""When a batch runs on the event loop instead of its instance's thread: a pure, synchronous policy.

A hand-off to an instance thread and back costs about 75 us of CPU per batch on the small VMs we measure on
(futex wake-ups, the GIL, the loop's wake-up pipe): `simple` under concurrency 8 over gRPC, server on one
core, used ~215 us of server CPU per inference with every batch on the thread and ~190 us with every batch
inline (batches of ~2.7). It also costs time the CPU figure does not show: the loop and the instance thread
pass the GIL back and forth while a batch is on the thread (~13 futex calls per batch at `mlp` c = 32), and
each pass waits for the holder; at `mlp` c = 32 the machine sat a quarter idle. Run in place instead (this
threshold raised from 100 us to 1 ms, `perf/bench_peers.py --baseline-tree`, two runs, 2026-12-06), `mlp`
(~300 us of CPU per batch of ~18) under perf_analyzer at c = 16 and 32 served 1.07-1.22 x the requests at
6-20 % less server CPU per inference, and `image` (~330 us per batch of ~5) 0.93-1.10 x. So a CPU batch whose
average cost is under INLINE_BELOW_NS runs in place; anything slower keeps its thread. The price: while an
inline batch runs, the loop serves nothing else, so a request for another model can wait about that long (a
run past INLINE_WALL_LIMIT_NS strikes, below). Only backends that say their execution time is CPU time
(`cpu_bound = True`) on a CPU instance qualify: one that waits on a device or a sleep uses no CPU yet blocks.

The decision rests on a running average of each batch size's CPU time, not on the last run. In the server
a `simple` run takes ~60 us of CPU (~25 us alone in a loop: the loop, timer and instance threads share the
core's caches), and some runs take several times that (cache misses, page faults); with a one-sample rule
each such run sent that batch size back to the thread until a thread run measured fast again — 70 % of
batches under perf_analyzer at concurrency 4. A sample counts at most INLINE_SAMPLE_CAP_NS, so one outlier
moves the average by at most a quarter of INLINE_BELOW_NS, while a backend that is really slow crosses it
within a few runs.

An inline run that still takes longer than INLINE_WALL_LIMIT_NS of wall time is a strike against the
instance if the run itself may have been the cause: it used that much CPU, or it gave up the CPU (a
voluntary context switch: a sleep, a lock, a device wait). A strike sends that batch size back to the
thread at once (its average set to the cap); INLINE_STRIKES of them turn inlining off for good. Why not at
the first: waiting for the GIL is a voluntary switch too — ORT releases the GIL while it computes, and the
timer thread may hold it when the run ends — so on a busy machine a fast backend collects a strike now and
then, while a backend that blocks collects one every time it is tried inline. A run that was merely
preempted (involuntary switches only) says nothing about the backend.

Strikes are a leaky count: each clean inline run takes 1/INLINE_STRIKE_SHARE of a strike off. A backend that
blocks strikes on every inline try, with no clean runs between, and is out at the third; a fast one on a
machine shared with other work strikes in bursts: `simple` under perf_analyzer at concurrency 16 with other
processes loading the 2 cores (load average 6) struck 37 times in 36,000 inline runs, three of them within
150 runs, so a count that never forgot ended its inlining within seconds of the start and every later batch
paid the thread hand-off (104–113 µs of server CPU per inference against 86 µs inline). With one strike
forgiven per 10 clean runs that run's count peaked at 2. A backend that blocks on more than one in ~10 inline
runs is still struck out.

One `InlinePolicy` per instance, owned by the instance pool (pool.py), which asks it before each batch and
tells it what each run cost. It reads no clock and starts no thread: the pool measures.
"""

from __future__ import annotations

INLINE_BELOW_NS = 1_000_000
INLINE_SAMPLE_CAP_NS = 2 * INLINE_BELOW_NS
INLINE_AVERAGE_WEIGHT = 1 / 8  # of the newest sample
INLINE_WALL_LIMIT_NS = 2_000_000
INLINE_STRIKES = 3
INLINE_STRIKE_SHARE = 10  # clean inline runs that forgive one strike


class InlinePolicy:
    """Which batch sizes of one instance run on the loop. Created `eligible` only for a CPU instance whose
    backend is `cpu_bound`; an ineligible policy never says inline and ignores what it is told."""

    __slots__ = ("inline_elements", "_strike_debt", "_cpu_ns")

    def __init__(self, eligible: bool = True) -> None:
        # The largest batch (in elements) whose average CPU time is under INLINE_BELOW_NS; 0 = none yet,
        # -1 = never (not eligible, or struck out).
        self.inline_elements = 0 if eligible else -1
        # The leaky strike count in 1/INLINE_STRIKE_SHARE units (integers: no rounding at the threshold).
        self._strike_debt = 0
        self._cpu_ns: dict[int, float] = {}  # batch elements -> running average of CPU ns

    @property
    def strikes(self) -> float:
        """The strikes not yet forgiven: INLINE_STRIKES of them end inlining."""
        return self._strike_debt / INLINE_STRIKE_SHARE

    def runs_inline(self, elements: int) -> bool:
        """Whether a batch of `elements` should run on the loop: one no larger than a size measured fast."""
        return elements <= self.inline_elements

    def ran_on_thread(self, elements: int, cpu_ns: int) -> None:
        """A batch of `elements` ran on the instance's thread and used `cpu_ns` of that thread's CPU."""
        self._measured(elements, cpu_ns)

    def ran_inline(self, elements: int, wall_ns: int, cpu_ns: int, gave_up_cpu: bool | None) -> None:
        """A batch of `elements` ran on the loop for `wall_ns`, using `cpu_ns` of CPU. `gave_up_cpu`: whether
        the thread switched out of its own accord meanwhile (None: the OS cannot say, or nobody asked because
        the run was short). A long run that may have been the backend's own doing is a strike; any other
        run is a sample like a thread run (CPU time: preemption inflates the wall clock, not the cost)."""
        if wall_ns > INLINE_WALL_LIMIT_NS and (gave_up_cpu is None or gave_up_cpu
                                               or cpu_ns > INLINE_WALL_LIMIT_NS // 2):
            self._strike(elements)
        else:
            if self._strike_debt:
                self._strike_debt -= 1
            self._measured(elements, cpu_ns)

    def _measured(self, elements: int, cpu_ns: int) -> None:
        """Fold one run's CPU time into its batch size's average and move `inline_elements` accordingly."""
        if self.inline_elements < 0:
            return
        sample = min(cpu_ns, INLINE_SAMPLE_CAP_NS)
        average = self._cpu_ns.get(elements)
        average = sample if average is None else average + (sample - average) * INLINE_AVERAGE_WEIGHT
        self._cpu_ns[elements] = average
        if average < INLINE_BELOW_NS:
            self.inline_elements = max(self.inline_elements, elements)
        elif elements <= self.inline_elements:
            self.inline_elements = elements - 1  # this size got slow: it and larger ones back to the thread

    def _strike(self, elements: int) -> None:
        """An inline run of `elements` held the loop past INLINE_WALL_LIMIT_NS, maybe by its own doing."""
        self._strike_debt += INLINE_STRIKE_SHARE
        if self._strike_debt >= INLINE_STRIKES * INLINE_STRIKE_SHARE:
            self.inline_elements = -1  # it keeps blocking the loop: never inline this instance again
        else:
            self._cpu_ns[elements] = INLINE_SAMPLE_CAP_NS
            self.inline_elements = min(self.inline_elements, elements - 1)
