"""vLLM's metric names beside ours (engine/observability/vllm_metrics.py), rendered from a real
GenerationSample by the real page renderer (metrics.render) and read back with prometheus_client's parser:
one histogram per version shown through our buckets and vLLM's, the KV gauge as a fraction, vLLM's finish
reasons, its LoRA and cache config info gauges. Pure: no server."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from engine.generate.serving.latency import GenerationMetrics
from engine.observability.generation import (
    ITL_BUCKETS_S,
    TTFT_BUCKETS_S,
    VLLM_ITL_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
    GenerationSample,
    LoraSample,
)
from engine.observability.metrics import render

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sample(lora: LoraSample | None = None) -> GenerationSample:
    metrics = GenerationMetrics()
    for ttft in (0.003, 0.03, 3.0):
        metrics.time_to_first_token.observe(ttft)
    metrics.inter_token_latency.observe(0.0007, 10)
    return GenerationSample("m", "2", generation_tokens=11, prompt_tokens=7, running=3, waiting=2,
                            kv_blocks_used=256, kv_blocks_free=768, prefix_cache_hit_rate=0.5, preemptions=1,
                            finished={"stop": 2, "error": 1}, time_to_first_token=metrics.time_to_first_token,
                            inter_token_latency=metrics.inter_token_latency, lora=lora, stats_time_s=1234.5,
                            prefix_cache_queries=40, prefix_cache_hits=20, kv_num_blocks=1024,
                            kv_block_size=16, kv_cache_bytes=16 << 20)


def page(*samples: GenerationSample) -> Series:
    text = render([], None, samples).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def buckets(series: Series, name: str) -> dict[str, float]:
    return {dict(labels)["le"]: value for (n, labels), value in series.items() if n == name + "_bucket"}


VLLM = (("engine", "2"), ("model_name", "m"))


def test_gauges_and_counters_under_vllms_names_and_labels() -> None:
    series = page(sample())
    assert series[("vllm:num_requests_running", VLLM)] == 3
    assert series[("vllm:num_requests_waiting", VLLM)] == 2
    assert series[("vllm:kv_cache_usage_perc", VLLM)] == 0.25  # a fraction, not a percentage
    assert series[("vllm:prompt_tokens_total", VLLM)] == 7
    assert series[("vllm:generation_tokens_total", VLLM)] == 11
    assert series[("vllm:num_preemptions_total", VLLM)] == 1
    assert series[("vllm:prefix_cache_queries_total", VLLM)] == 40  # tokens, as the hit rate's terms
    assert series[("vllm:prefix_cache_hits_total", VLLM)] == 20
    reasons = {dict(labels)["finished_reason"]: value for (n, labels), value in series.items()
               if n == "vllm:request_success_total"}
    assert reasons == {"stop": 2, "length": 0, "abort": 0}  # vLLM's reasons; our "error" is not one


def test_the_kv_caches_sizing_as_vllms_cache_config_info() -> None:
    series = page(sample())
    info = {labels: value for (name, labels), value in series.items() if name == "vllm:cache_config_info"}
    assert info == {(("block_size", "16"), ("engine", "2"), ("kv_cache_memory_bytes", str(16 << 20)),
                     ("model_name", "m"), ("num_gpu_blocks", "1024")): 1.0}


def test_one_histogram_shown_through_our_buckets_and_vllms() -> None:
    series = page(sample())
    ours = buckets(series, "hubserve_generation_time_to_first_token_seconds")
    theirs = buckets(series, "vllm:time_to_first_token_seconds")
    assert len(ours) == len(TTFT_BUCKETS_S) + 1 and len(theirs) == len(VLLM_TTFT_BUCKETS_S) + 1
    assert (ours["0.0025"], ours["0.005"], ours["0.025"], ours["0.05"], ours["2.5"], ours["5"]) == \
        (0, 1, 1, 2, 2, 3)
    assert (theirs["0.001"], theirs["0.005"], theirs["0.02"], theirs["0.04"], theirs["2.5"],
            theirs["5.0"], theirs["+Inf"]) == (0, 1, 1, 2, 2, 3, 3)
    ours_labels = (("model", "m"), ("version", "2"))
    for part in ("_count", "_sum"):
        assert series[("vllm:time_to_first_token_seconds" + part, VLLM)] == \
            series[("hubserve_generation_time_to_first_token_seconds" + part, ours_labels)]
    itl = buckets(series, "vllm:inter_token_latency_seconds")
    assert len(itl) == len(VLLM_ITL_BUCKETS_S) + 1 and itl["0.01"] == itl["+Inf"] == 10
    assert len(buckets(series, "hubserve_generation_inter_token_latency_seconds")) == len(ITL_BUCKETS_S) + 1


def test_lora_requests_info_is_vllms_timestamp_gauge_for_a_model_with_adapters() -> None:
    assert not any(n == "vllm:lora_requests_info" for n, _ in page(sample()))
    lora = LoraSample({}, {}, loaded=1, max_loaded=4, in_flight=2, loads=1, evictions=0,
                      running_adapters=("a", "b"), waiting_adapters=("c",))
    series = page(sample(lora))
    info = {labels: value for (n, labels), value in series.items() if n == "vllm:lora_requests_info"}
    assert info == {(("max_lora", "4"), ("model_name", "m"), ("running_lora_adapters", "a,b"),
                     ("waiting_lora_adapters", "c")): 1234.5}


def test_no_generative_model_no_vllm_families() -> None:
    assert b"vllm:" not in render([], None, [])


def test_speculative_decodings_counters_under_both_names_only_for_versions_that_speculate() -> None:
    speculating = replace(sample(), spec_draft_tokens=12, spec_accepted_tokens=5,
                          spec_drafts=4)
    plain = replace(sample(), model_name="p")
    series = page(speculating, plain)
    assert series[("vllm:spec_decode_num_draft_tokens_total", VLLM)] == 12
    assert series[("vllm:spec_decode_num_accepted_tokens_total", VLLM)] == 5
    assert series[("vllm:spec_decode_num_drafts_total", VLLM)] == 4
    ours = (("model", "m"), ("version", "2"))
    assert series[("hubserve_generation_spec_draft_tokens_total", ours)] == 12
    assert series[("hubserve_generation_spec_accepted_tokens_total", ours)] == 5
    assert series[("hubserve_generation_spec_drafts_total", ours)] == 4
    names = {name for name, labels in series
             if "p" in (dict(labels).get("model_name"), dict(labels).get("model"))}
    assert not {n for n in names if "spec" in n}  # a version that does not speculate shows none
    assert "vllm:num_requests_running" in names
