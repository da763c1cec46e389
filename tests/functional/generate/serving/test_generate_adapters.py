"""LoRA adapters as OpenAI models and as metrics, against a real server (also run with
HUBSERVE_TEST_WORKERS=2): `GET /v1/models` lists each adapter folder of a served generative model after its
base as `base:adapter`, with `parent` the base's id (the official `openai` client's `models.list()` /
`models.retrieve()`); an adapter not declared is OpenAI's 404. /metrics counts requests and tokens per
adapter, from both APIs, and shows the adapters resident, in flight and at most, and the store's loads and
evictions."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from hubserve_models.examples import write_model
from hubserve_models.tiny_decoder import tiny_decoder_model
from test_generate_lora import ADAPTERS, MODEL, build_model

PLAIN = "tiny_decoder"  # a generative model without adapters


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = build_model(tmp_path_factory.mktemp("adapters") / "repo", max_loras=2).parent
    (root / PLAIN / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / PLAIN / "config.pbtxt", root / PLAIN / "config.pbtxt")
    write_model(tiny_decoder_model(), root / PLAIN / "1" / "model.onnx")
    (root / MODEL / "adapters" / "notes.txt").write_text("a file, not an adapter")
    (root / MODEL / "adapters" / ".hidden").mkdir()  # not an adapter's name
    running = start_server(root, tmp_path_factory.mktemp("adapters_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def test_models_list_each_adapter_after_its_base(client: openai.OpenAI):
    listed = client.models.list().data
    assert [m.id for m in listed] == [PLAIN, MODEL] + [f"{MODEL}:{a}" for a in sorted(ADAPTERS)]
    by_id = {m.id: m.model_dump() for m in listed}
    for name in (PLAIN, MODEL):
        assert by_id[name]["parent"] is None and by_id[name]["root"] == name
    for adapter in ADAPTERS:
        card = by_id[f"{MODEL}:{adapter}"]
        assert card["object"] == "model" and card["owned_by"] == "hubserve"
        assert isinstance(card["created"], int) and card["created"] > 0
        assert card["parent"] == MODEL and card["root"] == f"{MODEL}/adapters/{adapter}"
    one = client.models.retrieve(f"{MODEL}:beta").model_dump()
    assert one == by_id[f"{MODEL}:beta"]
    assert client.models.retrieve(MODEL).model_dump() == by_id[MODEL]


def test_retrieving_an_adapter_not_declared_is_openai_404(client: openai.OpenAI):
    for name, words in ((f"{MODEL}:nope", f"model '{MODEL}' has no LoRA adapter 'nope'"),
                        (f"{PLAIN}:beta", f"model '{PLAIN}' has no LoRA adapter 'beta'"),
                        (f"{MODEL}:.hidden", "has no LoRA adapter '.hidden'"),
                        (f"{MODEL}:notes.txt", "has no LoRA adapter 'notes.txt'"),
                        ("tiny_missing:beta", "does not exist")):
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve(name)
        assert err.value.code == "model_not_found", name
        body = err.value.body
        assert isinstance(body, dict) and words in body["message"] and body["param"] == "model", (name, body)


def _metrics(server: RunningServer) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        return r.read().decode()


def _sample(text: str, name: str, adapter: str | None = None) -> float | None:
    labels = f'model="{MODEL}",version="1"' + (f',adapter="{adapter}"' if adapter else "")
    match = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def _lora_info(text: str) -> tuple[dict[str, str], float] | None:
    """vLLM's `vllm:lora_requests_info` series of MODEL: its labels and value."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:lora_requests_info" and sample.labels.get("model_name") == MODEL:
                return sample.labels, sample.value
    return None


