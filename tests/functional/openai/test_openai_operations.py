"""vLLM's operational surface on the OpenAI API's port, as vLLM's clients, routers and scalers read it,
against a real server serving the tiny_decoder example with `max_num_seqs` 1 (so a second request waits):
the context on /v1/models (`max_model_len`), and the generative models' numbers under vLLM's metric names
beside ours, scraped while and after real `openai` requests run, parsed with prometheus_client's parser."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import shutil
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import engine
from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from hubserve_models import examples
from test_openai_vllm_fields import JSON_MODEL, add_word_tokenizer_model

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
    add_word_tokenizer_model(root)  # JSON_MODEL: the same graph with a tokenizer.json of words
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
    assert [m.id for m in listed.data] == [MODEL, JSON_MODEL]
    assert [m.to_dict()["max_model_len"] for m in listed.data] == [CONTEXT, CONTEXT]
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
    assert grew("vllm:prefix_cache_queries_total") > 0
    assert 0 <= vllm(after, "vllm:prefix_cache_hits_total") <= vllm(after, "vllm:prefix_cache_queries_total")
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


def call(server: RunningServer, method: str, path: str, doc: dict | None = None,
         key: str | None = None) -> tuple[int, bytes, str]:
    """(status, body, content type) of one plain HTTP request to the API port."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    conn.request(method, path, None if doc is None else json.dumps(doc), headers)
    r = conn.getresponse()
    out = r.status, r.read(), r.headers.get("Content-Type", "")
    conn.close()
    return out


def post(server: RunningServer, path: str, doc: dict) -> tuple[int, dict]:
    status, body, _ = call(server, "POST", path, doc)
    return status, json.loads(body)


def test_health_and_version(server: RunningServer):
    assert call(server, "GET", "/health")[:2] == (200, b"")  # vLLM's: 200 with no body while it serves
    status, body, kind = call(server, "GET", "/version")
    assert (status, json.loads(body), kind) == (200, {"version": engine.__version__}, "application/json")
    status, body, _ = call(server, "POST", "/health")
    message = json.loads(body)["error"]["message"]
    assert status == 405 and message == "POST is not allowed on /health; use GET."


def test_tokenize_a_prompt_and_detokenize_it_back(server: RunningServer, client: openai.OpenAI):
    status, doc = post(server, "/tokenize", {"model": MODEL, "prompt": "Hi there"})
    assert status == 200, doc
    # the byte tokenizer: BOS 256, then the UTF-8 bytes
    assert doc == {"count": 9, "max_model_len": CONTEXT, "tokens": [256, *b"Hi there"], "token_strs": None}
    out = client.completions.create(model=MODEL, prompt="Hi there", max_tokens=1)
    assert out.usage is not None and out.usage.prompt_tokens == doc["count"]  # what a generation is fed
    status, doc = post(server, "/tokenize", {"model": MODEL, "prompt": "Hi", "add_special_tokens": False,
                                             "return_token_strs": True})
    assert (status, doc["tokens"], doc["token_strs"]) == (200, [72, 105], ["H", "i"]), doc
    status, doc = post(server, "/detokenize", {"model": MODEL, "tokens": [256, *"héllo".encode()]})
    assert (status, doc) == (200, {"prompt": "héllo"})


def test_token_strs_and_special_tokens_of_a_tokenizer_json(server: RunningServer):
    """A tokenizer.json's tokens are named as its vocabulary names them; /detokenize writes its special
    tokens (vLLM's), which a generation's text leaves out by default."""
    status, doc = post(server, "/tokenize", {"model": JSON_MODEL, "prompt": "t7 t42 t7",
                                             "return_token_strs": True})
    assert (status, doc["tokens"], doc["token_strs"]) == (200, [7, 42, 7], ["t7", "t42", "t7"]), doc
    status, doc = post(server, "/detokenize", {"model": JSON_MODEL, "tokens": [256, 7, 257]})
    assert (status, doc) == (200, {"prompt": "<s> t7 </s>"})


