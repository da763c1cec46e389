"""What a generative model's serving counts for its metrics: time to first token and inter-token latency as
histograms, tokens generated and prompt tokens taken, requests finished by reason.

Written only on the event loop (engine/generate/driver.py records as it hands each step's tokens to their
clients, so the times are what a client sees, not what the engine thread saw), read at scrape time by
engine/metrics.py: plain numbers, no locks.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Seconds. TTFT spans a queue wait and a prefill; inter-token latency one engine step.
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """A Prometheus histogram's state: a count per bucket (not cumulative; `cumulative()` makes them so),
    the sum and the count of observations."""

    __slots__ = ("bounds", "counts", "count", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations at or below it) per bucket, +Inf last, as the text format writes them."""
        out, total = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass(slots=True)
class GenerationMetrics:
    """One generative model version's counters (engine/generate/driver.py EngineDriver.metrics)."""

    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    generation_tokens: int = 0
    prompt_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason: stop, length, abort, error
