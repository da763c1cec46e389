"""Every Prometheus metric the server exports is defined here, but for the generative models' families under
vLLM's names (vllm_metrics.py) and the GPU families (gpu_metrics.py), which this page shows.

The numbers are read from each model version's `ModelStats` at scrape time, so the request path pays nothing
for metrics. Names and labels follow Triton's (`nv_inference_*{model, version}`) so existing dashboards work.
Counters are written in the text format by hand because prometheus_client renames counter families to
`*_total`, which Triton's names are not; prometheus_client supplies the process metrics (memory, CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from ..instances.canary import CanaryRecord
from ..model import Model
from .exposition import escape, histogram_family
from .generation import ITL_BUCKETS_S, TTFT_BUCKETS_S, GenerationSample, LoraSample
from .histograms import FAMILIES as HISTOGRAM_FAMILIES
from .histograms import Histogram
from .stats import ModelStats
from .vllm_metrics import vllm_lines

# name -> (type, help, value from stats)
FAMILIES: list[tuple[str, str, str, Callable[[ModelStats, Model], int]]] = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests",
     lambda s, m: s.success.count),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests",
     lambda s, m: s.fail.count),
    ("hubserve_inference_request_cancelled_total", "counter",
     "Inference requests cancelled by their client (disconnect, stream reset, gRPC deadline) before the "
     "answer",
     lambda s, m: s.cancelled.count),
    ("nv_inference_count", "counter", "Number of inferences performed (batch elements)",
     lambda s, m: s.inference_count),
    ("nv_inference_exec_count", "counter", "Number of model executions (batches)",
     lambda s, m: s.execution_count),
    ("nv_inference_request_duration_us", "counter", "Cumulative end-to-end inference request duration",
     lambda s, m: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative time requests spend queued",
     lambda s, m: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration",
     lambda s, m: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration",
     lambda s, m: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration",
     lambda s, m: s.compute_output.ns // 1000),
    ("nv_inference_pending_request_count", "gauge", "Requests queued or executing, not yet answered",
     lambda s, m: m.pending_count),
]


def render(models: Iterable[Model], process: CollectorRegistry | None = None,
           generation: Iterable[GenerationSample] = (), gpu: Iterable[str] = ()) -> bytes:
    """The page: the model families, the generative models' (`generation`), the GPU families' lines
    (`gpu`, gpu_metrics.py) and the process's."""
    models = list(models)
    lines: list[str] = []
    for name, kind, help_text, value in FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m in models:
            labels = f'model="{escape(m.name)}",version="{m.version_str}"'
            lines.append(f"{name}{{{labels}}} {value(m.stats, m)}")
    lines.extend(_queued_lines(models))
    lines.append("# HELP hubserve_batch_dispatch_total Batches sent, by why they left the queue: full, "
                 "preferred (a preferred size reached), window (max_queue_delay expired), immediate "
                 "(no window), early (no other request could join before the window ended)")
    lines.append("# TYPE hubserve_batch_dispatch_total counter")
    for m in models:
        for reason, count in sorted(m.stats.dispatch_reasons.items()):
            lines.append(f'hubserve_batch_dispatch_total{{model="{escape(m.name)}",version="{m.version_str}",'
                         f'reason="{reason}"}} {count}')
    lines.extend(_sequence_lines(models))
    lines.extend(_canary_lines(models))
    lines.extend(_generation_lines(list(generation)))
    lines.extend(_histogram_lines(models))
    lines.extend(gpu)
    text = "\n".join(lines) + "\n"
    if process is not None:
        text += generate_latest(process).decode()
    return text.encode()


def _queued_lines(models: list[Model]) -> list[str]:
    """The queue-only part of the pending gauge, what the CPU and GPU overlays' autoscaler scales on
    (deploy/kubernetes/hpa.yaml): executing requests are capacity in use, waiting ones are capacity missing.
    Not for generative versions (`queued_count` None): their waiting is the generation engine's gauges'."""
    name = "hubserve_inference_queued_requests"
    lines = [f"# HELP {name} Requests accepted and waiting in the scheduler's queue for an instance "
             "(not executing)", f"# TYPE {name} gauge"]
    for m in models:
        queued = m.queued_count
        if queued is not None:
            lines.append(f'{name}{{model="{escape(m.name)}",version="{m.version_str}"}} {queued}')
    return lines


