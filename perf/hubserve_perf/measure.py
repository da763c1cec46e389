"""Measurement windows and the stability rule, as perf_analyzer's "time_windows" mode (its
inference_profiler.cc, read for this, not copied).

For one step of a sweep (a concurrency or a request rate) `measure_step()`:
  1. starts the load and takes a statistics snapshot from the server;
  2. repeatedly lets one window pass — 1.2 × --measurement-interval, as perf_analyzer sleeps — snapshots the
     statistics again and drains the records: a window counts the requests that *ended* inside it (whenever
     they started), and the difference of the server's counters; windows are back to back;
  3. stops as soon as the last 3 windows are stable — max/min of their throughputs, and of their latencies
     (the average, or the --percentile), at most 1 + P/100, and none of them empty — or after --max-trials;
  4. reports the last 3 windows merged: throughput = their requests × batch / their time, percentiles over
     all their latencies, server averages over all their server-side requests.

Percentiles use perf_analyzer's nearest rank: the sorted latency at index round(p/100 · (n − 1)).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .control import ControlClient
from .load import LoadSource
from .types import LoadPlan, Records, ServerStats

STABILITY_WINDOWS = 3
WINDOW_STRETCH = 1.2  # perf_analyzer sleeps 1.2 × the measurement interval per window
REPORTED_PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class MeasureSettings:
    interval_ms: int = 5000
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: int = 0  # 0: stabilize on the average latency, as perf_analyzer without --percentile
    batch_size: int = 1
    server_stats: bool = True  # the server lists the statistics extension

    @property
    def percentiles(self) -> tuple[int, ...]:
        extra = (self.percentile,) if self.percentile and self.percentile not in REPORTED_PERCENTILES else ()
        return tuple(sorted(REPORTED_PERCENTILES + extra))


@dataclass(frozen=True, slots=True)
class Window:
    duration_ns: int
    records: Records
    server: ServerStats
    delayed: int
    client_cpu_ns: int

    def throughput(self, batch_size: int) -> float:
        return len(self.records) * batch_size * 1e9 / self.duration_ns if self.duration_ns > 0 else 0.0

    def latency_ns(self, percentile: int) -> float:
        latencies = self.records.latency_ns
        if not len(latencies):
            return 0.0
        if not percentile:
            return float(latencies.mean())
        return float(nearest_rank(np.sort(latencies), percentile))


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step of a sweep, merged over its last (up to) 3 windows."""

    plan: LoadPlan
    stable: bool
    windows_measured: int
    request_count: int
    duration_ns: int
    throughput: float  # inferences (requests × batch size) per second
    avg_latency_ns: float
    percentiles_ns: dict[int, int]
    avg_send_ns: float
    avg_recv_ns: float
    server: ServerStats
    delayed: int  # open-loop requests that left late: the client could not keep up
    client_cpu_ns: int  # CPU time of the load process(es) over the reported windows
    window_throughputs: tuple[float, ...] = field(default=())

    @property
    def level(self) -> float:
        return self.plan.request_rate if self.plan.open_loop else self.plan.concurrency

    def server_avg_ns(self, total_ns: int) -> float:
        return total_ns / self.server.success_count if self.server.success_count else 0.0

    @property
    def server_compute_ns(self) -> float:
        s = self.server
        return self.server_avg_ns(s.compute_input_ns + s.compute_infer_ns + s.compute_output_ns)

    @property
    def network_ns(self) -> float:
        """perf_analyzer's "Network+Server Send/Recv": client wait minus server queue and compute, ≥ 0."""
        wait = self.avg_latency_ns - self.avg_send_ns - self.avg_recv_ns
        return max(wait - self.server_avg_ns(self.server.queue_ns) - self.server_compute_ns, 0.0)


def nearest_rank(sorted_values: np.ndarray, percentile: float) -> int:
    index = int(percentile / 100.0 * (len(sorted_values) - 1) + 0.5)
    return int(sorted_values[min(index, len(sorted_values) - 1)])


