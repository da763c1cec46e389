"""The generative models' numbers again under vLLM's metric names, beside ours (metrics.py), so what reads a
vLLM server's /metrics reads ours unchanged: the Gateway API inference extension (llm-d's router) picks an
endpoint by `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` and `vllm:lora_requests_info`; KEDA
scalers and dashboards query the same gauges and the latency histograms.

Names, types, buckets and labels are vLLM's (vllm/v1/metrics/loggers.py): labels `model_name` and `engine`,
where vLLM's `engine` numbers the engines of one served model and ours is the version (one engine per
served version); counters are written `..._total` in the HELP and TYPE lines too, as prometheus_client
writes vLLM's. Nothing is counted twice: every value is the GenerationSample the hubserve_generation_*
families read, and each latency histogram is the same one, shown through vLLM's buckets
(Histogram.cumulative_at).

`vllm:lora_requests_info` is vLLM's: a gauge whose value is the time (Unix seconds) of the engine statistics
it describes and whose labels carry the state, `running_lora_adapters` and `waiting_lora_adapters` (adapter
names joined by commas) and `max_lora`; we add `model_name`, so two models' series stay apart. vLLM keeps
every label set it has ever set, and readers take the newest; we show the current one only.

`vllm:cache_config_info` is vLLM's info gauge (value 1) whose labels are the KV cache's configuration:
`block_size`, `num_gpu_blocks` (vLLM's name even on its CPU backend, where the blocks are host memory, as
ours are) and, ours, `kv_cache_memory_bytes` (what the blocks take: generate/serving/kv_budget.py), with
`model_name` and `engine`.
"""

from __future__ import annotations

from collections.abc import Callable

from .exposition import escape, float_bound, histogram_family
from .generation import VLLM_ITL_BUCKETS_S, VLLM_TTFT_BUCKETS_S, GenerationSample

# name -> (type, help, value): vLLM's help texts
_FAMILIES: list[tuple[str, str, str, Callable[[GenerationSample], float]]] = [
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
     lambda d: d.running),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
     lambda d: d.waiting),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
     lambda d: d.kv_cache_usage),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
     lambda d: d.preemptions),
    ("vllm:prefix_cache_queries_total", "counter",
     "Prefix cache queries, in terms of number of queried tokens.", lambda d: d.prefix_cache_queries),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
     lambda d: d.prefix_cache_hits),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", lambda d: d.prompt_tokens),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
     lambda d: d.generation_tokens),
]
# speculative decoding's, shown for the versions that speculate (vLLM shows them when speculation is on)
_SPEC_FAMILIES: list[tuple[str, str, Callable[[GenerationSample], float]]] = [
    ("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", lambda d: d.spec_drafts),
    ("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
     lambda d: d.spec_draft_tokens or 0),
    ("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
     lambda d: d.spec_accepted_tokens),
]
# vLLM's finish reasons, each always shown (0 until one ends so); ours also counts "error", which vLLM's
# request_success does not
_FINISHED_REASONS = ("stop", "length", "abort")


def vllm_lines(samples: list[GenerationSample]) -> list[str]:
    """Every vLLM family for the generative versions sampled (none: no lines)."""
    if not samples:
        return []
    labelled = [(d, f'model_name="{escape(d.model_name)}",engine="{escape(d.version)}"') for d in samples]
    lines = []
    for name, kind, help_text, value in _FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in labelled)
    lines.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    lines.append("# TYPE vllm:request_success_total counter")
    for d, labels in labelled:
        for reason in _FINISHED_REASONS:
            lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                         f"{d.finished.get(reason, 0)}")
    lines.extend(histogram_family(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
        [(labels, d.time_to_first_token) for d, labels in labelled], VLLM_TTFT_BUCKETS_S, float_bound))
    lines.extend(histogram_family(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
        [(labels, d.inter_token_latency) for d, labels in labelled], VLLM_ITL_BUCKETS_S, float_bound))
    lines.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
    lines.append("# TYPE vllm:cache_config_info gauge")
    for d, labels in labelled:
        lines.append(f'vllm:cache_config_info{{block_size="{d.kv_block_size}",num_gpu_blocks="{d.kv_num_blocks}",'
                     f'kv_cache_memory_bytes="{d.kv_cache_bytes}",{labels}}} 1.0')
    speculating = [(d, labels) for d, labels in labelled if d.spec_draft_tokens is not None]
    for name, help_text, value in _SPEC_FAMILIES:
        if speculating:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines.extend(f"{name}{{{labels}}} {value(d)}" for d, labels in speculating)
    with_lora = [d for d in samples if d.lora is not None]
    if with_lora:
        lines.append("# HELP vllm:lora_requests_info Running stats on lora requests.")
        lines.append("# TYPE vllm:lora_requests_info gauge")
        for d in with_lora:
            lora = d.lora
            assert lora is not None
            lines.append(f'vllm:lora_requests_info{{max_lora="{lora.max_loaded}",'
                         f'waiting_lora_adapters="{escape(",".join(lora.waiting_adapters))}",'
                         f'running_lora_adapters="{escape(",".join(lora.running_adapters))}",'
                         f'model_name="{escape(d.model_name)}"}} {d.stats_time_s}')
    return lines