# Sequence models only (engine/scheduling/sequence/batcher.py): key of `sequence_counts()` -> (name, type,
# help).
_SEQUENCE_FAMILIES = [
    ("started", "hubserve_sequence_started_total", "counter", "Sequences started (requests with START)"),
    ("ended", "hubserve_sequence_ended_total", "counter", "Sequences ended by a request with END"),
    ("idle_released", "hubserve_sequence_idle_released_total", "counter",
     "Sequences released after max_sequence_idle_microseconds without a request"),
    ("active", "hubserve_sequence_active", "gauge", "Sequences holding a slot"),
    ("backlog", "hubserve_sequence_backlog", "gauge", "Sequences waiting in the backlog for a slot"),
]


def _sequence_lines(models: list[Model]) -> list[str]:
    # getattr twice: an ensemble (EnsembleModel) has steps, no batcher
    counted = [(m, counts()) for m in models
               if (counts := getattr(getattr(m, "batcher", None), "sequence_counts", None)) is not None]
    if not counted:
        return []
    lines = []
    for key, name, kind, help_text in _SEQUENCE_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m, values in counted:
            lines.append(f'{name}{{model="{escape(m.name)}",version="{m.version_str}"}} {values[key]}')
    return lines


# Versions the canary has run on (engine/instances/canary.py): (name, type, help, value from the record).
_CANARY_FAMILIES: list[tuple[str, str, str, Callable[[CanaryRecord], int]]] = [
    ("hubserve_model_canary_healthy", "gauge",
     "1 while the version's last canary inference passed, 0 while it fails (the version is then not ready)",
     lambda r: 0 if r.failing else 1),
    ("hubserve_model_canary_runs_total", "counter", "Canary inferences run (one per interval, all instances)",
     lambda r: r.runs),
    ("hubserve_model_canary_failures_total", "counter",
     "Canary inferences that failed or missed the deadline", lambda r: r.failures),
]


def _canary_lines(models: list[Model]) -> list[str]:
    checked = [m for m in models if m.canary.runs]
    if not checked:
        return []
    lines = []
    for name, kind, help_text, value in _CANARY_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m in checked:
            lines.append(f'{name}{{model="{escape(m.name)}",version="{m.version_str}"}} {value(m.canary)}')
    return lines


# Generative models (engine/generate/): name -> (type, help, value from the version's sample, generation.py).
_GENERATION_FAMILIES: list[tuple[str, str, str, Callable[[GenerationSample], float]]] = [
    ("hubserve_generation_tokens_total", "counter", "Tokens generated (sent to clients)",
     lambda d: d.generation_tokens),
    ("hubserve_generation_prompt_tokens_total", "counter", "Prompt tokens of the generation requests taken",
     lambda d: d.prompt_tokens),
    ("hubserve_generation_running_sequences", "gauge", "Sequences in the running batch (holding KV blocks)",
     lambda d: d.running),
    ("hubserve_generation_waiting_sequences", "gauge", "Sequences waiting for admission (or preempted)",
     lambda d: d.waiting),
    ("hubserve_generation_kv_blocks_used", "gauge", "KV cache blocks held by sequences",
     lambda d: d.kv_blocks_used),
    ("hubserve_generation_kv_blocks_free", "gauge", "KV cache blocks free (cached prefixes included)",
     lambda d: d.kv_blocks_free),
    ("hubserve_generation_kv_cache_capacity_tokens", "gauge",
     "Tokens the KV cache holds, over all sequences (blocks x tokens per block, sized at load)",
     lambda d: d.kv_num_blocks * d.kv_block_size),
    ("hubserve_generation_kv_cache_bytes", "gauge", "Memory of the KV cache's blocks, sized at load",
     lambda d: d.kv_cache_bytes),
    ("hubserve_generation_prefix_cache_hit_rate", "gauge",
     "Prompt tokens found in the prefix cache / prompt tokens looked up, since the engine started",
     lambda d: d.prefix_cache_hit_rate),
    ("hubserve_generation_preemptions_total", "counter", "Sequences preempted (KV blocks ran out)",
     lambda d: d.preemptions),
]
_HISTOGRAMS: list[tuple[str, str, Callable[[GenerationSample], Histogram], tuple[float, ...]]] = [
    ("hubserve_generation_time_to_first_token_seconds",
     "Time from a generation request's arrival to its first token", lambda d: d.time_to_first_token,
     TTFT_BUCKETS_S),
    ("hubserve_generation_inter_token_latency_seconds",
     "Time between consecutive tokens of a generation request", lambda d: d.inter_token_latency,
     ITL_BUCKETS_S),
]


