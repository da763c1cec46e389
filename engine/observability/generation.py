"""What the metrics read of a generative model version: `GenerationSample`, taken at scrape time.

The generation engine is a plug-in kind (engine/generate/): its driver fills a sample
(generate/serving/driver.py `EngineDriver.sample`) and the server hands the samples to `metrics.render`, so
the metrics name every family without importing the engine. Values are the driver's counters (written on
the loop) and its engine's last step statistics (replaced by the engine thread after each step).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .histograms import Histogram


@dataclass(frozen=True, slots=True)
class LoraSample:
    """A version whose graph takes LoRA adapters (generate/core/lora.py): per adapter, then the store's
    sizing (`max_loras`)."""

    requests: Mapping[str, int]  # requests taken, by adapter
    tokens: Mapping[str, int]  # tokens generated, by adapter
    loaded: int  # resident now
    max_loaded: int
    in_flight: int  # distinct adapters of the requests queued or running
    loads: int
    evictions: int


@dataclass(frozen=True, slots=True)
class GenerationSample:
    """One generative model version's numbers at a scrape."""

    model_name: str
    version: str
    generation_tokens: int
    prompt_tokens: int
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    prefix_cache_hit_rate: float
    preemptions: int
    finished: Mapping[str, int]  # requests ended, by reason
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    lora: LoraSample | None  # None: the version's graph takes no adapters
