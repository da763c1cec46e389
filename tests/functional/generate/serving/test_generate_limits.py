"""What one generation request may ask, and the answer when it asks too much, on both APIs of the tiny_decoder
example (context 512 tokens, a token budget of 256 per step, a byte tokenizer: a prompt of N characters is
N + 1 tokens): the `openai` package on /v1, tritonclient's ModelStreamInfer and raw HTTP generate[_stream].

- A prompt longer than the step's token budget, alone on the server, is generated (its first chunks sample
  nothing: issue 27, hole 10); prompts at and past the context are 400 `context_length_exceeded` on /v1
  (OpenAI's answer) and INVALID_ARG / 400 on Triton's paths, never a 500.
After each case the server still answers a correct inference on both protocols. Run under
HUBSERVE_TEST_WORKERS=2 as well (Makefile WORKER_SUITES)."""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from conftest import RunningServer, assert_serves_simple, openai_client, start_server, wait_until
from test_openai_api import MODEL, build_repository

CONTEXT = 512
BUDGET = 256  # max_num_batched_tokens of the example's config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("gen_limits")
    running = start_server(build_repository(folder / "repo"), folder / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def prompt_of(tokens: int) -> str:
    """A prompt of exactly `tokens` tokens (BOS + one per ASCII byte)."""
    return "".join(chr(97 + i % 26) for i in range(tokens - 1))


def post(server: RunningServer, path: str, doc: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def stream_infer(server: RunningServer, prompt: str, **sampling) -> tuple[list[str], str | None]:
    """One ModelStreamInfer request (stream true): its text pieces, and its error message if it failed."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        c.async_stream_infer(MODEL, [text, stream], parameters=sampling, enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                return pieces, error.message()
            array = result.as_numpy("text_output")
            if array is not None:
                pieces.append(b"".join(array.reshape(-1)).decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return pieces, None
    finally:
        c.stop_stream()
        c.close()

def context_error(err: openai.BadRequestError, param: str) -> str:
    body = err.body
    assert err.status_code == 400 and isinstance(body, dict), body
    assert body["code"] == "context_length_exceeded" and body["param"] == param, body
    assert body["message"].startswith(f"This model's maximum context length is {CONTEXT} tokens. However, ")
    return str(body["message"])


# ------------------------------------------------------------------------------------------ hole 10

LONG = prompt_of(BUDGET + 45)  # 301 tokens: a first chunk of 256 that samples nothing


def test_a_prompt_longer_than_the_budget_alone_completes_on_the_openai_api(server, client):
    done = client.completions.create(model=MODEL, prompt=LONG, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.prompt_tokens == BUDGET + 45 and done.usage.completion_tokens == 5
    streamed = client.completions.create(model=MODEL, prompt=LONG, max_tokens=5, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text
    assert_serves_simple(server)


def test_a_chat_with_a_system_prompt_and_history_past_the_budget_completes(server, client):
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 6},
                {"role": "user", "content": "What is the capital of France? " * 3},
                {"role": "assistant", "content": "Paris is the capital of France. " * 2},
                {"role": "user", "content": "And of Spain?"}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert done.usage.prompt_tokens > BUDGET and done.choices[0].finish_reason in ("stop", "length")
    pieces = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, stream=True)
    assert [c for c in pieces if c.choices and c.choices[0].finish_reason]


def test_a_prompt_longer_than_the_budget_alone_completes_on_tritons_paths(server, client):
    expected = client.completions.create(model=MODEL, prompt=LONG, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    params = {"max_tokens": 6, "ignore_eos": True, "temperature": 0}
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": LONG, "exclude_input_in_output": True, "parameters": params})
    assert status == 200 and json.loads(body)["text_output"] == expected, body
    status, body = post(server, f"/v2/models/{MODEL}/generate_stream",
                        {"text_input": LONG, "stream": True, "parameters": params})
    assert status == 200, body
    events = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e]
    assert "".join(e["text_output"] for e in events) == expected
    pieces, error = stream_infer(server, LONG, **params)
    assert error is None and "".join(pieces) == expected
    assert_serves_simple(server)


def test_a_prompt_that_fills_the_context_exactly_runs_and_one_token_more_is_refused(server, client):
    fits = client.completions.create(model=MODEL, prompt=prompt_of(CONTEXT - 1), max_tokens=1,
                                     extra_body={"ignore_eos": True})
    assert fits.usage.total_tokens == CONTEXT and fits.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt_of(CONTEXT), max_tokens=1)
    assert "you requested 513 tokens (512 in the prompt, 1 in the completion)" in context_error(err.value,
                                                                                                "prompt")
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": prompt_of(CONTEXT - 1), "max_tokens": 1})
    assert status == 200, body
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": prompt_of(CONTEXT), "max_tokens": 1})
    assert status == 400 and f"context of {CONTEXT} tokens" in json.loads(body)["error"], body
    assert_serves_simple(server)


@pytest.mark.parametrize("tokens", [CONTEXT, CONTEXT + 1, 3 * CONTEXT])
def test_prompts_at_and_past_the_context_are_400_on_every_path(server, client, tokens):
    prompt = prompt_of(tokens)
    with pytest.raises(openai.BadRequestError) as err:  # no max_tokens: what the context leaves is nothing
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
    context_error(err.value, "messages")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=16)
    context_error(err.value, "prompt")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, stream=True)
    context_error(err.value, "prompt")
    for path in ("generate", "generate_stream"):
        status, body = post(server, f"/v2/models/{MODEL}/{path}", {"text_input": prompt, "max_tokens": 1})
        assert status == 400 and f"context of {CONTEXT} tokens" in json.loads(body)["error"], body
    _, error = stream_infer(server, prompt, max_tokens=1)
    assert error is not None and f"context of {CONTEXT} tokens" in error
    assert_serves_simple(server)


def test_max_tokens_past_what_the_context_leaves_is_400_not_clamped(server, client):
    """vLLM's answer (and OpenAI's): a 400 saying how much was asked; the request is not cut to fit."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt_of(300), max_tokens=CONTEXT - 299)
    assert "you requested 513 tokens (300 in the prompt, 213 in the completion)" in context_error(
        err.value, "prompt")
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": prompt_of(300), "max_tokens": CONTEXT - 299})
    assert status == 400 and "prompt's 300 tokens plus max_tokens 213 exceed it" in json.loads(body)["error"]
    _, error = stream_infer(server, prompt_of(300), max_tokens=CONTEXT - 299)
    assert error is not None and "prompt's 300 tokens plus max_tokens 213 exceed it" in error


# ------------------------------------------------------------------------------------------ hole 4

def test_stop_lists_past_their_bounds_are_refused_on_the_openai_api(server, client):
    """At most 4 stop strings of at most 256 characters and 128 stop token ids: each is checked after every
    token on the engine's thread (a million ids once cost every request on the server 20-30x)."""
    cases = [({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
             ({"stop": ["z" * 257]}, "stop[0]", "string_above_max_length"),
             ({"extra_body": {"stop_token_ids": list(range(300, 300 + 1_000_000))}}, "stop_token_ids",
              "array_above_max_length")]
    for extra, param, code in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=4, **extra)
        assert err.value.body["param"] == param and err.value.body["code"] == code, err.value.body
    assert_serves_simple(server)


def test_stop_lists_past_their_bounds_are_invalid_argument_on_tritons_paths(server):
    million = json.dumps({"stop_token_ids": list(range(300, 300 + 1_000_000))})
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": "hi", "max_tokens": 4, "sampling_parameters": million})
    assert status == 400 and "send at most 128" in json.loads(body)["error"], body
    status, body = post(server, f"/v2/models/{MODEL}/generate_stream",
                        {"text_input": "hi", "max_tokens": 4, "stream": True,
                         "sampling_parameters": json.dumps({"stop": ["a", "b", "c", "d", "e"]})})
    assert status == 400 and "'stop' has 5 strings; send at most 4" in json.loads(body)["error"], body
    _, error = stream_infer(server, "hi", max_tokens=4, stop="q" * 300)
    assert error is not None and "each may have at most 256" in error
    assert_serves_simple(server)


def test_a_full_set_of_stop_token_ids_stops_at_the_first_generated(server, client):
    prompt, params = "Once upon a time", {"max_tokens": 24, "temperature": 0}
    free = client.completions.create(model=MODEL, prompt=prompt, logprobs=0, **params,
                                     extra_body={"ignore_eos": True})
    # the byte tokenizer: an ASCII token shows as its one character (others may show as U+FFFD)
    tokens = [ord(t) if len(t) == 1 and ord(t) < 128 else None for t in free.choices[0].logprobs.tokens]
    stop_at = next(i for i, t in enumerate(tokens) if i >= 3 and t is not None and t not in tokens[:i])
    ids = sorted({tokens[stop_at], *(set(range(128)) - set(tokens[:stop_at + 1]))})
    ids += list(range(1000, 1000 + 128 - len(ids)))  # ids no output has: the set is full
    stopped = client.completions.create(model=MODEL, prompt=prompt, **params,
                                        extra_body={"ignore_eos": True, "stop_token_ids": ids})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == stop_at + 1
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"text_input": prompt, "exclude_input_in_output": True, "ignore_eos": True,
                         "sampling_parameters": json.dumps({**params, "stop_token_ids": ids})})
    assert status == 200 and json.loads(body)["text_output"] == stopped.choices[0].text, body


