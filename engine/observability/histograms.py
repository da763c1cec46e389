"""Latency histograms per model version: request (end to end), queue and compute, in microseconds.

Triton has one latency histogram (`nv_inference_first_response_histogram_ms`, on with `--metrics-config
histogram_latencies=true`) and summaries for the rest; hubserve keeps that flag's name and spelling, and
names the three histograms after Triton's summaries (`nv_inference_request_summary_us` and the like) with
`histogram` in place of `summary`. Unlike the per-model summary counters, a histogram's buckets can be
summed across replicas (`sum by (le)`), which is why they exist.

`CONFIG` is set once at start (`--metrics-config`), before any model loads; each `ModelStats` then holds
one `LatencyHistograms` or None. An observation is a bisect and two additions, on the loop thread.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import invalid

# Microseconds: 50 µs to 10 s, about three a decade (a `simple` inference is ~100 µs, a large batch seconds).
DEFAULT_BUCKETS_US: tuple[float, ...] = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
                                         250000, 500000, 1000000, 2500000, 10000000)


@dataclass(slots=True)
class HistogramConfig:
    enabled: bool = True
    buckets_us: tuple[float, ...] = DEFAULT_BUCKETS_US


CONFIG = HistogramConfig()

# What each histogram family is called and says; the key is the LatencyHistograms attribute.
FAMILIES = (
    ("request", "nv_inference_request_histogram_us",
     "Histogram of end-to-end inference request handling times, in microseconds"),
    ("queue", "nv_inference_queue_histogram_us",
     "Histogram of the time requests wait in the scheduling queue, in microseconds"),
    ("compute", "nv_inference_compute_histogram_us",
     "Histogram of the time requests spend executing (input, inference and output of their batch), in "
     "microseconds"),
)


class Histogram:
    """A Prometheus histogram's state, in the unit its observations come in (`unit` of them make the unit it
    is shown in: 1000 for nanoseconds shown as microseconds, 1 for seconds). One class for every histogram the
    server exports: these latency ones and the generation engine's (generate/serving/latency.py). Each bucket
    counts its own observations (the last one, +Inf, those above every bound); cumulative counts are made at
    scrape time (metrics.py)."""

    __slots__ = ("bounds", "counts", "sum", "count", "unit")

    def __init__(self, bounds: tuple[float, ...], unit: float = 1) -> None:
        self.bounds = tuple(b * unit for b in bounds)
        self.unit = unit
        self.counts = [0] * (len(bounds) + 1)
        self.sum: float = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """`n` observations of `value` each (a batch charges its compute time to each of its requests)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def observe_each(self, values: Sequence[float]) -> None:
        """One observation of each of `values` (a batch's queue waits): `observe` for each, in one call."""
        counts, bounds = self.counts, self.bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1
        self.sum += sum(values)
        self.count += len(values)

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out

    def cumulative_at(self, bounds: tuple[float, ...]) -> list[int]:
        """The cumulative counts at `bounds` (in the unit shown; each one of this histogram's own), then
        +Inf: the same observations seen through coarser buckets, so one histogram can be exported under
        two families whose buckets differ (ours and vLLM's: engine/observability/vllm_metrics.py)."""
        running = self.cumulative()
        index = {b: i for i, b in enumerate(self.bounds)}
        return [running[index[b * self.unit]] for b in bounds] + [running[-1]]


class LatencyHistograms:
    """A model version's request, queue and compute histograms: observed in nanoseconds, shown in µs."""

    __slots__ = ("request", "queue", "compute")

    def __init__(self, buckets_us: tuple[float, ...]) -> None:
        self.request = Histogram(buckets_us, 1000)
        self.queue = Histogram(buckets_us, 1000)
        self.compute = Histogram(buckets_us, 1000)


def new_histograms() -> LatencyHistograms | None:
    return LatencyHistograms(CONFIG.buckets_us) if CONFIG.enabled else None


def parse_metrics_config(settings: list[str]) -> HistogramConfig:
    """`--metrics-config <setting>=<value>` (repeatable, as Triton's flag): `histogram_latencies=true|false`
    (Triton's setting; on by default here) and `histogram_buckets_us=50,100,...` (ours: the upper bounds in
    microseconds, increasing). Any other setting is refused, naming it."""
    config = HistogramConfig()
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise invalid(f"--metrics-config option format is '<setting>=<value>'. Got {item}")
        if name == "histogram_latencies":
            if value not in ("true", "false", "1", "0"):
                raise invalid(f"--metrics-config histogram_latencies must be true or false, got: {value}")
            config.enabled = value in ("true", "1")
        elif name == "histogram_buckets_us":
            try:
                buckets = tuple(float(v) for v in value.split(","))
            except ValueError:
                raise invalid(f"--metrics-config histogram_buckets_us must be numbers separated by commas, "
                              f"got: {value}") from None
            if any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
                raise invalid("--metrics-config histogram_buckets_us must be positive and increasing, "
                              f"got: {value}")
            config.buckets_us = buckets
        else:
            raise invalid(f"unknown --metrics-config setting '{name}'; hubserve knows histogram_latencies "
                          "and histogram_buckets_us")
    return config
