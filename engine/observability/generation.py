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

# The latency histograms' buckets, in seconds. Ours: TTFT spans a queue wait and a prefill, inter-token
# latency one engine step. vLLM's (vllm/v1/metrics/loggers.py), for its families of the same names
# (vllm_metrics.py). Each version keeps one histogram over both sets of bounds (`histogram_bounds`), and
# each family shows its own.
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
VLLM_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                       10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                      20.0, 40.0, 80.0)


def histogram_bounds(*bucket_sets: tuple[float, ...]) -> tuple[float, ...]:
    """Every bound of the given bucket sets, once, increasing: a histogram over them can be shown through
    each set (Histogram.cumulative_at)."""
    return tuple(sorted(set().union(*bucket_sets)))


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
    running_adapters: tuple[str, ...] = ()  # of the engine's running requests, at its last step
    waiting_adapters: tuple[str, ...] = ()  # of its waiting ones


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
    time_to_first_token: Histogram  # over TTFT_BUCKETS_S and VLLM_TTFT_BUCKETS_S
    inter_token_latency: Histogram  # over ITL_BUCKETS_S and VLLM_ITL_BUCKETS_S
    lora: LoraSample | None  # None: the version's graph takes no adapters
    stats_time_s: float = 0.0  # when the engine's statistics above were taken (time.time(), seconds)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (the hit rate's terms)
    prefix_cache_hits: int = 0

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of the KV cache's blocks held by sequences, 0 to 1 (vLLM's `kv_cache_usage_perc`:
        blocks holding only a cached prefix count as free, as they can be taken)."""
        total = self.kv_blocks_used + self.kv_blocks_free
        return self.kv_blocks_used / total if total else 0.0
    # Interactive requests told apart from offline batch jobs' (the Batch API's, at the scheduler's BATCH
    # priority), so autoscaling can leave batch work out: of `waiting`, the batch jobs' sequences; and the
    # time to first token of interactive requests alone (None: not recorded by this engine).
    waiting_batch: int = 0
    interactive_time_to_first_token: Histogram | None = None
    # the KV cache as sized at load (generate/serving/kv_budget.py): blocks, tokens per block, bytes
    kv_num_blocks: int = 0
    kv_block_size: int = 0
    kv_cache_bytes: int = 0
    # Speculative decoding (engine/generate/core/verify.py): tokens proposed and verified, and of those kept,
    # since the engine started; None: the version does not speculate (its families are left out).
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int = 0
    spec_drafts: int = 0  # of a request's steps, those that verified proposals (vLLM's num_drafts)
    # the back-off (engine/generate/core/backoff.py): requests decoding plainly now because their proposals
    # did not pay, and back-offs started; None: the version speculates without one (or not at all)
    spec_requests_backing_off: int | None = None
    spec_backoffs: int = 0
