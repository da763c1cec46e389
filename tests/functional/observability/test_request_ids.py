"""Request ids (engine/observability/request_ids.py): printable (ASCII in a header), at most 256 characters,
on every way an id enters — HTTP JSON `id`, X-Request-ID, the generate extension's `id`, gRPC `id` (ModelInfer
and ModelStreamInfer) and x-request-id metadata. Refused with 400 / INVALID_ARGUMENT in each protocol's form;
a valid id is echoed as before. The point is the log: a line break in an id forged a second access line
(`--log-verbose 1`, text format), and an unbounded id wrote itself into every line.
"""

from __future__ import annotations

import json
import queue
import shutil
import socket
import timeit

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, assert_simple_over_grpc, start_server, wait_until
from engine.errors import EngineError, ErrorCode
from engine.observability.request_ids import (
    MAX_REQUEST_ID_CHARS,
    check_header_request_id,
    check_request_id,
    request_id_problem,
)
from h2_client import RawClient, grpc_message, status_of
from hubserve_models import examples
from test_encoded_paths import INFER

FORGED = "ok\n2026-01-01 00:00:00,000 INFO hubserve.access: model=FORGED version=1 request_id=x status=OK"
LONGEST = "i" * MAX_REQUEST_ID_CHARS


# ---------------------------------------------------------------------------------------------- the rule

@pytest.mark.parametrize("request_id", ["", "a", "req-1", "00000000-0000-0000-0000-000000000000", "a b ~!",
                                        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", LONGEST,
                                        "req-\u00e9-42", "\u8acb\u6c42-7"])
def test_printable_ascii_ids_up_to_the_bound_pass(request_id: str) -> None:
    assert request_id_problem(request_id) is None and check_request_id(request_id) == request_id


@pytest.mark.parametrize("request_id, rule", [
    ("a\nb", "must be printable"), ("a\rb", "must be printable"), ("\x00", "must be printable"),
    ("tab\there", "must be printable"), ("\x1b[31m", "must be printable"), ("del\x7f", "must be printable"),
    ("line\u2028sep", "must be printable"), ("nel\x85", "must be printable"),
    ("bidi\u202eoverride", "must be printable"), (LONGEST + "i", "257 characters long; at most 256"),
])
def test_other_ids_are_invalid_arg_naming_the_rule(request_id: str, rule: str) -> None:
    with pytest.raises(EngineError) as e:
        check_request_id(request_id, "'id'")
    assert e.value.code is ErrorCode.INVALID_ARG
    assert e.value.message.startswith("'id' ") and rule in e.value.message


def test_a_header_id_is_printable_ascii() -> None:
    assert check_header_request_id(b"req-1", "header X-Request-ID") == "req-1"
    for value, rule in ((b"caf\xe9", "printable ASCII"), (b"a\tb", "must be printable"),
                        (b"y" * 257, "at most 256")):
        with pytest.raises(EngineError) as e:
            check_header_request_id(value, "header X-Request-ID")
        assert e.value.message.startswith("header X-Request-ID ") and rule in e.value.message


def test_checking_an_id_costs_next_to_nothing() -> None:
    """The hot path pays this per request: well under a microsecond (measured ~0.1 µs here)."""
    ids = ["", "req-12345", "00000000-0000-0000-0000-000000000000"]
    seconds = min(timeit.repeat(lambda: [check_request_id(i) for i in ids], number=20000, repeat=3))
    assert seconds / (20000 * len(ids)) < 2e-6


# ---------------------------------------------------------------------------------------------- the server

@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def logged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"ids_repo_{request.param}")
    for name in ("simple", "simple_identity"):
        (root / name).mkdir()
        shutil.copy(EXAMPLES / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, ["simple", "simple_identity"])
    srv = start_server(root, tmp_path_factory.mktemp("ids_log") / "server.log", "--workers", request.param,
                       "--log-verbose", "1", "--log-format", "text")
    yield srv
    srv.stop()