def _complete(client: openai.OpenAI, model: str, max_tokens: int) -> int:
    out = client.completions.create(model=model, prompt="Hello", max_tokens=max_tokens, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage is not None
    return out.usage.completion_tokens


def test_metrics_count_requests_and_tokens_per_adapter_and_the_cache(server: RunningServer,
                                                                      client: openai.OpenAI):
    assert _complete(client, f"{MODEL}:beta", 5) == 5
    assert _complete(client, f"{MODEL}:beta", 4) == 4
    assert _complete(client, f"{MODEL}:gamma", 3) == 3
    assert _complete(client, MODEL, 2) == 2  # the base: counted under no adapter
    body = json.dumps({"text_input": "Hello", "parameters": {"max_tokens": 6, "ignore_eos": True,
                                                             "lora": "gamma"}}).encode()
    with urllib.request.urlopen(urllib.request.Request(
            f"http://{server.http_url}/v2/models/{MODEL}/generate", data=body), timeout=60) as r:
        assert r.status == 200
    text = _metrics(server)
    assert _sample(text, "hubserve_generation_lora_requests_total", "beta") == 2
    assert _sample(text, "hubserve_generation_lora_tokens_total", "beta") == 9
    assert _sample(text, "hubserve_generation_lora_requests_total", "gamma") == 2  # /v1 and generate
    assert _sample(text, "hubserve_generation_lora_tokens_total", "gamma") == 9
    assert _sample(text, "hubserve_generation_lora_requests_total", "alpha") is None  # never asked for
    assert "# TYPE hubserve_generation_lora_requests_total counter" in text
    assert "# TYPE hubserve_generation_lora_adapters_loaded gauge" in text
    assert _sample(text, "hubserve_generation_lora_adapters_loaded") == 2
    assert _sample(text, "hubserve_generation_lora_adapters_max") == 2
    assert _sample(text, "hubserve_generation_lora_adapters_in_flight") == 0
    assert _sample(text, "hubserve_generation_lora_loads_total") == 2
    assert _sample(text, "hubserve_generation_lora_evictions_total") == 0
    assert 'hubserve_generation_lora_adapters_loaded{model="tiny_decoder"' not in text  # no adapter inputs

    # a third adapter with max_loras 2 evicts the least recently used (beta): one load, one eviction;
    # while its stream runs it is in flight. The tiny model makes the 480 tokens in ~200 ms, so on a loaded
    # machine the scrape after the first chunk can come after the last: such a try shows nothing and is
    # made again (at most five; alpha stays loaded, so its load and beta's eviction happen once).
    tries = 0
    while True:
        tries += 1
        stream = client.completions.create(model=f"{MODEL}:alpha", prompt="Hello", max_tokens=480,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        text = _metrics(server)
        stream.close()
        wait_until(lambda: _sample(_metrics(server), "hubserve_generation_lora_adapters_in_flight") == 0,
                   "the closed stream's adapter is still in flight")
        # vLLM's gauge of the same (its labels the adapters running and waiting at the engine's last step)
        info = _lora_info(text)
        if _sample(text, "hubserve_generation_lora_adapters_in_flight") == 1 and info is not None \
                and info[0]["running_lora_adapters"] == "alpha":
            break
        assert tries < 5, "alpha was never seen in flight: each stream ended before the scrape"
    assert info is not None
    assert info[0] == {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": "alpha",
                       "model_name": MODEL}
    assert abs(info[1] - time.time()) < 60  # vLLM's value: when those statistics were taken
    assert _sample(text, "hubserve_generation_lora_requests_total", "alpha") == tries
    assert _sample(text, "hubserve_generation_lora_loads_total") == 3
    assert _sample(text, "hubserve_generation_lora_evictions_total") == 1
    assert _sample(text, "hubserve_generation_lora_adapters_loaded") == 2
    assert _complete(client, f"{MODEL}:beta", 1) == 1  # evicted: read again, gamma goes
    text = _metrics(server)
    assert _sample(text, "hubserve_generation_lora_loads_total") == 4
    assert _sample(text, "hubserve_generation_lora_evictions_total") == 2
    assert _sample(text, "hubserve_generation_lora_requests_total", "beta") == 3
