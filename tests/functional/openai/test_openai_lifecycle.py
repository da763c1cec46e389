"""A generative model's engine follows the repository (engine/generate/serving/registry.py): unloading the
model lets a stream in flight finish, later requests are refused in OpenAI's shape, and a new load serves
again
with a fresh engine. Explicit model control, the repository API over HTTP."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from conftest import RunningServer, start_server
from test_openai_api import MODEL, build_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_lifecycle")
    running = start_server(build_repository(root / "repo"), root / "server.log", "--model-control-mode",
                           "explicit", "--load-model", MODEL)
    yield running
    running.stop()


def post(server: RunningServer, path: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else {}


def chat(max_tokens: int = 4) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


def test_unload_lets_the_stream_finish_then_refuses_and_a_load_serves_again(server: RunningServer):
    assert post(server, "/v1/chat/completions", chat())[0] == 200
    # 8 choices of 480 tokens: seconds of work, so the unload surely comes while it runs
    body = json.dumps({**chat(480), "stream": True, "ignore_eos": True, "n": 8}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"X-Request-ID: long-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 3:
        piece = sock.recv(65536)
        assert piece
        got += piece
    assert post(server, f"/v2/repository/models/{MODEL}/unload", {})[0] == 200
    status, doc = post(server, "/v1/chat/completions", chat())
    assert status in (404, 503) and doc["error"]["param"] == "model", doc
    # the stream in flight runs to its end (Connection: close: close-delimited, RFC 9112 §6.3)
    while piece := sock.recv(65536):
        got += piece
    assert got.endswith(b"data: [DONE]\n\n") and b"Transfer-Encoding" not in got.split(b"\r\n\r\n")[0], \
        got[-300:]
    sock.close()
    events = [json.loads(line[6:]) for line in got.split(b"\n") if line.startswith(b"data: {")]
    finished = [c for e in events for c in e["choices"] if c["finish_reason"]]
    assert len(finished) == 8 and {c["finish_reason"] for c in finished} == {"length"}
    log = server.log()
    assert log.index(f"model {MODEL} version 1 UNLOADING") < log.index("request long-stream-7: finished")
    assert post(server, f"/v2/repository/models/{MODEL}/load", {})[0] == 200
    status, doc = post(server, "/v1/chat/completions", chat(5))
    assert status == 200 and doc["usage"]["completion_tokens"] == 5
