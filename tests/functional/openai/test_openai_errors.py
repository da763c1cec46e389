"""Bad requests to the OpenAI-compatible API get OpenAI's error object and status, over raw HTTP, and the
server keeps serving: empty messages, max_tokens over the context, unknown and non-generative models,
malformed JSON, huge prompts, wrong types, fields we do not serve, bad request ids, wrong methods and paths.
The official client maps those statuses to its exception classes; that is checked once at the end."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

import openai
import pytest

from conftest import RunningServer, openai_client, start_server
from test_openai_api import MODEL, build_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_errors")
    running = start_server(build_repository(root / "repo"), root / "server.log")
    yield running
    running.stop()


def call(server: RunningServer, path: str, body: bytes | dict[str, Any] | None = None, method: str = "POST",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else {}, {k.lower(): v for k, v in resp.getheaders()}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def assert_error(status: int, doc: dict[str, Any], want_status: int, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error") -> str:
    assert status == want_status, doc
    error = doc["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_ and error["param"] == param and error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


CASES = [
    # (name, path, body, status, param, code)
    ("empty messages", "/v1/chat/completions", chat(messages=[]), 400, "messages", "empty_array"),
    ("no messages", "/v1/chat/completions", {"model": MODEL}, 400, "messages", None),
    ("messages not a list", "/v1/chat/completions", chat(messages="hi"), 400, "messages", None),
    ("a role we do not take", "/v1/chat/completions", chat(messages=[{"role": "function", "content": "x"}]),
     400, "messages[0].role", None),
    ("a tool message without its call's id", "/v1/chat/completions",
     chat(messages=[{"role": "tool", "content": "x"}]), 400, "messages[0].tool_call_id", None),
    ("an image part", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0]", None),
    ("max_tokens over the context", "/v1/chat/completions", chat(max_tokens=100000), 400, "messages",
     "context_length_exceeded"),
    ("max_tokens zero", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("max_tokens a string", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400,
     "max_tokens", "invalid_type"),
    ("max_tokens a bool", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": True}, 400,
     "max_tokens", "invalid_type"),
    ("temperature a string", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature",
     "invalid_type"),
    ("temperature too high", "/v1/chat/completions", chat(temperature=3), 400, "temperature",
     "invalid_value"),
    ("top_p over one", "/v1/chat/completions", chat(top_p=1.5), 400, "top_p", "invalid_value"),
    ("n too many", "/v1/chat/completions", chat(n=1000), 400, "n", "invalid_value"),
    ("stream not a bool", "/v1/chat/completions", chat(stream="yes"), 400, "stream", "invalid_type"),
    ("stream_options without stream", "/v1/chat/completions", chat(stream_options={"include_usage": True}),
     400, "stream_options", None),
    ("stop not strings", "/v1/chat/completions", chat(stop=[1, 2]), 400, "stop", None),
    ("prompt missing", "/v1/completions", {"model": MODEL}, 400, "prompt", None),
    ("prompt of mixed types", "/v1/completions", {"model": MODEL, "prompt": ["a", 1]}, 400, "prompt", None),
    ("token id outside the vocabulary", "/v1/completions", {"model": MODEL, "prompt": [1, 99999]}, 400,
     "prompt", "invalid_value"),
    ("top_logprobs without logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs",
     None),
    ("top_logprobs over 20", "/v1/chat/completions", chat(logprobs=True, top_logprobs=21), 400,
     "top_logprobs", "invalid_value"),
    ("chat logprobs not a bool", "/v1/chat/completions", chat(logprobs="yes"), 400, "logprobs",
     "invalid_type"),
    ("completions logprobs over 5", "/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 6}, 400,
     "logprobs", "invalid_value"),
    ("frequency_penalty over 2", "/v1/chat/completions", chat(frequency_penalty=2.5), 400,
     "frequency_penalty", "invalid_value"),
    ("presence_penalty not a number", "/v1/completions",
     {"model": MODEL, "prompt": "x", "presence_penalty": "1"}, 400, "presence_penalty", "invalid_type"),
    ("repetition_penalty 0", "/v1/chat/completions", chat(repetition_penalty=0), 400, "repetition_penalty",
     "invalid_value"),
    ("tool without a function", "/v1/chat/completions", chat(tools=[{"type": "function"}]), 400,
     "tools[0].function", None),
    ("tools on completions", "/v1/completions",
     {"model": MODEL, "prompt": "x", "tools": [{"type": "function"}]}, 400, "tools", "unsupported_parameter"),
    ("tool_choice required with response_format", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required",
          response_format={"type": "json_object"}), 400, "tool_choice", "invalid_value"),
    ("no model", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 400, "model",
     None),
    ("model not a string", "/v1/chat/completions", chat(model=7), 400, "model", None),
]


@pytest.mark.parametrize(("name", "path", "body", "status", "param", "code"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_fields_get_openais_error(server: RunningServer, name: str, path: str, body: dict[str, Any],
                                      status: int, param: str | None, code: str | None):
    got, doc, headers = call(server, path, body)
    assert_error(got, doc, status, param, code)
    assert headers["x-request-id"]  # every generation answer names its request, a refusal too


def test_unknown_and_non_generative_models_are_404_model_not_found(server: RunningServer):
    status, doc, _ = call(server, "/v1/chat/completions", chat(model="nope"))
    message = assert_error(status, doc, 404, "model", "model_not_found")
    assert "'nope' does not exist" in message
    status, doc, _ = call(server, "/v1/completions", {"model": "simple", "prompt": "x"})
    message = assert_error(status, doc, 404, "model", "model_not_found")
    assert "does not generate" in message
    status, doc, _ = call(server, "/v1/models/nope", method="GET")
    assert_error(status, doc, 404, "model", "model_not_found")


def test_malformed_json_and_a_body_that_is_not_an_object(server: RunningServer):
    for body in (b'{"model": "tiny_decoder", "messages": [', b"", b"[1, 2]", b"\xff\xfe"):
        status, doc, _ = call(server, "/v1/chat/completions", body)
        message = assert_error(status, doc, 400)
        assert "JSON" in message


def test_a_huge_prompt_is_refused_before_it_is_tokenized(server: RunningServer):
    prompt = "x" * (2 << 20)  # 2 MiB: within the body limit, far over any context
    status, doc, _ = call(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    message = assert_error(status, doc, 400, "prompt", "context_length_exceeded")
    assert "maximum context length is 512 tokens" in message
    status, doc, _ = call(server, "/v1/chat/completions",
                          chat(messages=[{"role": "user", "content": "y" * 600}], max_tokens=None))
    assert_error(status, doc, 400, "messages", "context_length_exceeded")


def test_request_ids_must_be_tokens(server: RunningServer):
    status, doc, _ = call(server, "/v1/chat/completions", chat(), headers={"X-Request-ID": "a b"})
    assert_error(status, doc, 400, "X-Request-ID")
    status, doc, _ = call(server, "/v1/chat/completions", chat(), headers={"X-Request-ID": "x" * 200})
    assert_error(status, doc, 400, "X-Request-ID")


def test_wrong_methods_and_paths(server: RunningServer):
    status, doc, _ = call(server, "/v1/chat/completions", method="GET")
    assert_error(status, doc, 405)
    status, doc, _ = call(server, "/v1/models", chat())
    assert_error(status, doc, 405)
    status, doc, _ = call(server, "/v1/embedding", {"model": MODEL, "input": "x"})
    assert_error(status, doc, 404, code="unknown_url", type_="not_found_error")
    status, doc, _ = call(server, "/v1/embeddings", method="GET")
    assert_error(status, doc, 405)


def test_the_server_keeps_serving_after_every_refusal(server: RunningServer):
    for _, path, body, *_ in CASES:
        call(server, path, body)
    status, doc, _ = call(server, "/v1/chat/completions", chat(max_tokens=3, temperature=0))
    assert status == 200 and doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] == 3
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    assert server.process.poll() is None


def test_the_openai_client_raises_its_own_error_classes(server: RunningServer):
    client = openai_client(server, timeout_s=30.0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=10**6)
    assert too_long.value.code == "context_length_exceeded" and too_long.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[])
    assert empty.value.param == "messages"


def test_duplicate_request_ids_in_flight_are_409_and_leave_the_running_one_alone(server: RunningServer):
    """The tiny model makes the running request's 480 tokens in ~200 ms, so on a loaded machine it can end
    before a duplicate arrives, which is then rightly answered (its id is free again): such a try shows
    nothing and is made again (at most five); a try counts when both duplicates were refused."""
    body = json.dumps({"model": MODEL, "prompt": "slow", "max_tokens": 480, "ignore_eos": True,
                       "stream": True}).encode()
    for tries in range(1, 6):
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: same-1\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:  # running
            piece = sock.recv(65536)
            assert piece
            got += piece
        answers = [call(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                        headers={"X-Request-ID": "same-1"})]
        # n=2 makes engine ids same-0 and same-1: the second collides; the first is withdrawn, the running
        # request with id same-1 is not touched
        if answers[0][0] == 409:
            answers.append(call(server, "/v1/completions",
                                {"model": MODEL, "prompt": "x", "max_tokens": 2, "n": 2},
                                headers={"X-Request-ID": "same"}))
        # Connection: close: the stream is close-delimited (RFC 9112 §6.3), it ends with our FIN
        while piece := sock.recv(65536):
            got += piece
        assert got.endswith(b"data: [DONE]\n\n") and b"Transfer-Encoding" not in got.split(b"\r\n\r\n")[0], \
            got[-300:]
        sock.close()
        assert b'"finish_reason":"length"' in got
        if len(answers) == 2 and answers[1][0] == 409:
            break
        assert answers[-1][0] == 200, answers[-1]  # the running request had ended: its id was free
        assert tries < 5, "the running request ended before its duplicates arrived, five times"
    for status, doc, _ in answers:
        assert_error(status, doc, 409, None, "request_id_in_use")
