"""Triton's side of the generation engine: the tiny_decoder example as a decoupled model (text_input, stream,
sampling_parameters, ... → text_output, as Triton's vLLM backend shows an LLM) over gRPC ModelStreamInfer
with tritonclient and over raw HTTP generate / generate_stream. Greedy text through this path equals the
OpenAI API's for the same prompt (one engine, one KV cache per version); a client leaving frees its blocks."""

from __future__ import annotations

import json
import queue
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import RunningServer, start_example_server, wait_until

MODEL = "tiny_decoder"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_example_server(tmp_path_factory, "gen_triton", MODEL)
    yield running
    running.stop()


def _post(server: RunningServer, path: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def openai_greedy(server: RunningServer, prompt: str, max_tokens: int, **extra: float) -> str:
    status, doc = _post(server, "/v1/completions", {"model": MODEL, "prompt": prompt,
                                                    "max_tokens": max_tokens, "temperature": 0,
                                                    "ignore_eos": True, **extra})
    assert status == 200, doc
    return doc["choices"][0]["text"]


def inputs(prompt: str, stream: bool | None = None, sampling: dict | None = None,
           exclude: bool | None = None) -> list[grpcclient.InferInput]:
    def one(name: str, datatype: str, value) -> grpcclient.InferInput:
        x = grpcclient.InferInput(name, [1], datatype)
        x.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
        return x

    out = [one("text_input", "BYTES", prompt.encode())]
    if stream is not None:
        out.append(one("stream", "BOOL", stream))
    if sampling is not None:
        out.append(one("sampling_parameters", "BYTES", json.dumps(sampling).encode()))
    if exclude is not None:
        out.append(one("exclude_input_in_output", "BOOL", exclude))
    return out


class Stream:
    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def until_final(self, timeout: float = 60) -> list:
        got = []
        while True:
            result, error = self.results.get(timeout=timeout)
            got.append((result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def texts(results: list) -> list[str]:
    out = []
    for result, error in results:
        assert error is None, error
        array = result.as_numpy("text_output")
        if array is not None:
            out.append(b"".join(array.reshape(-1)).decode())
    return out


GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def test_metadata_and_config_show_the_llm_signature(server: RunningServer):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [
        ("text_input", "BYTES"), ("stream", "BOOL"), ("sampling_parameters", "BYTES"),
        ("exclude_input_in_output", "BOOL"), ("max_tokens", "INT32")]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("text_output", "BYTES")]
    config = client.get_model_config(MODEL, as_json=True)["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    assert config.get("max_batch_size", 0) == 0
    client.close()


def test_grpc_stream_gives_a_response_per_piece_equal_to_the_openai_text(server: RunningServer):
    expected = openai_greedy(server, PROMPT, 12)
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, stream=True, sampling=GREEDY), request_id="s1")
        results = stream.until_final()
    finally:
        stream.close()
    pieces = texts(results)
    assert len(pieces) > 1 and "".join(pieces) == expected
    assert all(r.get_response().id == "s1" for r, _ in results)
    flags = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in results]
    assert flags == [False] * (len(flags) - 1) + [True]


def test_grpc_stream_false_gives_one_whole_answer_with_or_without_the_prompt(server: RunningServer):
    expected = openai_greedy(server, PROMPT, 12)
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, sampling=GREEDY), request_id="w1")
        whole = stream.until_final()
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, stream=False, sampling=GREEDY, exclude=True))
        excluded = stream.until_final()
    finally:
        stream.close()
    assert texts(whole) == [PROMPT + expected]  # vLLM's default: the prompt, then the completion
    assert texts(excluded) == [expected]


def test_unary_infer_is_triton_decoupled_refusal(server: RunningServer):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer(MODEL, inputs(PROMPT, stream=False))
    assert "StatusCode.UNIMPLEMENTED" in str(e.value.status())
    assert "doesn't support models with decoupled transaction policy" in e.value.message()
    client.close()