def _generation_lines(samples: list[GenerationSample]) -> list[str]:
    if not samples:
        return []
    lines = []
    labelled = [(d, f'model="{escape(d.model_name)}",version="{d.version}"') for d in samples]
    for name, kind, help_text, value in _GENERATION_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in labelled)
    lines.append("# HELP hubserve_generation_requests_finished_total Generation requests ended, by reason: "
                 "stop, length, abort (client gone), error")
    lines.append("# TYPE hubserve_generation_requests_finished_total counter")
    for d, labels in labelled:
        for reason, count in sorted(d.finished.items()):
            lines.append(f'hubserve_generation_requests_finished_total{{{labels},reason="{reason}"}} {count}')
    lines.extend(_by_priority_lines(labelled))
    for name, help_text, histogram, buckets in _HISTOGRAMS:
        lines.extend(histogram_family(name, help_text, [(labels, histogram(d)) for d, labels in labelled],
                                      buckets))
    interactive = [(labels, d.interactive_time_to_first_token) for d, labels in labelled
                   if d.interactive_time_to_first_token is not None]
    if interactive:
        lines.extend(histogram_family(
            "hubserve_generation_interactive_time_to_first_token_seconds",
            "Time from an interactive generation request's arrival to its first token (offline batch jobs' "
            "requests left out)", interactive, TTFT_BUCKETS_S))
    lines.extend(_lora_lines([(d.lora, labels) for d, labels in labelled if d.lora is not None]))
    lines.extend(_spec_lines(labelled))
    lines.extend(vllm_lines(samples))
    return lines


_SPEC_FAMILIES: list[tuple[str, str, Callable[[GenerationSample], float]]] = [
    ("hubserve_generation_spec_drafts_total",
     "Steps that verified speculative decoding's proposals for a request (tokens per such step: 1 + accepted "
     "/ drafts)", lambda d: d.spec_drafts),
    ("hubserve_generation_spec_draft_tokens_total",
     "Tokens proposed by speculative decoding and verified by the model", lambda d: d.spec_draft_tokens or 0),
    ("hubserve_generation_spec_accepted_tokens_total",
     "Of the tokens proposed by speculative decoding, those the model kept",
     lambda d: d.spec_accepted_tokens),
]

# The back-off (engine/generate/core/backoff.py), for the versions whose proposer has it (the default).
_BACKOFF_FAMILIES: list[tuple[str, str, str, Callable[[GenerationSample], float]]] = [
    ("hubserve_generation_spec_requests_backing_off", "gauge",
     "Requests decoding without proposals now because theirs did not pay for their cost (speculative "
     "decoding's back-off)", lambda d: d.spec_requests_backing_off or 0),
    ("hubserve_generation_spec_backoffs_total", "counter",
     "Back-offs started: a request's proposals found not to pay, so it decodes plainly for a while "
     "(doubling while they keep failing)", lambda d: d.spec_backoffs),
]