# ------------------------------------------------------------------------------------------ head-of-line

def waiting_sequences(server: RunningServer) -> float:
    """The engine's waiting sequences (0 until its first request built it and its gauges appear)."""
    try:
        return server.metric("hubserve_generation_waiting_sequences", MODEL)
    except AssertionError:
        return 0.0


def test_a_small_request_is_not_stuck_behind_every_sequence_of_a_large_fan_out(server, client):
    """8 prompts × n=16 is 128 sequences of 32 tokens for 32 seats: first-in first-out, a request arriving
    after it was admitted only once all 128 had been, and 64 (one process) or 96 (--workers 2) of the
    fan-out's choices had finished when it was done (checked with the turn taken out of waiting.py: the waves
    overlap, as the step's token budget admits the first one over several steps). Admitted in turn with it,
    it takes one of the seats the first wave frees, or one of the first wave's own: 0-32 had finished.
    Counted on the fan-out's stream, not timed: under 48."""
    finished: list[int] = []  # the fan-out's choices, by index, as their last chunk arrives
    at_small_done: list[int] = []
    # The small request's own client, its connection open before the fan-out starts: with --workers, a new
    # connection is handed to a frontend process first, which on a loaded machine can outlast the first wave.
    other = openai_client(server)
    other.models.list()

    def big() -> None:
        stream = client.completions.create(model=MODEL, prompt=[f"prompt {i}" for i in range(8)], n=16,
                                           max_tokens=32, temperature=1.0, stream=True,
                                           extra_body={"ignore_eos": True})
        for chunk in stream:
            finished.extend(c.index for c in chunk.choices if c.finish_reason is not None)

    thread = threading.Thread(target=big)
    thread.start()
    try:
        wait_until(lambda: waiting_sequences(server) > 0, "the fan-out's sequences waiting for seats")
        small = other.completions.create(model=MODEL, prompt="hello", max_tokens=4,
                                         extra_body={"ignore_eos": True})
        at_small_done.append(len(finished))
    finally:
        thread.join(120)
        other.close()
    assert small.usage.completion_tokens == 4 and sorted(finished) == list(range(128)), finished
    assert at_small_done[0] < 48, at_small_done
    assert_serves_simple(server)