def test_tokenize_a_chat_through_the_chat_completions_prompt(server: RunningServer, client: openai.OpenAI):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    status, doc = post(server, "/tokenize", {"model": MODEL, "messages": messages})
    assert status == 200, doc
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.prompt_tokens == doc["count"] == len(doc["tokens"])
    status, text = post(server, "/detokenize", {"model": MODEL, "tokens": doc["tokens"]})
    assert status == 200 and "Be brief." in text["prompt"] and "Hello there" in text["prompt"]
    # a chat template field is served or refused as chat completions serve or refuse it
    status, doc = post(server, "/tokenize", {"model": MODEL, "messages": messages, "chat_template": "{{x}}"})
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                       extra_body={"chat_template": "{{x}}"})
    assert (status, doc["error"]["code"], doc["error"]["param"]) == (400, err.value.code, "chat_template")


@pytest.mark.parametrize("path, doc, code, param", [
    ("/tokenize", {"model": MODEL, "prompt": "x", "max_tokens": 3}, "unknown_parameter", "max_tokens"),
    ("/tokenize", {"model": MODEL, "prompt": ["a", "b"]}, "invalid_type", "prompt"),
    ("/tokenize", {"prompt": "x"}, None, "model"),
    ("/tokenize", {"model": MODEL, "messages": [], "prompt": "x"}, "unknown_parameter", "prompt"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "return_token_strs": "yes"}, "invalid_type",
     "return_token_strs"),
    ("/detokenize", {"model": MODEL, "tokens": [1, 258]}, "invalid_value", "tokens"),
    ("/detokenize", {"model": MODEL, "tokens": "abc"}, "invalid_type", "tokens"),
    ("/detokenize", {"model": MODEL, "tokens": [1], "skip": True}, "unknown_parameter", "skip"),
])
def test_bad_tokenize_requests_are_openai_400s(server: RunningServer, path: str, doc: dict, code: str | None,
                                                param: str):
    status, answer = post(server, path, doc)
    assert status == 400 and answer["error"]["param"] == param and answer["error"]["code"] == code, answer
    assert answer["error"]["type"] == "invalid_request_error"


def test_tokenize_names_models_as_the_api_does(server: RunningServer):
    for path, doc in (("/tokenize", {"model": "nope", "prompt": "x"}),
                      ("/detokenize", {"model": "simple", "tokens": [1]})):
        status, answer = post(server, path, doc)
        assert status == 404 and answer["error"]["code"] == "model_not_found", answer


def test_metrics_on_the_api_port_are_the_metrics_ports_page(server: RunningServer, client: openai.OpenAI):
    client.completions.create(model=MODEL, prompt="warm", max_tokens=2)
    api = f"http://{server.http_url}/metrics"
    on_api, on_port = scrape(api), scrape(server.metrics_url)
    assert set(on_api) == set(on_port)  # the same families and series; values move between the two scrapes
    assert vllm(on_api, "vllm:generation_tokens_total") == vllm(on_port, "vllm:generation_tokens_total") > 0
    assert any(name == "nv_inference_request_success_total" for name, _ in on_api)


KEYS = """
keys:
  - key: "infer-key"
    groups: [inference]
  - key: "stats-key"
    groups: [statistics]
"""


def test_keys_guard_metrics_and_tokenize_but_not_health(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """With --api-keys, /metrics on the API port needs a key holding `statistics` (as /v2/models/stats),
    /tokenize one holding `inference` (as a generation), and /health none (as Triton's health checks)."""
    folder = tmp_path_factory.mktemp("operations_keys")
    (folder / "keys.yaml").write_text(KEYS)
    (folder / "keys.yaml").chmod(0o600)
    keyed = start_server(repo, folder / "server.log", "--api-keys", str(folder / "keys.yaml"))
    try:
        assert call(keyed, "GET", "/health")[0] == 200
        assert call(keyed, "GET", "/metrics")[0] == 401
        assert call(keyed, "GET", "/metrics", key="infer-key")[0] == 403
        status, body, kind = call(keyed, "GET", "/metrics", key="stats-key")
        assert status == 200 and kind.startswith("text/plain") and b"vllm:num_requests_waiting" in body
        tokenize = {"model": MODEL, "prompt": "x"}
        assert call(keyed, "POST", "/tokenize", tokenize)[0] == 401
        assert call(keyed, "POST", "/tokenize", tokenize, key="stats-key")[0] == 403
        assert call(keyed, "POST", "/tokenize", tokenize, key="infer-key")[0] == 200
        with urllib.request.urlopen(keyed.metrics_url, timeout=10) as r:  # the metrics port: keyless
            assert r.status == 200
    finally:
        keyed.stop()