def test_penalties_in_sampling_parameters_give_the_openai_apis_answer(server: RunningServer):
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 1.5, "repetition_penalty": 1.3}
    expected = openai_greedy(server, PROMPT, 24, **penalties)
    assert expected != openai_greedy(server, PROMPT, 24)  # the penalties change this answer
    stream = Stream(server.grpc_url)
    try:
        sampling = GREEDY | penalties | {"max_tokens": 24}
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, sampling=sampling, exclude=True))
        got = stream.until_final()
    finally:
        stream.close()
    assert texts(got) == [expected]


def test_bad_sampling_parameters_are_invalid_argument_and_the_stream_goes_on(server: RunningServer):
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, sampling={"temprature": 0}))
        (_, error), = stream.until_final()
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, sampling={"max_tokens": 600}))
        (_, too_long), = stream.until_final()
        stream.client.async_stream_infer(MODEL, inputs(PROMPT, sampling={"max_tokens": 3}))
        after = stream.until_final()
    finally:
        stream.close()
    assert error is not None and "unknown sampling parameter(s) 'temprature'" in error.message()
    assert too_long is not None and "context of 512 tokens" in too_long.message()
    assert len(texts(after)) == 1


def test_http_generate_and_generate_stream(server: RunningServer):
    expected = openai_greedy(server, "Hello", 10)
    status, doc = _post(server, f"/v2/models/{MODEL}/generate",
                        {"id": "g1", "text_input": "Hello", "exclude_input_in_output": True,
                         "parameters": {"temperature": 0, "max_tokens": 10, "ignore_eos": True}})
    assert status == 200 and doc["text_output"] == expected and doc["id"] == "g1", doc
    events = _stream_events(server, {"text_input": "Hello", "stream": True, "parameters": GREEDY | {
        "max_tokens": 10}})
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected


def test_http_generate_errors_are_400(server: RunningServer):
    status, doc = _post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": "Hello", "parameters": {"top_k": "many"}})
    assert status == 400 and "top_k" in doc["error"]


def _stream_events(server: RunningServer, doc: dict) -> list[dict]:
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL}/generate_stream",
                                 data=json.dumps(doc).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        body = r.read().decode()
    return [json.loads(chunk[len("data: "):]) for chunk in body.split("\n\n") if chunk]


