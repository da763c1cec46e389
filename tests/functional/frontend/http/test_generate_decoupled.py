"""generate_stream over a decoupled model: one server-sent event per response the model sends, in order,
then the end of the stream; an error response mid-stream is an error event and the stream goes on, as
Triton's does; `generate` refuses a model that answered more than once, in Triton's words; a
client that leaves mid-stream cancels the model's work. The model is the example `repeat_stream`.
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request

import pytest

from conftest import start_server
from engine.frontend.http.sse import EventReader
from hubserve_harness import EXAMPLES
from python_models import DECOUPLED_MISUSE, DECOUPLED_MISUSE_CONFIG, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("generate_decoupled_repository")
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    write_model(repo, "misuse", DECOUPLED_MISUSE, DECOUPLED_MISUSE_CONFIG)
    srv = start_server(repo, tmp_path_factory.mktemp("generate_decoupled_server") / "server.log",
                       "--canary-interval-secs", "0", ready_timeout=120)
    yield srv
    srv.stop()


def _post(server, path: str, doc: dict) -> tuple[int, str, bytes]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode(),
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def _events(body: bytes) -> list[dict]:
    reader = EventReader()
    return [json.loads(data) for data in reader.feed(body)]


def test_generate_stream_sends_an_event_per_response(server) -> None:
    status, content_type, body = _post(server, "/v2/models/repeat_stream/generate_stream",
                                       {"IN": [5, 6, 7, 8]})
    assert status == 200 and content_type.startswith("text/event-stream"), (status, body)
    events = _events(body)
    assert [e["OUT"] for e in events] == [5, 6, 7, 8] and [e["IDX"] for e in events] == [0, 1, 2, 3]


def test_an_error_response_mid_stream_is_an_event_and_the_stream_goes_on(server) -> None:
    # `misuse` MODE 5 sends "one", an error response, "two", then the final flag alone.
    status, content_type, body = _post(server, "/v2/models/misuse/generate_stream", {"MODE": 5})
    assert status == 200 and content_type.startswith("text/event-stream"), (status, body)
    piece = {"model_name": "misuse", "model_version": "1"}
    assert _events(body) == [{"OUT": "one", **piece}, {"error": "bad piece"}, {"OUT": "two", **piece}]
    status, _, body = _post(server, "/v2/models/repeat_stream/generate_stream", {"IN": [4]})  # serves on
    assert status == 200 and [e["OUT"] for e in _events(body)] == [4]


def test_generate_refuses_more_than_one_response(server) -> None:
    status, _, body = _post(server, "/v2/models/repeat_stream/generate", {"IN": [1, 2]})
    assert status == 500 and "exactly 1 response" in json.loads(body)["error"], body
    status, _, body = _post(server, "/v2/models/repeat_stream/generate", {"IN": [9]})
    assert status == 200 and json.loads(body)["OUT"] == 9, body


def test_a_client_leaving_mid_stream_cancels_the_model(server) -> None:
    body = json.dumps({"IN": list(range(1000)), "DELAY_MS": 20}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/repeat_stream/generate_stream HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    seen = b""
    while seen.count(b"data: ") < 3:  # three events arrived: the model is mid-answer
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    sock.close()
    # The model stops (is_cancelled) and its one instance serves the next request at once, not 20 s later.
    status, _, answer = _post(server, "/v2/models/repeat_stream/generate_stream", {"IN": [3]})
    assert status == 200 and [e["OUT"] for e in _events(answer)] == [3]
