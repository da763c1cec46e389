"""vLLM's operational surface on the OpenAI API's port, as vLLM's clients, routers and scalers read it,
against a real server serving the tiny_decoder example with `max_num_seqs` 1 (so a second request waits):
the context on /v1/models (`max_model_len`), and the generative models' numbers under vLLM's metric names
beside ours, scraped while and after real `openai` requests run, parsed with prometheus_client's parser."""

from __future__ import annotations

import concurrent.futures
import shutil
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from hubserve_models import examples

MODEL = "tiny_decoder"
CONTEXT = 512
TOKENS = 400  # per request: the byte tokenizer's prompt below is 6 tokens, so each fits the context


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openai_operations") / "repo"
    (root / MODEL).mkdir(parents=True)
    config = (EXAMPLES / MODEL / "config.pbtxt").read_text()
    one = config.replace('key: "max_num_seqs" value { string_value: "32" }',
                         'key: "max_num_seqs" value { string_value: "1" }')
    assert one != config
    (root / MODEL / "config.pbtxt").write_text(one)
    (root / "simple").mkdir()
    shutil.copy(EXAMPLES / "simple" / "config.pbtxt", root / "simple" / "config.pbtxt")
    examples.build_repository(root, [MODEL, "simple"])
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("openai_operations_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of the page, by (name, sorted labels), through prometheus_client's parser."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def vllm(samples: Samples, name: str, **labels: str) -> float:
    """One vLLM series of the model (labels model_name and engine, the version)."""
    key = (name, tuple(sorted({"model_name": MODEL, "engine": "1", **labels}.items())))
    assert key in samples, f"no {key} among {sorted(k for k in samples if k[0].startswith('vllm:'))[:40]}"
    return samples[key]


def test_models_carry_max_model_len(client: openai.OpenAI):
    listed = client.models.list()
    assert [m.id for m in listed.data] == [MODEL]
    assert listed.data[0].to_dict()["max_model_len"] == CONTEXT
    assert client.models.retrieve(MODEL).to_dict()["max_model_len"] == CONTEXT


def _stream(client: openai.OpenAI, i: int) -> int:
    """One streamed completion of TOKENS tokens; how many chunks carried text."""
    stream = client.completions.create(model=MODEL, prompt=f"go {i}", max_tokens=TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    return sum(1 for chunk in stream if chunk.choices and chunk.choices[0].text)


def _waiting(samples: Samples) -> Samples | None:
    return samples if vllm(samples, "vllm:num_requests_waiting") > 0 else None


def test_vllm_gauges_move_with_real_streams_and_the_counters_add_up(server: RunningServer,
                                                                    client: openai.OpenAI):
    """Eight streams against max_num_seqs 1: a scrape sees one running and the rest waiting, the KV cache
    partly used; once they end, nothing runs or waits, and the counters grew by exactly what was asked."""
    client.completions.create(model=MODEL, prompt="warm", max_tokens=1)  # the families exist
    before = scrape(server.metrics_url)
    requests = 8
    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        streams = [pool.submit(_stream, client, i) for i in range(requests)]
        seen = wait_until(lambda: _waiting(scrape(server.metrics_url)), "a scrape with a request waiting")
        assert all(s.result(timeout=120) > 0 for s in streams)
    assert vllm(seen, "vllm:num_requests_running") == 1  # max_num_seqs
    assert 0 < vllm(seen, "vllm:kv_cache_usage_perc") < 1
    waiting = ("hubserve_generation_waiting_sequences", (("model", MODEL), ("version", "1")))
    assert seen[waiting] == vllm(seen, "vllm:num_requests_waiting")  # the same number under both names

    after = scrape(server.metrics_url)
    assert vllm(after, "vllm:num_requests_running") == vllm(after, "vllm:num_requests_waiting") == 0
    assert vllm(after, "vllm:kv_cache_usage_perc") == 0

    def grew(name: str, **labels: str) -> float:
        return vllm(after, name, **labels) - vllm(before, name, **labels)

    assert grew("vllm:time_to_first_token_seconds_count") == requests
    assert grew("vllm:request_success_total", finished_reason="length") == requests
    assert grew("vllm:request_success_total", finished_reason="stop") == 0
    assert grew("vllm:generation_tokens_total") == requests * TOKENS
    assert grew("vllm:prompt_tokens_total") == requests * len(b"go 0") + requests  # BOS each
    assert grew("vllm:inter_token_latency_seconds_count") == requests * (TOKENS - 1)
    # vLLM's buckets, over the same observations as ours
    assert vllm(after, "vllm:time_to_first_token_seconds_bucket", le="2560.0") == \
        vllm(after, "vllm:time_to_first_token_seconds_count")
    assert ("vllm:time_to_first_token_seconds_bucket",
            (("engine", "1"), ("le", "0.02"), ("model_name", MODEL))) in after
    ours = (("model", MODEL), ("version", "1"))
    for part in ("count", "sum"):
        assert after[(f"hubserve_generation_time_to_first_token_seconds_{part}", ours)] == \
            vllm(after, f"vllm:time_to_first_token_seconds_{part}")
    assert not any(name == "vllm:lora_requests_info" for name, _ in after)  # the graph takes no adapters