def _spec_lines(labelled: list[tuple[GenerationSample, str]]) -> list[str]:
    """Speculative decoding's proposed and kept tokens (their ratio: the acceptance rate), for the versions
    that speculate (a model folder's `speculative_method`)."""
    speculating = [(d, labels) for d, labels in labelled if d.spec_draft_tokens is not None]
    lines: list[str] = []
    if not speculating:
        return lines
    for name, help_text, value in _SPEC_FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in speculating)
    backing_off = [(d, labels) for d, labels in speculating if d.spec_requests_backing_off is not None]
    if not backing_off:
        return lines
    for name, kind, help_text, value in _BACKOFF_FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in backing_off)
    return lines


def _by_priority_lines(labelled: list[tuple[GenerationSample, str]]) -> list[str]:
    """The waiting sequences split by the scheduler's priority class (engine/generate/core/request.py
    `Priority`): `interactive` (API requests) and `batch` (the Batch API's jobs). Autoscaling reads the
    interactive queue, so a batch job, which waits by design, never scales the fleet."""
    name = "hubserve_generation_waiting_sequences_by_priority"
    lines = [f"# HELP {name} Sequences waiting for admission (or preempted), by priority: interactive (API "
             "requests) or batch (Batch API jobs)", f"# TYPE {name} gauge"]
    for d, labels in labelled:
        lines.append(f'{name}{{{labels},priority="interactive"}} {d.waiting - d.waiting_batch}')
        lines.append(f'{name}{{{labels},priority="batch"}} {d.waiting_batch}')
    return lines


# LoRA adapters (engine/generate/core/lora.py), for versions whose graph takes them: per adapter (label
# `adapter`), then per version, what sizing the adapter cache (`max_loras`) needs.
_LORA_PER_ADAPTER: list[tuple[str, str, Callable[[LoraSample], Mapping[str, int]]]] = [
    ("hubserve_generation_lora_requests_total", "Generation requests taken that run with the LoRA adapter "
     "(each choice counts)", lambda lora: lora.requests),
    ("hubserve_generation_lora_tokens_total", "Tokens generated with the LoRA adapter",
     lambda lora: lora.tokens),
]
_LORA_FAMILIES: list[tuple[str, str, str, Callable[[LoraSample], int]]] = [
    ("hubserve_generation_lora_adapters_loaded", "gauge", "LoRA adapters resident in memory",
     lambda lora: lora.loaded),
    ("hubserve_generation_lora_adapters_max", "gauge",
     "LoRA adapters kept resident at most (max_loras; the least recently used is evicted)",
     lambda lora: lora.max_loaded),
    ("hubserve_generation_lora_adapters_in_flight", "gauge",
     "Distinct LoRA adapters of the requests queued or running", lambda lora: lora.in_flight),
    ("hubserve_generation_lora_loads_total", "counter", "LoRA adapters read from disk (first use, or again "
     "after an eviction)", lambda lora: lora.loads),
    ("hubserve_generation_lora_evictions_total", "counter",
     "LoRA adapters evicted to stay within max_loras", lambda lora: lora.evictions),
]


def _lora_lines(labelled: list[tuple[LoraSample, str]]) -> list[str]:
    if not labelled:
        return []
    lines = []
    for name, help_text, counts in _LORA_PER_ADAPTER:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} counter")
        for d, labels in labelled:
            for adapter, count in sorted(counts(d).items()):
                lines.append(f'{name}{{{labels},adapter="{escape(adapter)}"}} {count}')
    for name, kind, help_text, value in _LORA_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in labelled)
    return lines


def _histogram_lines(models: list[Model]) -> list[str]:
    """The latency histograms (histograms.py), in microseconds, per model version."""
    shown = [(m, m.stats.histograms) for m in models if m.stats.histograms is not None]
    lines: list[str] = []
    for attr, name, help_text in HISTOGRAM_FAMILIES if shown else ():
        lines.extend(histogram_family(name, help_text, [
            (f'model="{escape(m.name)}",version="{m.version_str}"', getattr(hists, attr))
            for m, hists in shown]))
    return lines


def process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry
