"""Bad requests, crafted byte by byte: each gets the exact error status and a message that names the tensor
and the problem, and the server keeps serving correct answers afterwards.

HTTP requests are raw `http.client` calls, so the body can be any garbage; gRPC requests are tritonclient's
`service_pb2` messages sent through a bare stub, so the message can be inconsistent in ways the client library
would never produce. After every bad request a good `simple` request must still return the right sums, on the
same HTTP connection where there is one.
"""

from __future__ import annotations

import http.client
import json
import struct
import urllib.request
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

HEADER_LENGTH = "Inference-Header-Content-Length"
INFER = "/v2/models/simple/infer"
IDENTITY_BYTES = "/v2/models/identity_bytes/infer"

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


# ---------------------------------------------------------------------------- HTTP helpers

def json_input(name: str, shape: list[int], data: Any, datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_input(name: str, shape: list[int], size: int, datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


def good_json_body() -> dict[str, Any]:
    return {"inputs": [json_input("INPUT0", [1, 16], A.ravel().tolist()),
                       json_input("INPUT1", [1, 16], B.ravel().tolist())]}


def binary_header(size0: int = 64, size1: int = 64) -> dict[str, Any]:
    return {"inputs": [binary_input("INPUT0", [1, 16], size0), binary_input("INPUT1", [1, 16], size1)]}


def binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: the JSON header, then the raw bytes; and its header-length HTTP header."""
    head = json.dumps(header).encode()
    return head + b"".join(chunks), {HEADER_LENGTH: str(len(head))}


class HttpSession:
    """One keep-alive connection: a bad request and the good one after it travel on the same socket (when the
    server keeps it open), so a server that mis-frames a bad body would answer the good request wrongly."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.last_headers: http.client.HTTPMessage | None = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        payload = response.read()
        self.last_headers = response.msg
        return response.status, response.getheader("Content-Type") or "", payload

    def post(self, path: str, body: bytes | dict | list, headers: dict[str, str] | None = None
             ) -> tuple[int, str, bytes]:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        return self.request("POST", path, body, headers)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def session(server):
    s = HttpSession(server.http_port)
    yield s
    s.close()


def assert_http_error(answer: tuple[int, str, bytes], status: int, *fragments: str) -> str:
    """The answer is `status` with exactly `{"error": message}`, and the message contains every fragment."""
    got_status, content_type, payload = answer
    assert got_status == status, f"expected HTTP {status}, got {got_status}: {payload[:500]!r}"
    assert content_type.startswith("application/json"), f"error body is {content_type!r}: {payload[:500]!r}"
    doc = json.loads(payload)
    assert isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], str), doc
    message = doc["error"]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in error message {message!r}"
    return message


def assert_http_good_infer(session: HttpSession) -> None:
    status, _, payload = session.post(INFER, good_json_body())
    assert status == 200, payload[:500]
    outputs = {o["name"]: o for o in json.loads(payload)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == (A + B).ravel().tolist()
    assert outputs["OUTPUT1"]["data"] == (A - B).ravel().tolist()


def assert_still_serving(server, session: HttpSession) -> None:
    """A good request on the same HTTP connection and one over gRPC both return correct values."""
    assert server.process.poll() is None, f"server died:\n{server.log()}"
    assert_http_good_infer(session)
    assert_grpc_good_infer(server)


# ---------------------------------------------------------------------------- gRPC helpers

@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def raw_tensor(name: str, datatype: str, shape: list[int]) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


def good_grpc_request() -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="simple", inputs=[raw_tensor("INPUT0", "INT32", [1, 16]),
                                                             raw_tensor("INPUT1", "INT32", [1, 16])],
                                raw_input_contents=[A.tobytes(), B.tobytes()])


def grpc_outputs(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    assert len(response.raw_output_contents) == len(response.outputs)
    out = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        dtype = {"INT32": np.int32, "FP32": np.float32}[tensor.datatype]
        out[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
    return out


def assert_grpc_good_infer(server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(good_grpc_request(), timeout=30)
    outputs = grpc_outputs(response)
    np.testing.assert_array_equal(outputs["OUTPUT0"], A + B)
    np.testing.assert_array_equal(outputs["OUTPUT1"], A - B)


def assert_grpc_error(stub, request: pb.ModelInferRequest, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    error = info.value
    assert error.code() == code, f"expected {code}, got {error.code()}: {error.details()}"
    message = error.details()
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in error message {message!r}"
    return message


# ============================================================================ HTTP: routing

def test_http_unknown_model(server, session):
    assert_http_error(session.post("/v2/models/no_such_model/infer", good_json_body()), 404,
                      "Request for unknown model: 'no_such_model' is not found")
    assert_still_serving(server, session)


def test_http_unknown_version(server, session):
    assert_http_error(session.post("/v2/models/simple/versions/7/infer", good_json_body()), 404,
                      "Request for unknown model: 'simple' version 7 is not found")
    assert_still_serving(server, session)


def test_http_non_numeric_version(server, session):
    assert_http_error(session.post("/v2/models/simple/versions/latest/infer", good_json_body()), 400,
                      "version", "'latest'")
    assert_still_serving(server, session)


def test_http_unknown_path_is_404_json(server, session):
    message = assert_http_error(session.request("GET", "/v2/no/such/endpoint"), 404)
    assert message
    assert_still_serving(server, session)


# ============================================================================ HTTP: body framing

def test_http_malformed_json(server, session):
    assert_http_error(session.post(INFER, b'{"inputs": [{"name": "INPUT0",'), 400, "malformed JSON")
    assert_still_serving(server, session)


@pytest.mark.parametrize("path", [INFER, "/v2/repository/index"], ids=["infer", "repository-index"])
def test_http_deeply_nested_json(server, session, path):
    """Nesting past the parser's recursion limit is a client error naming the limit, not a server error."""
    assert_http_error(session.post(path, b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400,
                      "JSON nested deeper than 32 levels (--max-json-depth)")
    assert_still_serving(server, session)


def test_http_data_nested_at_the_parsers_limit(server, session):
    """'data' nested about as deep as a JSON parser accepts: a client error, whichever stage notices."""
    doc = good_json_body()
    doc["inputs"][0]["data"] = "NESTED"
    depth = 1020
    body = json.dumps(doc).replace('"NESTED"', "[" * depth + "0" + "]" * depth).encode()
    assert_http_error(session.post(INFER, body), 400)
    assert_still_serving(server, session)


def test_http_body_not_utf8(server, session):
    assert_http_error(session.post(INFER, b'{"inputs": "\xff\xfe"}'), 400, "malformed JSON")
    assert_still_serving(server, session)


@pytest.mark.parametrize("body", [b"[]", b'"inputs"', b"42", b"null"],
                         ids=["list", "string", "number", "null"])
def test_http_json_not_an_object(server, session, body):
    assert_http_error(session.post(INFER, body), 400, "JSON object")
    assert_still_serving(server, session)


@pytest.mark.parametrize("doc", [{}, {"inputs": []}, {"inputs": None}, {"inputs": {"name": "INPUT0"}}],
                         ids=["absent", "empty", "null", "object"])
def test_http_missing_inputs(server, session, doc):
    assert_http_error(session.post(INFER, doc), 400, "'inputs'")
    assert_still_serving(server, session)


def test_http_truncated_binary_body(server, session):
    body, headers = binary_body(binary_header(), A.tobytes(), B.tobytes()[:30])
    assert_http_error(session.post(INFER, body, headers), 400, "'INPUT1'", "64", "30")
    assert_still_serving(server, session)


def test_http_header_length_larger_than_body(server, session):
    body, _ = binary_body(binary_header(), A.tobytes(), B.tobytes())
    too_long = str(len(body) + 1)
    assert_http_error(session.post(INFER, body, {HEADER_LENGTH: too_long}), 400, HEADER_LENGTH, too_long,
                      str(len(body)))
    assert_still_serving(server, session)


def test_http_header_length_negative(server, session):
    body, _ = binary_body(binary_header(), A.tobytes(), B.tobytes())
    assert_http_error(session.post(INFER, body, {HEADER_LENGTH: "-5"}), 400, HEADER_LENGTH, "-5")
    assert_still_serving(server, session)


@pytest.mark.parametrize("value", ["abc", "12.5", "0x20", ""], ids=["word", "float", "hex", "empty"])
def test_http_header_length_not_a_number(server, session, value):
    body, _ = binary_body(binary_header(), A.tobytes(), B.tobytes())
    assert_http_error(session.post(INFER, body, {HEADER_LENGTH: value}), 400, HEADER_LENGTH)
    assert_still_serving(server, session)


def test_http_extra_trailing_binary_bytes(server, session):
    body, headers = binary_body(binary_header(), A.tobytes(), B.tobytes(), b"\x00" * 7)
    assert_http_error(session.post(INFER, body, headers), 400, "7 bytes of binary data")
    assert_still_serving(server, session)


# ============================================================================ HTTP: tensors

def test_http_wrong_datatype(server, session):
    doc = good_json_body()
    doc["inputs"][0] = json_input("INPUT0", [1, 16], [float(x) for x in range(16)], "FP32")
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "INT32", "FP32")
    assert_still_serving(server, session)


def test_http_unknown_datatype(server, session):
    doc = good_json_body()
    doc["inputs"][0]["datatype"] = "FLOAT32"
    assert_http_error(session.post(INFER, doc), 400, "'FLOAT32'")
    assert_still_serving(server, session)


def test_http_wrong_shape_rank(server, session):
    doc = good_json_body()
    doc["inputs"][0] = json_input("INPUT0", [16], list(range(16)))
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "[-1,16]", "[16]")
    assert_still_serving(server, session)


def test_http_wrong_dim(server, session):
    doc = good_json_body()
    doc["inputs"][0] = json_input("INPUT0", [1, 15], list(range(15)))
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "[1, 15]")
    assert_still_serving(server, session)


def test_http_batch_larger_than_max_batch_size(server, session):
    doc = {"inputs": [json_input("INPUT0", [9, 16], [0] * 144), json_input("INPUT1", [9, 16], [0] * 144)]}
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "batch size 9", "1..8")
    assert_still_serving(server, session)


def test_http_batch_sizes_disagree(server, session):
    doc = {"inputs": [json_input("INPUT0", [2, 16], [0] * 32), json_input("INPUT1", [1, 16], [0] * 16)]}
    assert_http_error(session.post(INFER, doc), 400, "'INPUT1'", "batch size 1")
    assert_still_serving(server, session)


def test_http_element_count_mismatch_json(server, session):
    doc = good_json_body()
    doc["inputs"][1]["data"] = [3] * 15
    assert_http_error(session.post(INFER, doc), 400, "'INPUT1'", "16 elements", "15")
    assert_still_serving(server, session)


def test_http_json_value_out_of_range(server, session):
    doc = good_json_body()
    doc["inputs"][1]["data"] = [2**31] + [3] * 15
    assert_http_error(session.post(INFER, doc), 400, "'INPUT1'", "out of range", "INT32")
    assert_still_serving(server, session)


def test_http_json_value_wrong_kind(server, session):
    doc = good_json_body()
    doc["inputs"][1]["data"] = ["3"] * 16
    assert_http_error(session.post(INFER, doc), 400, "'INPUT1'", "numbers")
    assert_still_serving(server, session)


def test_http_byte_size_mismatch_binary(server, session):
    body, headers = binary_body(binary_header(size0=60), A.tobytes()[:60], B.tobytes())
    assert_http_error(session.post(INFER, body, headers), 400, "'INPUT0'", "64 bytes", "60")
    assert_still_serving(server, session)


def test_http_negative_dims(server, session):
    doc = good_json_body()
    doc["inputs"][0]["shape"] = [1, -16]
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "negative")
    assert_still_serving(server, session)


def test_http_shape_not_integers(server, session):
    doc = good_json_body()
    doc["inputs"][0]["shape"] = [1, "16"]
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "shape")
    assert_still_serving(server, session)


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_http_absurd_dims(server, session, encoding):
    """[1, 2**40] is refused from the shape alone: nothing is allocated for it, and the server lives."""
    if encoding == "json":
        doc = good_json_body()
        doc["inputs"][0]["shape"] = [1, 2**40]
        answer = session.post(INFER, doc)
    else:
        header = binary_header()
        header["inputs"][0]["shape"] = [1, 2**40]
        body, headers = binary_body(header, A.tobytes(), B.tobytes())
        answer = session.post(INFER, body, headers)
    assert_http_error(answer, 400, "'INPUT0'", str(2**40))
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=10) as r:
        assert r.status == 200
    assert_still_serving(server, session)


def test_http_absurd_bytes_element_count(server, session):
    """A BYTES shape claiming 2**31 elements over 8 bytes of data is refused at once, without allocating."""
    body, headers = binary_body({"inputs": [binary_input("INPUT0", [1, 2**31], 8, "BYTES")]},
                                bytes_elements(b"abcd"))
    assert_http_error(session.post(IDENTITY_BYTES, body, headers), 400, "'INPUT0'",
                      "cannot hold 2147483648 elements")
    assert_still_serving(server, session)


def test_http_unknown_requested_output(server, session):
    doc = good_json_body()
    doc["outputs"] = [{"name": "OUTPUT0"}, {"name": "OUTPUT9"}]
    assert_http_error(session.post(INFER, doc), 400, "'OUTPUT9'", "'simple'")
    assert_still_serving(server, session)


def test_http_duplicated_input(server, session):
    doc = good_json_body()
    doc["inputs"].append(json_input("INPUT0", [1, 16], [0] * 16))
    assert_http_error(session.post(INFER, doc), 400, "'INPUT0'", "more than once")
    assert_still_serving(server, session)


def test_http_unexpected_input(server, session):
    doc = good_json_body()
    doc["inputs"].append(json_input("INPUT7", [1, 16], [0] * 16))
    assert_http_error(session.post(INFER, doc), 400, "'INPUT7'", "'simple'")
    assert_still_serving(server, session)


def test_http_missing_required_input(server, session):
    doc = good_json_body()
    del doc["inputs"][1]
    assert_http_error(session.post(INFER, doc), 400, "missing required input(s) ['INPUT1']")
    assert_still_serving(server, session)


def bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.mark.parametrize("raw, fragments", [
    (struct.pack("<I", 100) + b"abc" + bytes_elements(b"d", b"e", b"f"), ("element 0", "claims 100 bytes")),
    (bytes_elements(b"a", b"b", b"c") + struct.pack("<I", 2**32 - 1) + b"de",
     ("element 3", "claims 4294967295 bytes")),
    (bytes_elements(b"a", b"b", b"c") + b"\x02\x00", ("ends after 3 of 4 elements",)),
    (bytes_elements(b"a", b"b", b"c", b"d") + b"xyz", ("3 bytes left over",)),
    (bytes_elements(b"abcdefgh"), ("12 bytes", "cannot hold 4 elements")),
], ids=["overlong-first", "overlong-last", "truncated-prefix", "leftover", "too-few-bytes"])
def test_http_bytes_lying_length_prefixes(server, session, raw, fragments):
    body, headers = binary_body({"inputs": [binary_input("INPUT0", [1, 4], len(raw), "BYTES")]}, raw)
    assert_http_error(session.post(IDENTITY_BYTES, body, headers), 400, "'INPUT0'", *fragments)
    assert_still_serving(server, session)


def test_http_bytes_honest_length_prefixes_pass(server, session):
    """The positive twin of the cases above: the same framing, told truthfully, comes back unchanged."""
    items = (b"", b"a", b"with space", "\u00e9t\u00e9".encode())
    raw = bytes_elements(*items)
    body, headers = binary_body({"inputs": [binary_input("INPUT0", [1, 4], len(raw), "BYTES")],
                                 "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}, raw)
    status, _, payload = session.post(IDENTITY_BYTES, body, headers)
    assert status == 200, payload[:500]
    assert session.last_headers is not None
    assert payload[int(session.last_headers[HEADER_LENGTH]):] == raw
    assert_still_serving(server, session)


def test_http_fp32_nan_and_inf_pass_through(server, session):
    """perf_analyzer's random inputs contain NaN, Inf and denormals: valid tensors, returned bit for bit."""
    sent = special_fp32()
    body, headers = binary_body({"inputs": [binary_input("INPUT0", list(sent.shape), sent.nbytes, "FP32")],
                                 "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
                                sent.tobytes())
    status, _, payload = session.post("/v2/models/identity_fp32/infer", body, headers)
    assert status == 200, payload[:500]
    assert session.last_headers is not None
    head_end = int(session.last_headers[HEADER_LENGTH])
    doc = json.loads(payload[:head_end])
    [output] = doc["outputs"]
    assert output["datatype"] == "FP32" and output["shape"] == list(sent.shape)
    raw = payload[head_end:]
    assert output["parameters"]["binary_data_size"] == len(raw) == sent.nbytes
    np.testing.assert_array_equal(np.frombuffer(raw, np.uint32), sent.view(np.uint32).ravel())
    assert_still_serving(server, session)


def special_fp32() -> np.ndarray:
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,   # quiet NaNs, signalling NaN payloads
                     0x7F800000, 0xFF800000, 0x00000001, 0x80000001,   # +Inf, -Inf, smallest denormals
                     0x7F7FFFFF, 0xFF7FFFFF, 0x80000000, 0x00000000],  # ±max, -0.0, +0.0
                    dtype=np.uint32)
    return bits.view(np.float32).reshape(3, 4)


# ============================================================================ gRPC

def test_grpc_unknown_model(server, stub):
    request = good_grpc_request()
    request.model_name = "no_such_model"
    assert_grpc_error(stub, request, NOT_FOUND, "Request for unknown model: 'no_such_model' is not found")
    assert_grpc_good_infer(server)


def test_grpc_unknown_version(server, stub):
    request = good_grpc_request()
    request.model_version = "7"
    assert_grpc_error(stub, request, NOT_FOUND, "Request for unknown model: 'simple' version 7 is not found")
    assert_grpc_good_infer(server)


def test_grpc_non_numeric_version(server, stub):
    request = good_grpc_request()
    request.model_version = "latest"
    assert_grpc_error(stub, request, INVALID, "version", "'latest'")
    assert_grpc_good_infer(server)


def test_grpc_wrong_datatype(server, stub):
    request = good_grpc_request()
    request.inputs[1].datatype = "UINT32"
    assert_grpc_error(stub, request, INVALID, "'INPUT1'", "INT32", "UINT32")
    assert_grpc_good_infer(server)


def test_grpc_raw_contents_count_differs_from_inputs(server, stub):
    request = good_grpc_request()
    del request.raw_input_contents[1]
    assert_grpc_error(stub, request, INVALID, "2 inputs", "1 raw_input_contents")
    assert_grpc_good_infer(server)


def test_grpc_raw_contents_wrong_size(server, stub):
    request = good_grpc_request()
    request.raw_input_contents[0] = A.tobytes()[:60]
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", "64 bytes", "60")
    assert_grpc_good_infer(server)


def test_grpc_typed_contents_count_mismatch(server, stub):
    request = pb.ModelInferRequest(model_name="simple", inputs=[raw_tensor("INPUT0", "INT32", [1, 16]),
                                                                raw_tensor("INPUT1", "INT32", [1, 16])])
    request.inputs[0].contents.int_contents.extend(A.ravel().tolist())
    request.inputs[1].contents.int_contents.extend(B.ravel().tolist()[:15])
    assert_grpc_error(stub, request, INVALID, "'INPUT1'", "16 elements", "15")
    assert_grpc_good_infer(server)


def test_grpc_typed_contents_are_accepted(server, stub):
    """The positive twin of the case above: the same request with 16 values each is answered correctly."""
    request = pb.ModelInferRequest(model_name="simple", inputs=[raw_tensor("INPUT0", "INT32", [1, 16]),
                                                                raw_tensor("INPUT1", "INT32", [1, 16])])
    request.inputs[0].contents.int_contents.extend(A.ravel().tolist())
    request.inputs[1].contents.int_contents.extend(B.ravel().tolist())
    outputs = grpc_outputs(stub.ModelInfer(request, timeout=30))
    np.testing.assert_array_equal(outputs["OUTPUT0"], A + B)


def test_grpc_fp16_in_typed_contents(server, stub):
    request = pb.ModelInferRequest(model_name="identity_fp16", inputs=[raw_tensor("INPUT0", "FP16", [1, 4])])
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", "FP16", "raw_input_contents")
    assert_grpc_good_infer(server)


def test_grpc_negative_dims(server, stub):
    request = good_grpc_request()
    request.inputs[0].shape[1] = -16
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", "negative")
    assert_grpc_good_infer(server)


def test_grpc_absurd_dims(server, stub):
    request = good_grpc_request()
    request.inputs[0].shape[1] = 2**40
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", str(2**40))
    assert server.process.poll() is None
    assert_grpc_good_infer(server)


def test_grpc_absurd_bytes_element_count(server, stub):
    request = pb.ModelInferRequest(model_name="identity_bytes",
                                   inputs=[raw_tensor("INPUT0", "BYTES", [1, 2**31])],
                                   raw_input_contents=[bytes_elements(b"abcd")])
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", "cannot hold 2147483648 elements")
    assert_grpc_good_infer(server)


def test_grpc_bytes_lying_length_prefix(server, stub):
    lying = bytes_elements(b"a", b"b", b"c") + struct.pack("<I", 50) + b"xy"
    request = pb.ModelInferRequest(model_name="identity_bytes",
                                   inputs=[raw_tensor("INPUT0", "BYTES", [1, 4])], raw_input_contents=[lying])
    assert_grpc_error(stub, request, INVALID, "'INPUT0'", "element 3", "claims 50 bytes")
    assert_grpc_good_infer(server)


def test_grpc_unknown_requested_output(server, stub):
    request = good_grpc_request()
    request.outputs.add(name="OUTPUT9")
    assert_grpc_error(stub, request, INVALID, "'OUTPUT9'", "'simple'")
    assert_grpc_good_infer(server)


def test_grpc_duplicated_input(server, stub):
    request = good_grpc_request()
    request.inputs.append(raw_tensor("INPUT1", "INT32", [1, 16]))
    request.raw_input_contents.append(B.tobytes())
    assert_grpc_error(stub, request, INVALID, "'INPUT1'", "more than once")
    assert_grpc_good_infer(server)


def test_grpc_missing_required_input(server, stub):
    request = good_grpc_request()
    del request.inputs[0]
    del request.raw_input_contents[0]
    assert_grpc_error(stub, request, INVALID, "missing required input(s) ['INPUT0']")
    assert_grpc_good_infer(server)


def test_grpc_fp32_nan_and_inf_pass_through(server, stub):
    sent = special_fp32()
    request = pb.ModelInferRequest(model_name="identity_fp32", inputs=[raw_tensor("INPUT0", "FP32", [3, 4])],
                                   raw_input_contents=[sent.tobytes()])
    response = stub.ModelInfer(request, timeout=30)
    [output] = response.outputs
    assert output.name == "OUTPUT0" and output.datatype == "FP32" and list(output.shape) == [3, 4]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.uint32),
                                  sent.view(np.uint32).ravel())
    assert_grpc_good_infer(server)