def raw_http(port: int, method: str, path: str, body: bytes, headers: bytes = b"") -> tuple[int, dict, bytes]:
    """One request with header bytes exactly as given (obs-text included), Connection: close."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n%s\r\n%s"
                  % (method.encode(), path.encode(), len(body), headers, body))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, payload


def infer_body(request_id: str) -> bytes:
    doc = json.loads(INFER)
    doc["id"] = request_id
    return json.dumps(doc).encode()


def grpc_inputs() -> list:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    return inputs


def test_bad_ids_are_refused_on_every_protocol_and_forge_no_line(logged) -> None:
    srv = logged
    port = srv.http_port
    path = "/v2/models/simple/infer"
    for request_id in (FORGED, LONGEST + "i", "line\u2028break"):
        status, _, body = raw_http(port, "POST", path, infer_body(request_id))
        assert status == 400 and "'id' " in json.loads(body)["error"], body
        status, _, body = raw_http(port, "POST", "/v2/models/simple_identity/generate",
                                   json.dumps({"id": request_id, "INPUT0": ["a"]}).encode())
        assert status == 400 and "'id' " in json.loads(body)["error"], body
        with grpcclient.InferenceServerClient(srv.grpc_url) as c, \
                pytest.raises(InferenceServerException) as e:
            c.infer("simple", grpc_inputs(), request_id=request_id)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "'id' " in e.value.message()
    for header in (b"X-Request-ID: " + b"y" * 300, b"X-Request-ID: caf\xe9", b"X-Request-ID: a\tb"):
        status, _, body = raw_http(port, "POST", path, INFER, header + b"\r\n")
        assert status == 400 and "header X-Request-ID" in json.loads(body)["error"], (header, body)
    with grpcclient.InferenceServerClient(srv.grpc_url) as c, pytest.raises(InferenceServerException) as e:
        c.infer("simple", grpc_inputs(), headers={"x-request-id": "z" * 300})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "x-request-id" in e.value.message()
    raw = RawClient(srv.grpc_port)  # bytes grpcio will not send: a line break in the metadata
    try:
        raw.handshake()
        raw.send(raw.headers(1, "/inference.GRPCInferenceService/ServerLive",
                             ((b"x-request-id", b"a\nFORGED"),)))  # type: ignore[arg-type]
        raw.send_data(1, grpc_message(b""))
        status, message = status_of(raw, 1)
        assert status == "3" and "x-request-id" in message
    finally:
        raw.close()
    assert_serves_with_ids(srv)
    text = srv.log()
    assert "FORGED" not in text and "y" * 300 not in text and "z" * 300 not in text


def test_a_stream_answers_a_bad_id_in_the_stream_and_goes_on(logged) -> None:
    srv = logged
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        c.async_stream_infer("simple", grpc_inputs(), request_id=FORGED)
        c.async_stream_infer("simple", grpc_inputs(), request_id="fine-1")
        first, second = answers.get(timeout=30), answers.get(timeout=30)
        c.stop_stream()
    assert first[0] is None and "'id' " in str(first[1])
    assert second[1] is None and second[0].get_response().id == "fine-1"
    assert "FORGED" not in srv.log()


def assert_serves_with_ids(srv) -> None:
    """The longest id passes and is echoed on both protocols, once each in the access log."""
    status, fields, body = raw_http(srv.http_port, "POST", "/v2/models/simple/infer", infer_body(LONGEST))
    assert status == 200 and json.loads(body)["id"] == LONGEST and fields[b"x-request-id"] == LONGEST.encode()
    grpc_id = "g" * MAX_REQUEST_ID_CHARS
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        assert c.infer("simple", grpc_inputs(), request_id=grpc_id).get_response().id == grpc_id
    wait_until(lambda: f"request_id={LONGEST} status=OK" in srv.log()
               and f"request_id={grpc_id} " in srv.log(), "the access lines of the two inferences")
    for line in srv.log().splitlines():
        assert " hubserve.access: " not in line or line.startswith("20"), line  # every access line is whole
    assert_simple_over_grpc(srv)
