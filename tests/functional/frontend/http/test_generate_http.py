"""The generate extension against the real server (one process and --workers 2), over raw sockets: what
`/generate` and `/generate_stream` answer, in Triton's words and statuses (Triton 2.51 answered the same
bodies likewise; the module docstring of engine/frontend/http/generate_codec.py lists where we differ)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from dataclasses import dataclass, field

import orjson
import pytest

from conftest import EXAMPLES, start_server
from engine.frontend.http.sse import EventReader
from hubserve_models import examples
from python_models import BEHAVE, BEHAVE_CONFIG, ONE_IN_ONE_OUT, PARAMETER_ECHO, write_model

SIMPLE = {"INPUT0": list(range(16)), "INPUT1": [1] * 16}
SUM = [i + 1 for i in range(16)]
DIFF = [i - 1 for i in range(16)]
SLOW_CONFIG = """name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 60000000 preferred_batch_size: [ 8 ] }
parameters { key: "early_dispatch" value { string_value: "false" } }
"""


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name in ("simple", "simple_identity"):
        (root / name).mkdir()
        shutil.copy(EXAMPLES / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, ["simple", "simple_identity"])
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    shutil.copy(root / "simple" / "1" / "model.onnx", root / "slow" / "1" / "model.onnx")
    write_model(root, "echo", PARAMETER_ECHO, ONE_IN_ONE_OUT)
    write_model(root, "behave", BEHAVE, BEHAVE_CONFIG)
    srv = start_server(root, tmp_path_factory.mktemp("log") / "server.log", "--workers", request.param,
                       "--model-control-mode", "none")
    yield srv
    srv.stop()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)  # a chunked body's chunks, as they came

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        return [orjson.loads(e) for e in EventReader().feed(self.body)]


class Connection:
    """One client connection, reading answers by their framing (Content-Length, chunked, or close)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, path: str, body: bytes | dict, method: str = "POST", headers: str = "") -> None:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        self.sock.sendall(f"{method} /v2/models/{path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}"
                          f"\r\n{headers}\r\n".encode() + data)

    def _more(self) -> bytes:
        data = self.sock.recv(65536)
        self.buffer += data
        return data

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._more():
                raise EOFError("connection closed mid-answer")
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._more():
                raise EOFError("connection closed mid-line")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def read(self) -> Reply:
        status = int(self._line().split()[1])
        headers = {}
        while line := self._line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            return Reply(status, headers, self._take(int(headers["content-length"])))
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int(self._line(), 16):
                chunks.append(self._take(size))
                assert self._take(2) == b"\r\n"
            assert self._line() == b""
            return Reply(status, headers, b"".join(chunks), chunks)
        while self._more():
            pass
        body, self.buffer = self.buffer, b""
        return Reply(status, headers, body)


def post(server, path: str, body: bytes | dict, **kw) -> Reply:
    conn = Connection(server.http_port)
    try:
        conn.send(path, body, **kw)
        return conn.read()
    finally:
        conn.close()


def test_generate_simple(server):
    reply = post(server, "simple/generate", {**SIMPLE, "id": "42"})
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    assert reply.body == orjson.dumps({"OUTPUT0": SUM, "OUTPUT1": DIFF, "id": "42", "model_name": "simple",
                                       "model_version": "1"})


def test_generate_bytes_model_one_element_is_a_scalar(server):
    assert post(server, "simple_identity/generate", {"INPUT0": "héllo"}).json() == \
        {"OUTPUT0": "héllo", "model_name": "simple_identity", "model_version": "1"}
    assert post(server, "simple_identity/generate", {"INPUT0": ["a", "b"]}).json()["OUTPUT0"] == ["a", "b"]


def test_versions_path(server):
    assert post(server, "simple/versions/1/generate", SIMPLE).json()["OUTPUT0"] == SUM
    reply = post(server, "simple/versions/1/generate_stream", SIMPLE)
    assert reply.status == 200 and reply.events()[0]["model_version"] == "1"


def test_parameters_pass_through_to_the_model_and_back(server):
    """Unknown keys and those under "parameters" reach the model as request parameters (the echo model
    returns them as its response's parameters, which become keys of the answer); "id" is one too."""
    body = post(server, "echo/generate", {"IN": [1.5, 2], "id": "7", "temperature": 0.5,
                                          "parameters": {"n": 3, "s": "x", "b": True}}).json()
    assert body == {"OUT": [1.5, 2.0], "b": True, "id": "7", "model_name": "echo", "model_version": "1",
                    "n": 3, "s": "x", "temperature": 0.5}


def test_generate_stream_one_event_then_end_for_a_model_answering_once(server):
    reply = post(server, "simple/generate_stream", SIMPLE)
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["transfer-encoding"] == "chunked"
    assert reply.body == b"data: " + orjson.dumps({"OUTPUT0": SUM, "OUTPUT1": DIFF, "model_name": "simple",
                                                   "model_version": "1"}) + b"\n\n"
    assert reply.chunks == [reply.body]  # the event in one write