def _metric(server: RunningServer, name: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_a_client_leaving_generate_stream_frees_its_kv_blocks(server: RunningServer):
    """A client leaves a stream that holds KV blocks: they are all free again. The tiny model makes the
    450 tokens in ~190 ms, so on a loaded machine the generation can end before the scrape that should see
    its blocks; such a try shows nothing and is made again (at most five)."""
    openai_greedy(server, "warm", 1)  # the engine exists, so its gauges do
    free_before = _metric(server, "hubserve_generation_kv_blocks_free")
    body = json.dumps({"text_input": PROMPT, "stream": True,
                       "parameters": {"max_tokens": 450, "ignore_eos": True}}).encode()
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        sock.sendall(b"POST /v2/models/%s/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (MODEL.encode(), len(body), body))
        got = b""
        while got.count(b"data: ") < 5:
            piece = sock.recv(65536)
            assert piece, "the stream ended early"
            got += piece
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
        held = _metric(server, "hubserve_generation_kv_blocks_used") > 0  # (0 once it ended: a void try)
        sock.close()
        wait_until(lambda: _metric(server, "hubserve_generation_running_sequences") == 0, "still running")
        wait_until(lambda: _metric(server, "hubserve_generation_kv_blocks_free") == free_before,
                   "blocks not freed")
        if held:
            return
    raise AssertionError("no try was seen holding KV blocks: each generation ended before the scrape")


def test_a_grpc_stream_cancelled_mid_generation_frees_its_kv_blocks(server: RunningServer):
    openai_greedy(server, "warm", 1)
    free_before = _metric(server, "hubserve_generation_kv_blocks_free")
    stream = Stream(server.grpc_url)
    stream.client.async_stream_infer(MODEL, inputs(PROMPT, stream=True, sampling={"max_tokens": 450,
                                                                                  "ignore_eos": True}))
    for _ in range(3):
        result, error = stream.results.get(timeout=60)
        assert error is None
    stream.close(cancel=True)
    wait_until(lambda: _metric(server, "hubserve_generation_running_sequences") == 0, "still running")
    wait_until(lambda: _metric(server, "hubserve_generation_kv_blocks_free") == free_before,
              "blocks not freed")


def test_both_apis_share_one_engine(server: RunningServer):
    """The OpenAI API's and Triton's requests land in the same engine: its finished count grows with both."""
    def finished() -> float:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith("hubserve_generation_requests_finished_total{"))
    before = finished()
    openai_greedy(server, "one", 2)
    _post(server, f"/v2/models/{MODEL}/generate", {"text_input": "two", "parameters": {"max_tokens": 2}})
    assert finished() == before + 2


def _generate_text(server: RunningServer, prompt: str, parameters: dict) -> str:
    status, doc = _post(server, f"/v2/models/{MODEL}/generate", {"text_input": prompt,
                                                                 "exclude_input_in_output": True,
                                                                 "parameters": parameters})
    assert status == 200, doc
    return doc["text_output"]


def test_vllm_sampling_fields_over_http_generate_give_the_openai_apis_answer(server: RunningServer):
    """min_p, min_tokens, include_stop_str_in_output, truncate_prompt_tokens and skip_special_tokens (vLLM's
    SamplingParams fields, as Triton's vLLM backend takes them) answer as the OpenAI API answers the same
    fields, and each changes the answer it is meant to change."""
    base = openai_greedy(server, PROMPT, 16)
    stop = next(c for c in base[2:] if c.isprintable() and c != "\ufffd")  # a character greedy writes early
    cases: list[tuple[dict, dict]] = [
        # min_p 1: only the most likely token survives, so a hot seeded sampling is greedy
        ({"temperature": 1.5, "seed": 3, "min_p": 1.0}, {"temperature": 1.5, "seed": 3}),
        ({"temperature": 0, "stop": stop, "include_stop_str_in_output": True}, {"temperature": 0,
                                                                                  "stop": stop}),
        ({"temperature": 0, "stop": stop, "min_tokens": 12}, {"temperature": 0, "stop": stop}),
        ({"temperature": 0, "truncate_prompt_tokens": 3}, {"temperature": 0}),
    ]
    for fields, without in cases:
        common = {"max_tokens": 16, "ignore_eos": True}
        served = _generate_text(server, PROMPT, common | fields)
        assert served == openai_greedy(server, PROMPT, 16, **fields), fields
        assert served != _generate_text(server, PROMPT, common | without), fields
    assert _generate_text(server, PROMPT, {"temperature": 0, "max_tokens": 16, "ignore_eos": True,
                                           "skip_special_tokens": False}) == base


def test_bad_vllm_sampling_fields_are_400_and_add_special_tokens_is_not_one(server: RunningServer):
    for parameters, words in [({"min_p": 2.0}, "min_p"), ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
                              ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
                              ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens")]:
        status, doc = _post(server, f"/v2/models/{MODEL}/generate", {"text_input": "Hi",
                                                                     "parameters": parameters})
        assert status == 400 and words in doc["error"], doc
    # vLLM takes add_special_tokens with the prompt, not in its sampling parameters: unknown there, as in vLLM
    status, doc = _post(server, f"/v2/models/{MODEL}/generate", {
        "text_input": "Hi", "sampling_parameters": json.dumps({"add_special_tokens": False})})
    assert status == 400 and "unknown sampling parameter(s) 'add_special_tokens'" in doc["error"], doc
