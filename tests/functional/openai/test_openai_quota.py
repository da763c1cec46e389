"""Per-key `tokens_per_minute` on the OpenAI API (engine/openai/token_quotas.py), against a real server with a
keys file: the `openai` package as the client, and raw HTTP for the 429's Retry-After and error object; and
the same bucket charged by Triton's generate, generate_stream (raw HTTP) and ModelStreamInfer (tritonclient)
to the generative model. Run under HUBSERVE_TEST_WORKERS=2 as well: the quota lives where the engines are,
so it holds server-wide, and a frontend process hands the engine each request's key digest."""

from __future__ import annotations

import http.client
import json
import queue

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from conftest import RunningServer, start_server
from test_openai_api import MODEL, build_repository

LIMIT = 200  # tokens a minute for the limited key: refills at 3.3 a second, so a test's few seconds add ~20

KEYS = f"""
keys:
  - key: "tpm-key"
    groups: [inference]
    tokens_per_minute: {LIMIT}
  - key: "refund-key"
    groups: [inference]
    tokens_per_minute: {LIMIT}
  - key: "triton-key"
    groups: [inference]
    tokens_per_minute: {LIMIT}
  - key: "triton-refund-key"
    groups: [inference]
    tokens_per_minute: {LIMIT}
  - key: "free-key"
    groups: [inference]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("quota")
    repo = build_repository(folder / "repo")
    (folder / "keys.yaml").write_text(KEYS)
    (folder / "keys.yaml").chmod(0o600)  # private, or the server refuses it
    running = start_server(repo, folder / "server.log", "--api-keys", str(folder / "keys.yaml"))
    yield running
    running.stop()


def client(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key=key, max_retries=0, timeout=60.0)


def complete(c: openai.OpenAI, max_tokens: int, prompt: str = "abcd"):
    return c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                extra_body={"ignore_eos": True})


def raw_post(server: RunningServer, key: str, body: dict) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    return conn.getresponse()


def test_tokens_are_reserved_up_front_and_refused_with_429_when_spent(server: RunningServer):
    limited = client(server, "tpm-key")
    first = complete(limited, 120)  # 4 prompt tokens + 120 reserved, all used (ignore_eos)
    assert first.usage.completion_tokens == 120
    with pytest.raises(openai.RateLimitError) as err:  # 124 more do not fit in what is left of the minute
        complete(limited, 120)
    body = err.value.body
    assert err.value.status_code == 429 and err.value.code == "rate_limit_exceeded"
    assert body["type"] == "tokens" and f"Limit {LIMIT}" in body["message"]
    answer = raw_post(server, "tpm-key", {"model": MODEL, "prompt": "abcd", "max_tokens": 120})
    doc = json.loads(answer.read())
    assert answer.status == 429 and int(answer.getheader("Retry-After")) >= 1
    assert doc["error"]["code"] == "rate_limit_exceeded" and "try again in" in doc["error"]["message"]
    # what is left still serves a small request, and another key has its own (unlimited) minute
    assert complete(limited, 10).usage.completion_tokens == 10
    assert complete(client(server, "free-key"), 200).usage.completion_tokens == 200


def test_a_request_larger_than_the_minute_is_refused_as_too_large(server: RunningServer):
    with pytest.raises(openai.RateLimitError) as err:
        complete(client(server, "tpm-key"), LIMIT + 1)
    assert "Request too large" in err.value.body["message"] and err.value.code == "rate_limit_exceeded"


def test_tokens_not_generated_go_back_to_the_key(server: RunningServer):
    limited = client(server, "refund-key")
    stopped = limited.completions.create(model=MODEL, prompt="abcd", max_tokens=150, temperature=0.0,
                                         stop=[chr(c) for c in range(97, 101)])
    used = stopped.usage.total_tokens
    assert stopped.usage.completion_tokens < 150  # a stop string ended it early, so of the 154 reserved ...
    asked = LIMIT - used - 5  # ... what it did not use came back: without it only LIMIT - 154 would be left
    assert asked > LIMIT - 154
    assert complete(limited, asked - 4).usage.completion_tokens == asked - 4


# ------------------------------------------------------------------------------------------ Triton's paths

def generate(server: RunningServer, key: str, max_tokens: int, path: str = "generate", **extra):
    """A generate (or generate_stream) request for `max_tokens` tokens of "abcd" (5 prompt tokens)."""
    body = {"text_input": "abcd", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, **extra}
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", f"/v2/models/{MODEL}/{path}", json.dumps(body),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read()


def stream_infer(server: RunningServer, key: str, max_tokens: int) -> str | None:
    """One ModelStreamInfer request under `key`: None when it generated, else its error message."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put(error),
                   headers={"authorization": f"Bearer {key}"})
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"abcd"], dtype=object))
        c.async_stream_infer(MODEL, [text], parameters={"max_tokens": max_tokens, "ignore_eos": True})
        error = results.get(timeout=60)
        return None if error is None else error.message()
    finally:
        c.stop_stream()
        c.close()


def test_tritons_generate_paths_charge_the_keys_tokens_per_minute(server: RunningServer):
    """Issue 27: 3,200+ tokens ran over generate on a key limited to 2,000. The reservation and the refusal
    are the OpenAI API's, in each protocol's form (429; an error on the gRPC stream, which goes on)."""
    status, body = generate(server, "triton-key", 120)  # 5 + 120 of 200
    assert status == 200, body
    refusal = f"Rate limit reached for tokens per min (TPM) on this API key: Limit {LIMIT}, "
    for path in ("generate", "generate_stream"):
        status, body = generate(server, "triton-key", 120, path, stream=path == "generate_stream")
        assert status == 429 and json.loads(body)["error"].startswith(refusal), body
    error = stream_infer(server, "triton-key", 120)
    assert error is not None and error.startswith(refusal)
    with pytest.raises(openai.RateLimitError):  # one bucket per key, whichever API spends it
        complete(client(server, "triton-key"), 120)
    assert stream_infer(server, "triton-key", 10) is None  # what is left still serves a small request
    status, body = generate(server, "triton-key", LIMIT)
    assert status == 429 and "Request too large for tokens per min (TPM)" in json.loads(body)["error"], body
    status, body = generate(server, "free-key", 300)
    assert status == 200, body


def test_tritons_generate_gives_back_what_it_did_not_use(server: RunningServer):
    stops = [chr(c) for c in range(97, 101)]
    free = client(server, "free-key").completions.create(model=MODEL, prompt="abcd", max_tokens=150,
                                                         temperature=0.0, stop=stops)
    used = free.usage.total_tokens  # the same greedy tokens as over generate: one engine
    assert free.usage.completion_tokens < 150
    status, body = generate(server, "triton-refund-key", 150, ignore_eos=False,
                            sampling_parameters=json.dumps({"stop": stops}))
    assert status == 200, body  # 155 reserved, `used` charged
    asked = LIMIT - used - 10  # fits only if the unused tokens came back: else LIMIT - 155 (+ a few) is left
    assert asked + 5 > LIMIT - 155 + 10
    assert stream_infer(server, "triton-refund-key", asked) is None