def test_stream_then_generate_on_one_keep_alive_connection(server):
    conn = Connection(server.http_port)
    try:
        conn.send("simple/generate_stream", SIMPLE)
        conn.send("simple/generate", SIMPLE)  # pipelined behind the stream
        first, second = conn.read(), conn.read()
    finally:
        conn.close()
    assert first.events()[0]["OUTPUT1"] == DIFF and second.json()["OUTPUT1"] == DIFF


def test_stream_to_a_client_asking_for_close_is_close_delimited(server):
    reply = post(server, "simple/generate_stream", SIMPLE, headers="Connection: close\r\n")
    assert "transfer-encoding" not in reply.headers and reply.headers["connection"] == "close"
    assert reply.events()[0]["OUTPUT0"] == SUM


def test_a_models_error_before_any_response_is_json_with_its_status(server):
    """An error before the first response is a JSON error on both endpoints (INVALID_ARG from the model:
    400), the same with --workers 2, where the engine's refusals and the model's errors arrive alike."""
    for action in ("generate", "generate_stream"):
        reply = post(server, f"behave/{action}", {"MODE": 1})
        assert reply.status == 400 and reply.headers["content-type"] == "application/json"
        assert reply.json() == {"error": "mode one is refused"}
    assert post(server, "behave/generate_stream", {"MODE": 0}).events()[0]["OUT"] == [1.0, 0.0]


@pytest.mark.parametrize("action", ["generate", "generate_stream"])
@pytest.mark.parametrize("path, body, status, message", [
    ("simple", b'{"INPUT0":', 400, "malformed JSON in request body: unexpected end of data: line 1 column 11 "
                                   "(char 10)"),
    ("simple", b"[1]", 400, "attempt to get members for non-object"),
    ("simple", {"INPUT0": list(range(16))}, 400,
     "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but missing required "
     "input(s) ['INPUT1']. Please provide all required input(s)."),
    ("simple", {}, 400, "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but missing "
                        "required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."),
    ("simple", {"INPUT0": ["a"] * 16, "INPUT1": [1] * 16}, 400,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("simple", {"INPUT0": list(range(15)), "INPUT1": [1] * 16}, 400,
     "The schema can not convert input 'INPUT0' to tensor with proper shape"),
    ("simple", {**SIMPLE, "INPUT2": [1, 2]}, 400,  # a key naming no input is a parameter, and no list
     "parameter 'INPUT2' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ("simple_identity", {"INPUT0": 5}, 400,
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("no_such_model", SIMPLE, 404, "Request for unknown model: 'no_such_model' is not found"),
    ("simple/versions/7", SIMPLE, 404, "Request for unknown model: 'simple' version 7 is not found"),
])
def test_errors_before_inference_are_json_with_tritons_status_and_words(server, action, path, body, status,
                                                                         message):
    reply = post(server, f"{path}/{action}", body)
    assert reply.status == status and reply.headers["content-type"] == "application/json"
    assert reply.json() == {"error": message}


def test_a_key_naming_no_input_with_a_scalar_is_a_parameter_not_an_error(server):
    assert post(server, "simple/generate", {**SIMPLE, "INPUT2": 1}).json()["OUTPUT0"] == SUM


def test_generate_needs_post(server):
    reply = post(server, "simple/generate", b"", method="GET")
    assert reply.status == 405 and reply.json() == {"error": "generate needs POST"}


def test_generate_is_in_no_extension_list(server):
    """Triton's server metadata does not list `generate` (2.51: it serves the endpoints all the same)."""
    conn = Connection(server.http_port)
    try:
        conn.sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert "generate" not in conn.read().json()["extensions"]
    finally:
        conn.close()


def test_a_client_leaving_mid_stream_cancels_its_request(server):
    """`slow` holds a request in its batching window for a minute: a client that disconnects meanwhile has
    its request cancelled (it leaves the queue and is counted as cancelled), and the server serves on."""
    cancelled = "hubserve_inference_request_cancelled_total"
    before = server.metric(cancelled, "slow")
    conn = Connection(server.http_port)
    conn.send("slow/generate_stream", SIMPLE)
    assert _within(30, lambda: server.metric("nv_inference_pending_request_count", "slow") == 1)
    conn.close()
    assert _within(30, lambda: server.metric(cancelled, "slow") == before + 1)
    assert server.metric("nv_inference_pending_request_count", "slow") == 0
    assert post(server, "simple/generate_stream", SIMPLE).status == 200


def _within(seconds: float, condition) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_large_event_reaches_a_slow_reader_whole(server):
    """A 4 MiB event is more than the socket buffers hold before we read (the server's transport pauses and
    the route waits in drain()); it still arrives whole, in one chunk, and the connection serves on."""
    text = "x" * (4 << 20)
    conn = Connection(server.http_port)
    try:
        conn.send("simple_identity/generate_stream", {"INPUT0": text})
        conn.send("simple/generate", SIMPLE)
        first = conn.read()
        assert len(first.chunks) == 1 and first.events()[0]["OUTPUT0"] == text
        assert conn.read().json()["OUTPUT0"] == SUM
    finally:
        conn.close()