def is_stable(windows: list[Window], settings: MeasureSettings) -> bool:
    if len(windows) < STABILITY_WINDOWS:
        return False
    last = windows[-STABILITY_WINDOWS:]
    if any(not len(w.records) for w in last):
        return False
    bound = 1.0 + settings.stability_percentage / 100.0
    for values in ([w.throughput(settings.batch_size) for w in last],
                   [w.latency_ns(settings.percentile) for w in last]):
        if min(values) <= 0 or max(values) / min(values) > bound:
            return False
    return True


def summarize(plan: LoadPlan, windows: list[Window], stable: bool, settings: MeasureSettings) -> StepResult:
    last = windows[-STABILITY_WINDOWS:]
    records = Records.concat([w.records for w in last])
    duration = sum(w.duration_ns for w in last)
    server = ServerStats()
    for w in last:
        server = server + w.server
    latencies = np.sort(records.latency_ns)
    n = len(records)
    return StepResult(
        plan=plan,
        stable=stable,
        windows_measured=len(windows),
        request_count=n,
        duration_ns=duration,
        throughput=n * settings.batch_size * 1e9 / duration if duration else 0.0,
        avg_latency_ns=float(latencies.mean()) if n else 0.0,
        percentiles_ns={p: nearest_rank(latencies, p) if n else 0 for p in settings.percentiles},
        avg_send_ns=float(records.send_ns.mean()) if n else 0.0,
        avg_recv_ns=float(records.recv_ns.mean()) if n else 0.0,
        server=server,
        delayed=sum(w.delayed for w in last),
        client_cpu_ns=sum(w.client_cpu_ns for w in last),
        window_throughputs=tuple(w.throughput(settings.batch_size) for w in windows),
    )


Progress = Callable[[str], None]


def describe(plan: LoadPlan) -> str:
    if plan.open_loop:
        return f"rate {plan.request_rate:g}/s ({plan.distribution.value})"
    return f"concurrency {plan.concurrency}"


async def measure_step(source: LoadSource, control: ControlClient, model: str, version: str, plan: LoadPlan,
                       settings: MeasureSettings, progress: Progress) -> StepResult:
    """Measure one step (see the module docstring). The caller owns `source`; it is stopped on return."""

    async def snapshot() -> ServerStats:
        return await control.stats(model, version) if settings.server_stats else ServerStats()

    windows: list[Window] = []
    stable = False
    await source.start(plan)
    try:
        before = await snapshot()
        window_start = time.monotonic_ns()
        window_ns = int(settings.interval_ms * 1_000_000 * WINDOW_STRETCH)
        carried = Records.empty()  # drained, but ended after the last window: they belong to the next
        for trial in range(1, settings.max_trials + 1):
            await asyncio.sleep(max(window_start + window_ns - time.monotonic_ns(), 0) / 1e9)
            window_end = time.monotonic_ns()
            after = await snapshot()
            drained = await source.drain()
            records = Records.concat([carried, drained.records])
            inside = (records.end_ns > window_start) & (records.end_ns <= window_end)
            window = Window(window_end - window_start, records.select(inside), after - before,
                            drained.delayed, drained.cpu_ns)
            carried = records.select(records.end_ns > window_end)
            windows.append(window)
            stable = is_stable(windows, settings)
            progress(_window_line(plan, trial, settings, window, stable))
            if stable:
                break
            before, window_start = after, window_end
    finally:
        await source.stop()
    return summarize(plan, windows, stable, settings)


def _window_line(plan: LoadPlan, trial: int, settings: MeasureSettings, window: Window, stable: bool) -> str:
    latencies = np.sort(window.records.latency_ns)
    p50 = nearest_rank(latencies, 50) / 1e6 if len(latencies) else 0.0
    p99 = nearest_rank(latencies, 99) / 1e6 if len(latencies) else 0.0
    avg = window.latency_ns(0) / 1e6
    late = f", {window.delayed} delayed" if window.delayed else ""
    cores = window.client_cpu_ns / window.duration_ns if window.duration_ns else 0.0
    verdict = "stable" if stable else ("not stable yet" if trial < settings.max_trials else "NOT STABLE")
    return (f"{describe(plan)}: window {trial}/{settings.max_trials}: "
            f"{window.throughput(settings.batch_size):,.1f} infer/s, avg {avg:.2f} ms, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms{late}, client CPU {cores:.2f} cores — {verdict}")
