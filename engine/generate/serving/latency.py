"""What a generative model's serving counts for its metrics: time to first token and inter-token latency as
histograms, tokens generated and prompt tokens taken, requests finished by reason, and requests and tokens
per LoRA adapter.

Written only on the event loop (driver.py records as it hands each step's tokens to their
clients, so the times are what a client sees, not what the engine thread saw), read at scrape time by
engine/observability/metrics.py: plain numbers, no locks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...observability.generation import (
    ITL_BUCKETS_S,
    TTFT_BUCKETS_S,
    VLLM_ITL_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
    histogram_bounds,
)
from ...observability.histograms import Histogram

# One histogram each, over our buckets and vLLM's: exported as ours and under vLLM's names, each with its
# own buckets (engine/observability/metrics.py, vllm_metrics.py).
_TTFT_BOUNDS_S = histogram_bounds(TTFT_BUCKETS_S, VLLM_TTFT_BUCKETS_S)
_ITL_BOUNDS_S = histogram_bounds(ITL_BUCKETS_S, VLLM_ITL_BUCKETS_S)


@dataclass(slots=True)
class GenerationMetrics:
    """One generative model version's counters (driver.py EngineDriver.metrics)."""

    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(_TTFT_BOUNDS_S))
    # The same, of interactive requests alone: an offline batch job's requests wait behind them by design,
    # so their first tokens come late without anyone waiting (the autoscaling signal: docs/deployment.md).
    interactive_time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(_ITL_BOUNDS_S))
    generation_tokens: int = 0
    prompt_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason: stop, length, abort, error
    lora_requests: dict[str, int] = field(default_factory=dict)  # requests taken, by LoRA adapter
    lora_tokens: dict[str, int] = field(default_factory=dict)    # tokens generated, by LoRA adapter
