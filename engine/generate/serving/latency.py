"""What a generative model's serving counts for its metrics: time to first token and inter-token latency as
histograms, tokens generated and prompt tokens taken, requests finished by reason, and requests and tokens
per LoRA adapter.

Written only on the event loop (driver.py records as it hands each step's tokens to their
clients, so the times are what a client sees, not what the engine thread saw), read at scrape time by
engine/observability/metrics.py: plain numbers, no locks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...observability.histograms import Histogram

# Seconds. TTFT spans a queue wait and a prefill; inter-token latency one engine step.
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class GenerationMetrics:
    """One generative model version's counters (driver.py EngineDriver.metrics)."""

    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    generation_tokens: int = 0
    prompt_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason: stop, length, abort, error
    lora_requests: dict[str, int] = field(default_factory=dict)  # requests taken, by LoRA adapter
    lora_tokens: dict[str, int] = field(default_factory=dict)    # tokens generated, by LoRA adapter
