"""Tests of the codecs between the wire and engine types, as pure functions (no server):

* engine/types.py               — datatype names: KServe v2 ↔ numpy ↔ model config;
* engine/frontend/wire.py       — shapes from the wire, raw tensor bytes, BYTES length prefixes;
* engine/frontend/http/codec.py — the JSON body and the binary tensor data extension;
* engine/frontend/grpc/codec.py — ModelInferRequest / ModelInferResponse.

Every rejected input must be `INVALID_ARG` with a message that names the tensor and says what is wrong."""

from __future__ import annotations

import contextlib
import json
import math
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from engine.errors import EngineError, ErrorCode
from engine.frontend import wire
from engine.frontend.grpc import codec as grpc_codec
from engine.frontend.http import codec as http_codec
from engine.proto import grpc_service_pb2 as gpb
from engine.proto import model_config_pb2 as cpb
from engine.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor, element_count

FIXED = [dt for dt in DataType if dt is not DataType.BYTES]


@contextlib.contextmanager
def rejected(*fragments: str) -> Iterator[None]:
    """The block must raise EngineError(INVALID_ARG) whose message contains every fragment."""
    with pytest.raises(EngineError) as info:
        yield
    assert info.value.code is ErrorCode.INVALID_ARG, info.value
    for fragment in fragments:
        assert fragment in info.value.message, f"{fragment!r} not in {info.value.message!r}"


def length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def sample(datatype: DataType, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    n = element_count(shape)
    if datatype is DataType.BOOL:
        return (np.arange(n) % 2 == 0).reshape(shape)
    if datatype is DataType.BYTES:
        out = np.empty(n, dtype=object)
        out[:] = [f"s{i}".encode() for i in range(n)]
        return out.reshape(shape)
    return np.arange(n).astype(datatype.numpy_dtype).reshape(shape)


# --------------------------------------------------------------------------------------------------- types.py

@pytest.mark.parametrize("dt", list(DataType), ids=lambda d: d.value)
def test_datatype_names_round_trip(dt: DataType) -> None:
    assert DataType.from_v2(dt.value) is dt
    assert DataType.from_config(dt.config_name) is dt
    cpb.DataType.Value(dt.config_name)  # the config spelling exists in model_config.proto
    assert cpb.DataType.Name(cpb.DataType.Value(dt.config_name)) == dt.config_name


@pytest.mark.parametrize("dt", [d for d in DataType if d is not DataType.BF16], ids=lambda d: d.value)
def test_datatype_numpy_round_trip(dt: DataType) -> None:
    assert DataType.from_numpy(dt.numpy_dtype) is dt
    assert dt.itemsize == (0 if dt is DataType.BYTES else dt.numpy_dtype.itemsize)


def test_bf16_travels_as_uint16_bits() -> None:
    assert DataType.BF16.numpy_dtype == np.dtype(np.uint16)
    assert DataType.BF16.itemsize == 2
    assert DataType.from_numpy(np.dtype(np.uint16)) is DataType.UINT16  # numpy has no bfloat16


def test_config_names_of_special_types() -> None:
    assert DataType.BYTES.config_name == "TYPE_STRING"
    assert DataType.FP32.config_name == "TYPE_FP32"
    assert DataType.BOOL.config_name == "TYPE_BOOL"


@pytest.mark.parametrize("dtype", [np.dtype("S4"), np.dtype("U3"), np.dtype(object)])
def test_string_numpy_dtypes_are_bytes(dtype: np.dtype) -> None:
    assert DataType.from_numpy(dtype) is DataType.BYTES


@pytest.mark.parametrize("name", ["FP8", "fp32", "STRING", "TYPE_FP32", ""])
def test_unknown_v2_datatype(name: str) -> None:
    with rejected(f"unknown datatype '{name}'", "FP32", "BYTES"):
        DataType.from_v2(name)


def test_unknown_config_datatype_and_numpy_dtype() -> None:
    with rejected("TYPE_FP8"):
        DataType.from_config("TYPE_FP8")
    with rejected("complex64"):
        DataType.from_numpy(np.dtype(np.complex64))


def test_element_count_and_batch_size() -> None:
    assert element_count(()) == 1
    assert element_count([2, 3, 4]) == 24
    assert element_count([5, 0, 7]) == 0
    request = InferenceRequest("m", "", [Tensor("IN", DataType.FP32, (3, 2), np.zeros((3, 2), np.float32))])
    assert request.batch_size == 3


# -------------------------------------------------------------------------------------------- wire.py: shapes

@pytest.mark.parametrize("shape, dims", [
    ([], ()), ([3], (3,)), ((2, 0, 5), (2, 0, 5)), ([1, 2**31], (1, 2**31)),
])
def test_check_shape_accepts_non_negative_ints(shape: Any, dims: tuple[int, ...]) -> None:
    assert wire.check_shape("IN", shape) == dims


@pytest.mark.parametrize("shape, problem", [
    ([2, -1], "negative dimension"),
    ([True, 2], "list of integers"),
    ([2, 1.0], "list of integers"),
    ([2, "3"], "list of integers"),
    ([None], "list of integers"),
    ("2,3", "list of integers"),
    (None, "list of integers"),
    (4, "list of integers"),
])
def test_check_shape_rejects(shape: Any, problem: str) -> None:
    with rejected("input 'IN'", problem):
        wire.check_shape("IN", shape)


@pytest.mark.parametrize("shape", [[1, 2**40], [2**20, 2**20, 2**20], [2**31 + 1]])
def test_check_shape_rejects_huge_shapes_without_allocating(shape: list[int]) -> None:
    tracemalloc.start()
    try:
        with rejected("input 'IN'", "more than"):
            wire.check_shape("IN", shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_check_datatype_names_the_input() -> None:
    assert wire.check_datatype("IN", "FP16") is DataType.FP16
    with rejected("input 'IN'", "unknown datatype 'float32'", "FP32"):
        wire.check_datatype("IN", "float32")


# --------------------------------------------------------------------------------------------- wire.py: bytes

@pytest.mark.parametrize("dt", FIXED, ids=lambda d: d.value)
def test_fixed_size_round_trip(dt: DataType) -> None:
    arr = sample(dt)
    raw = bytes(wire.array_to_bytes(arr, dt))
    assert len(raw) == arr.size * dt.itemsize
    back = wire.array_from_bytes("IN", dt, arr.shape, raw)
    assert back.dtype == dt.numpy_dtype
    assert back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_array_from_bytes_is_little_endian() -> None:
    arr = wire.array_from_bytes("IN", DataType.INT32, (2,), b"\x01\x00\x00\x00\x00\x01\x00\x00")
    assert arr.tolist() == [1, 256]


def test_array_from_bytes_size_mismatch() -> None:
    with rejected("input 'IN'", "[2, 2]", "FP32", "needs 16 bytes", "got 12"):
        wire.array_from_bytes("IN", DataType.FP32, (2, 2), b"\0" * 12)
    with rejected("input 'IN'", "needs 0 bytes", "got 1"):
        wire.array_from_bytes("IN", DataType.INT8, (0,), b"\0")


def test_array_from_bytes_huge_shape_fails_without_allocating() -> None:
    tracemalloc.start()
    try:
        with rejected("input 'IN'", "needs 4294967296 bytes", "got 4"):
            wire.array_from_bytes("IN", DataType.FP32, (2**30,), b"\0" * 4)
        with rejected("input 'IN'", "cannot hold 1073741824 elements"):
            wire.array_from_bytes("IN", DataType.BYTES, (2**30,), b"\0" * 8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_bytes_elements_parse_with_empty_and_non_utf8_items() -> None:
    items = [b"hello", b"", b"\xff\xfe\x00bin", "héllo".encode()]
    arr = wire.array_from_bytes("IN", DataType.BYTES, (2, 2), length_prefixed(*items))
    assert arr.dtype == np.dtype(object)
    assert arr.shape == (2, 2)
    assert arr.reshape(-1).tolist() == items
    assert all(type(x) is bytes for x in arr.reshape(-1))


def test_bytes_zero_elements() -> None:
    assert wire.array_from_bytes("IN", DataType.BYTES, (0, 3), b"").shape == (0, 3)


def test_bytes_lying_length_prefix() -> None:
    data = struct.pack("<I", 100) + b"abc"
    with rejected("input 'IN'", "element 0 claims 100 bytes", "only 3 remain"):
        wire.array_from_bytes("IN", DataType.BYTES, (1,), data)


def test_bytes_prefix_near_uint32_max() -> None:
    data = length_prefixed(b"ok") + struct.pack("<I", 0xFFFFFFFF) + b"x"
    with rejected("input 'IN'", "element 1 claims 4294967295 bytes"):
        wire.array_from_bytes("IN", DataType.BYTES, (2,), data)


def test_bytes_truncated_before_a_length_prefix() -> None:
    data = length_prefixed(b"hello") + b"\x01\x00"  # element 1 has only half its prefix
    with rejected("input 'IN'", "ends after 1 of 2 elements"):
        wire.array_from_bytes("IN", DataType.BYTES, (2,), data)


def test_bytes_too_short_for_the_element_count() -> None:
    with rejected("input 'IN'", "7 bytes", "cannot hold 2 elements"):
        wire.array_from_bytes("IN", DataType.BYTES, (2,), b"\0" * 7)


def test_bytes_leftover_after_the_last_element() -> None:
    with rejected("input 'IN'", "3 bytes left over", "after 1 BYTES elements"):
        wire.array_from_bytes("IN", DataType.BYTES, (1,), length_prefixed(b"ab") + b"xyz")


def test_bytes_to_wire_encodes_strings_as_utf8() -> None:
    arr = np.array([b"raw", "hé", ""], dtype=object)
    assert wire.array_to_bytes(arr, DataType.BYTES) == length_prefixed(b"raw", "hé".encode(), b"")
    fixed = np.array([b"ab", b"c"], dtype="S2")  # numpy's own bytes dtype
    assert wire.array_to_bytes(fixed, DataType.BYTES) == length_prefixed(b"ab", b"c")


def test_array_to_bytes_of_non_contiguous_arrays() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base[:, ::2], base.T, base[::-1], base[1:3, 2:5]):
        assert not view.flags.c_contiguous
        assert bytes(wire.array_to_bytes(view, DataType.FP32)) == np.ascontiguousarray(view).tobytes()
        raw = wire.array_to_bytes(view, DataType.FP32)
        np.testing.assert_array_equal(wire.array_from_bytes("OUT", DataType.FP32, view.shape, raw), view)


def test_array_to_bytes_of_a_contiguous_array_is_a_view() -> None:
    arr = np.arange(4, dtype=np.int32)
    raw = wire.array_to_bytes(arr, DataType.INT32)
    arr[0] = 7
    assert bytes(raw)[:4] == struct.pack("<i", 7)


def test_array_to_bytes_converts_to_the_declared_datatype() -> None:
    arr = np.array([1, 2], dtype=np.int64)
    assert bytes(wire.array_to_bytes(arr, DataType.INT32)) == struct.pack("<2i", 1, 2)


@pytest.mark.parametrize("dt", list(DataType), ids=lambda d: d.value)
@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
def test_array_to_bytes_of_empty_tensors(dt: DataType, shape: tuple[int, ...]) -> None:
    arr = sample(dt, shape)
    assert bytes(wire.array_to_bytes(arr, dt)) == b""
    assert wire.array_from_bytes("OUT", dt, shape, b"").shape == shape


def test_array_to_bytes_of_a_scalar() -> None:
    scalar = np.array(1.5, dtype=np.float64)
    assert bytes(wire.array_to_bytes(scalar, DataType.FP64)) == struct.pack("<d", 1.5)


# ----------------------------------------------------------------------------------------- http_codec: decode

def http_body(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, str | None]:
    header = json.dumps(doc).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), str(len(header))


def decode_http(doc: dict[str, Any], *chunks: bytes) -> InferenceRequest:
    body, header_length = http_body(doc, *chunks)
    return http_codec.decode_request("m", "1", body, header_length)


def json_input(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize("data", [
    [1, 2, 3, 4, 5, 6], [[1, 2, 3], [4, 5, 6]], [[[1], [2], [3]], [[4], [5], [6]]],
])
def test_http_json_data_flat_and_nested(data: list[Any]) -> None:
    request = decode_http({"id": "r1", "inputs": [json_input("IN", "INT32", [2, 3], data)]})
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", DataType.INT32, (2, 3))
    assert tensor.data.dtype == np.int32
    assert tensor.data.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "r1")
    assert request.outputs is None


@pytest.mark.parametrize("datatype, data, expected", [
    ("BOOL", [True, False], [True, False]),
    ("UINT8", [0, 255], [0, 255]),
    ("INT8", [-128, 127], [-128, 127]),
    ("INT64", [-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1]),
    ("UINT64", [0, 2**64 - 1], [0, 2**64 - 1]),
    ("INT32", [2.0, -3.0], [2, -3]),  # integral floats are fine
    ("FP16", [0.5, -2], [0.5, -2.0]),
    ("FP32", [1.5, 2], [1.5, 2.0]),
    ("FP64", [1e300, -0.25], [1e300, -0.25]),
    ("BYTES", ["abc", ""], [b"abc", b""]),
])
def test_http_json_data_of_each_type(datatype: str, data: list[Any], expected: list[Any]) -> None:
    (tensor,) = decode_http({"inputs": [json_input("IN", datatype, [2], data)]}).inputs
    assert tensor.data.dtype == DataType(datatype).numpy_dtype
    assert tensor.data.tolist() == expected


def test_http_json_bf16_keeps_the_high_bits() -> None:
    (tensor,) = decode_http({"inputs": [json_input("IN", "BF16", [2], [1.0, -2.0])]}).inputs
    assert tensor.data.dtype == np.uint16
    assert tensor.data.tolist() == [0x3F80, 0xC000]


def test_http_binary_input() -> None:
    values = np.array([[1.5, -2.0], [3.25, 4.0]], dtype=np.float32)
    request = decode_http({"inputs": [binary_input("IN", "FP32", [2, 2], 16)]}, values.tobytes())
    (tensor,) = request.inputs
    assert tensor.data.dtype == np.float32
    np.testing.assert_array_equal(tensor.data, values)


def test_http_mixed_json_and_binary_inputs_claim_bytes_in_order() -> None:
    a = np.arange(3, dtype=np.int64)
    c = length_prefixed(b"x", b"", b"\xff")
    request = decode_http({
        "inputs": [
            binary_input("A", "INT64", [3], 24),
            json_input("B", "FP32", [1], [7.0]),
            binary_input("C", "BYTES", [3], len(c)),
        ],
        "outputs": [{"name": "O1", "parameters": {"binary_data": True}}, {"name": "O2"}],
        "parameters": {"binary_data_output": True, "priority": 2},
    }, a.tobytes(), c)
    assert [t.name for t in request.inputs] == ["A", "B", "C"]
    assert request.inputs[0].data.tolist() == [0, 1, 2]
    assert request.inputs[1].data.tolist() == [7.0]
    assert request.inputs[2].data.tolist() == [b"x", b"", b"\xff"]
    assert request.outputs is not None
    assert [(o.name, o.binary_data) for o in request.outputs] == [("O1", True), ("O2", None)]
    assert request.parameters == {"binary_data_output": True, "priority": 2}


def test_http_binary_nan_and_inf_pass_through() -> None:
    values = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32)
    (tensor,) = decode_http({"inputs": [binary_input("IN", "FP32", [4], 16)]}, values.tobytes()).inputs
    assert math.isnan(tensor.data[0])
    assert tensor.data[1] == np.inf and tensor.data[2] == -np.inf
    assert tensor.data.tobytes() == values.tobytes()


@pytest.mark.parametrize("header_length", ["10000", "-1", "abc", "", "1.5"])
def test_http_bad_header_length(header_length: str) -> None:
    body, _ = http_body({"inputs": [json_input("IN", "INT32", [1], [1])]})
    with rejected(http_codec.HEADER_LENGTH, header_length):
        http_codec.decode_request("m", "1", body, header_length)


def test_http_header_length_equal_to_body_means_no_binary() -> None:
    body, _ = http_body({"inputs": [json_input("IN", "INT32", [1], [1])]})
    (tensor,) = http_codec.decode_request("m", "1", body, str(len(body))).inputs
    assert tensor.data.tolist() == [1]


def test_http_leftover_binary_bytes() -> None:
    with rejected("3 bytes of binary data that no input claims"):
        decode_http({"inputs": [binary_input("IN", "INT32", [1], 4)]}, b"\x01\0\0\0", b"xyz")


def test_http_binary_data_size_larger_than_what_remains() -> None:
    with rejected("input 'B'", "binary_data_size is 8", "only 4"):
        decode_http({"inputs": [binary_input("A", "INT32", [1], 4), binary_input("B", "INT32", [2], 8)]},
                    b"\0" * 8)


def test_http_binary_data_size_without_a_binary_part() -> None:
    with rejected("input 'IN'", "binary_data_size is 4", "only 0"):
        body = json.dumps({"inputs": [binary_input("IN", "INT32", [1], 4)]}).encode()
        http_codec.decode_request("m", "1", body, None)


@pytest.mark.parametrize("size", [-4, True, "4", 4.0])
def test_http_binary_data_size_must_be_a_non_negative_int(size: Any) -> None:
    item = {"name": "IN", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": size}}
    doc = {"inputs": [item]}
    with rejected("input 'IN'", "binary_data_size must be a non-negative integer"):
        decode_http(doc, b"\0" * 4)


def test_http_binary_size_disagrees_with_shape() -> None:
    with rejected("input 'IN'", "needs 8 bytes", "got 12"):
        decode_http({"inputs": [binary_input("IN", "INT32", [2], 12)]}, b"\0" * 12)


@pytest.mark.parametrize("body", [b"{not json", b'{"inputs": [', b"\xff\xfe"])
def test_http_malformed_json(body: bytes) -> None:
    with rejected("malformed JSON"):
        http_codec.decode_request("m", "1", body, None)


def test_http_json_past_the_parsers_depth() -> None:
    with rejected("JSON nested deeper than 32 levels (--max-json-depth)"):
        http_codec.decode_request("m", "1", b"[" * 100_000, None)


@pytest.mark.parametrize("doc", [{}, {"inputs": []}, {"inputs": "IN"}, {"id": "x"}])
def test_http_missing_inputs(doc: dict[str, Any]) -> None:
    with rejected("non-empty 'inputs' list"):
        decode_http(doc)


def test_http_body_must_be_an_object() -> None:
    with rejected("JSON object"):
        http_codec.decode_request("m", "1", b"[1, 2]", None)


@pytest.mark.parametrize("item, fragments", [
    ("IN", ("JSON object",)),
    ({"datatype": "INT32", "shape": [1], "data": [1]}, ("no 'name'",)),
    ({"name": "IN", "shape": [1], "data": [1]}, ("input 'IN'", "no 'datatype'")),
    ({"name": "IN", "datatype": "INT32", "data": [1]}, ("input 'IN'", "shape")),
    ({"name": "IN", "datatype": "INT32", "shape": [-1], "data": [1]}, ("input 'IN'", "negative")),
    ({"name": "IN", "datatype": "INT32", "shape": [1]}, ("input 'IN'", "neither 'data' nor")),
    ({"name": "IN", "datatype": "INT32", "shape": [1], "data": [1], "parameters": "x"},
     ("input 'IN'", "parameters")),
    ({"name": "IN", "datatype": "FP8", "shape": [1], "data": [1]}, ("input 'IN'", "unknown datatype 'FP8'")),
])
def test_http_malformed_input(item: Any, fragments: tuple[str, ...]) -> None:
    with rejected(*fragments):
        decode_http({"inputs": [item]})


@pytest.mark.parametrize("shape, data, count, got", [
    ([2, 2], [1, 2, 3], 4, 3),
    ([2, 2], [[1, 2], [3, 4], [5, 6]], 4, 6),
    ([3], [], 3, 0),
    ([0], [1], 0, 1),
])
def test_http_wrong_element_count(shape: list[int], data: Any, count: int, got: int) -> None:
    with rejected("input 'IN'", f"needs {count} elements", f"'data' has {got}"):
        decode_http({"inputs": [json_input("IN", "INT32", shape, data)]})


@pytest.mark.parametrize("datatype, data, problem", [
    ("BOOL", [1, 0], "BOOL data must be true/false"),
    ("BOOL", ["true", False], "BOOL data must be true/false"),
    ("INT8", [128], "out of range for INT8"),
    ("INT8", [-129], "out of range for INT8"),
    ("UINT8", [-1], "out of range for UINT8"),
    ("UINT16", [65536], "out of range for UINT16"),
    ("INT32", [2**31], "out of range for INT32"),
    ("UINT32", [-1], "out of range for UINT32"),
    ("INT64", [2**63], "out of range for INT64"),
    ("INT64", [float(2**63)], "out of range for INT64"),
    ("UINT64", [2**64], "out of range for UINT64"),
    ("INT32", [1.5], "INT32 data must be integers"),
    ("INT32", [float("nan")], "INT32 data must be integers"),
    ("INT32", [True], "INT32 data must be numbers"),
    ("FP32", ["1.0"], "FP32 data must be numbers"),
    ("FP32", [None], "FP32 data must be numbers"),
    ("FP32", [{"v": 1}], "FP32 data must be numbers"),
    ("FP32", [1, [2]], "FP32 data must be numbers"),
    ("BYTES", [1], "BYTES data must be strings"),
    ("FP32", [10**400], "data does not fit FP32"),
    ("INT64", [2**62 + 1, 1.0, 10**30], "out of range for INT64"),
])
def test_http_json_values_that_do_not_fit(datatype: str, data: list[Any], problem: str) -> None:
    with rejected("input 'IN'", problem):
        decode_http({"inputs": [json_input("IN", datatype, [len(data)], data)]})


@pytest.mark.parametrize("doc, fragments", [
    ({"outputs": {"name": "O"}}, ("'outputs' must be a list",)),
    ({"outputs": [{"nam": "O"}]}, ("requested output", "'name'")),
    ({"outputs": [{"name": "O", "parameters": {"binary_data": 1}}]},
     ("output 'O'", "binary_data must be true or false")),
    ({"outputs": [{"name": "O", "parameters": "x"}]}, ("output 'O'", "parameters")),
    ({"parameters": [1]}, ("'parameters' must be a JSON object",)),
    ({"id": 7}, ("'id' must be a string",)),
])
def test_http_malformed_request_fields(doc: dict[str, Any], fragments: tuple[str, ...]) -> None:
    with rejected(*fragments):
        decode_http({"inputs": [json_input("IN", "INT32", [1], [1])], **doc})


# ----------------------------------------------------------------------------------------- http_codec: encode

def response(*outputs: Tensor, id: str = "") -> InferenceResponse:
    return InferenceResponse("m", "1", list(outputs), id=id)


def request(outputs: list[RequestedOutput] | None = None, **parameters: Any) -> InferenceRequest:
    return InferenceRequest("m", "1", [], outputs=outputs, parameters=dict(parameters))


def split_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return json.loads(body), b""
    return json.loads(body[:header_length]), body[header_length:]


FP = Tensor("FP", DataType.FP32, (2, 2), np.array([[1.5, 2.0], [3.0, -4.0]], dtype=np.float32))
STR = Tensor("STR", DataType.BYTES, (2,), np.array([b"hi", "h\xe9".encode()], dtype=object))
INT = Tensor("INT", DataType.INT64, (3,), np.array([1, -2, 2**40], dtype=np.int64))


def test_http_encode_json_by_default() -> None:
    body, header_length = http_codec.encode_response(response(FP, STR, INT), request())
    assert header_length is None
    doc = json.loads(body)
    assert doc == {
        "model_name": "m", "model_version": "1",
        "outputs": [
            {"name": "FP", "datatype": "FP32", "shape": [2, 2], "data": [1.5, 2.0, 3.0, -4.0]},
            {"name": "STR", "datatype": "BYTES", "shape": [2], "data": ["hi", "h\xe9"]},
            {"name": "INT", "datatype": "INT64", "shape": [3], "data": [1, -2, 2**40]},
        ],
    }


def test_http_encode_binary_data_output_default() -> None:
    body, header_length = http_codec.encode_response(response(FP, STR, INT), request(binary_data_output=True))
    assert header_length is not None
    doc, binary = split_response(body, header_length)
    assert all("data" not in o for o in doc["outputs"])
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [16, 4 + 2 + 4 + 3, 24]  # "h\xe9" is 3 bytes of UTF-8
    assert len(binary) == sum(sizes)
    assert binary[:16] == FP.data.tobytes()
    assert binary[16:29] == length_prefixed(b"hi", "h\xe9".encode())
    assert binary[29:] == INT.data.tobytes()


def test_http_encode_per_output_choice_overrides_the_default() -> None:
    wanted = [RequestedOutput("FP", binary_data=False), RequestedOutput("STR", binary_data=True),
              RequestedOutput("INT")]
    body, header_length = http_codec.encode_response(response(FP, STR, INT),
                                                     request(wanted, binary_data_output=True))
    doc, binary = split_response(body, header_length)
    fp, s, i = doc["outputs"]
    assert fp["data"] == [1.5, 2.0, 3.0, -4.0] and "parameters" not in fp
    assert s["parameters"] == {"binary_data_size": 13} and "data" not in s
    assert i["parameters"] == {"binary_data_size": 24}  # None follows binary_data_output
    assert binary == length_prefixed(b"hi", "h\xe9".encode()) + INT.data.tobytes()


def test_http_encode_one_binary_output_without_default() -> None:
    body, header_length = http_codec.encode_response(response(FP, INT),
                                                     request([RequestedOutput("INT", binary_data=True)]))
    assert header_length is not None
    doc, binary = split_response(body, header_length)
    assert doc["outputs"][0]["data"] == [1.5, 2.0, 3.0, -4.0]
    assert doc["outputs"][1]["parameters"]["binary_data_size"] == 24
    assert binary == INT.data.tobytes()
    assert body[header_length - 1:header_length] == b"}"  # the header ends exactly where JSON ends


def test_http_encode_echoes_id_only_when_set() -> None:
    with_id, _ = http_codec.encode_response(response(FP, id="req-7"), request())
    assert json.loads(with_id)["id"] == "req-7"
    without, _ = http_codec.encode_response(response(FP), request())
    assert "id" not in json.loads(without)


def test_http_encode_non_utf8_bytes_in_json_and_binary() -> None:
    raw = Tensor("RAW", DataType.BYTES, (1,), np.array([b"\xff\x00a"], dtype=object))
    body, _ = http_codec.encode_response(response(raw), request())
    assert json.loads(body)["outputs"][0]["data"] == ["\ufffd\x00a"]
    body, header_length = http_codec.encode_response(response(raw), request(binary_data_output=True))
    assert split_response(body, header_length)[1] == length_prefixed(b"\xff\x00a")  # binary keeps every byte


def test_http_encode_bf16_as_json_floats() -> None:
    bf16 = Tensor("B", DataType.BF16, (2,), np.array([0x3F80, 0xC000], dtype=np.uint16))
    body, _ = http_codec.encode_response(response(bf16), request())
    assert json.loads(body)["outputs"][0]["data"] == [1.0, -2.0]


def test_http_encode_non_contiguous_and_empty_outputs() -> None:
    strided = Tensor("S", DataType.INT32, (2, 2), np.arange(8, dtype=np.int32).reshape(2, 4)[:, ::2])
    empty = Tensor("E", DataType.FP32, (0, 3), np.zeros((0, 3), dtype=np.float32))
    body, header_length = http_codec.encode_response(response(strided, empty),
                                                     request(binary_data_output=True))
    doc, binary = split_response(body, header_length)
    assert [o["parameters"]["binary_data_size"] for o in doc["outputs"]] == [16, 0]
    assert binary == np.array([[0, 2], [4, 6]], dtype=np.int32).tobytes()
    body, _ = http_codec.encode_response(response(strided, empty), request())
    assert [o["data"] for o in json.loads(body)["outputs"]] == [[0, 2, 4, 6], []]


def test_http_encode_then_decode_round_trip() -> None:
    body, header_length = http_codec.encode_response(response(FP, STR, INT),
                                                     request([RequestedOutput("FP", binary_data=False)],
                                                             binary_data_output=True))
    doc, binary = split_response(body, header_length)
    # a response is laid out like a request: its outputs, fed back as inputs, decode to the same tensors
    inputs = decode_http({"inputs": doc["outputs"]}, binary).inputs
    for before, after in zip((FP, STR, INT), inputs, strict=True):
        assert (after.name, after.datatype, after.shape) == (before.name, before.datatype, before.shape)
        assert after.data.tolist() == before.data.tolist()


# ------------------------------------------------------------------------------------------------- grpc_codec

def grpc_input(msg: gpb.ModelInferRequest, name: str, datatype: str, shape: list[int]
               ) -> gpb.ModelInferRequest.InferInputTensor:
    t = msg.inputs.add()
    t.name = name
    t.datatype = datatype
    t.shape.extend(shape)
    return t


def test_grpc_raw_input_contents() -> None:
    msg = gpb.ModelInferRequest(model_name="m", model_version="2", id="r")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    grpc_input(msg, "A", "FP32", [2, 3])
    grpc_input(msg, "B", "BYTES", [2])
    grpc_input(msg, "C", "FP16", [1])
    msg.raw_input_contents.extend([a.tobytes(), length_prefixed(b"x", b"\xff"),
                                   np.array([0.5], np.float16).tobytes()])
    request = grpc_codec.decode_request(msg)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r")
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [
        ("A", DataType.FP32, (2, 3)), ("B", DataType.BYTES, (2,)), ("C", DataType.FP16, (1,))]
    np.testing.assert_array_equal(request.inputs[0].data, a)
    assert request.inputs[1].data.tolist() == [b"x", b"\xff"]
    assert request.inputs[2].data.tolist() == [0.5]
    assert request.outputs is None
    assert request.parameters == {}


@pytest.mark.parametrize("datatype, field, values", [
    ("BOOL", "bool_contents", [True, False, True]),
    ("INT8", "int_contents", [-128, 0, 127]),
    ("INT16", "int_contents", [-32768, 1, 32767]),
    ("INT32", "int_contents", [-(2**31), 2, 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 3, 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 1, 255]),
    ("UINT16", "uint_contents", [0, 2, 65535]),
    ("UINT32", "uint_contents", [0, 3, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 4, 2**64 - 1]),
    ("FP32", "fp32_contents", [1.5, -0.25, 3.0]),
    ("FP64", "fp64_contents", [1e300, -0.1, 2.0]),
    ("BYTES", "bytes_contents", [b"a", b"", b"\xff"]),
])
def test_grpc_typed_contents(datatype: str, field: str, values: list[Any]) -> None:
    msg = gpb.ModelInferRequest(model_name="m")
    t = grpc_input(msg, "IN", datatype, [3])
    getattr(t.contents, field).extend(values)
    (tensor,) = grpc_codec.decode_request(msg).inputs
    dt = DataType(datatype)
    assert tensor.datatype is dt
    assert tensor.data.dtype == dt.numpy_dtype
    assert tensor.data.shape == (3,)
    assert tensor.data.tolist() == values


def test_grpc_typed_contents_are_reshaped() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "INT32", [2, 2]).contents.int_contents.extend([1, 2, 3, 4])
    (tensor,) = grpc_codec.decode_request(msg).inputs
    assert tensor.data.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_grpc_half_types_need_raw_contents(datatype: str) -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", datatype, [1]).contents.fp32_contents.append(1.0)
    with rejected("input 'IN'", f"{datatype} data must be sent in raw_input_contents"):
        grpc_codec.decode_request(msg)


@pytest.mark.parametrize("datatype, field, value", [
    ("INT8", "int_contents", 128),
    ("INT16", "int_contents", -32769),
    ("UINT8", "uint_contents", 256),
    ("UINT16", "uint_contents", 65536),
])
def test_grpc_typed_value_out_of_range(datatype: str, field: str, value: int) -> None:
    msg = gpb.ModelInferRequest()
    getattr(grpc_input(msg, "IN", datatype, [1]).contents, field).append(value)
    with rejected("input 'IN'", f"out of range for {datatype}"):
        grpc_codec.decode_request(msg)


def test_grpc_typed_count_mismatch() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "FP32", [2, 2]).contents.fp32_contents.extend([1.0, 2.0, 3.0])
    with rejected("input 'IN'", "[2, 2] needs 4 elements", "contents has 3"):
        grpc_codec.decode_request(msg)


def test_grpc_typed_contents_in_the_wrong_list_count_as_missing() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "INT64", [2]).contents.int_contents.extend([1, 2])
    with rejected("input 'IN'", "needs 2 elements", "contents has 0"):
        grpc_codec.decode_request(msg)


def test_grpc_raw_contents_count_mismatch() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "A", "INT32", [1])
    grpc_input(msg, "B", "INT32", [1])
    msg.raw_input_contents.append(b"\0" * 4)
    with rejected("2 inputs", "1 raw_input_contents"):
        grpc_codec.decode_request(msg)


def test_grpc_raw_contents_size_mismatch() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "INT32", [3])
    msg.raw_input_contents.append(b"\0" * 8)
    with rejected("input 'IN'", "needs 12 bytes", "got 8"):
        grpc_codec.decode_request(msg)


def test_grpc_bad_raw_bytes_element() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "TEXT", "BYTES", [1])
    msg.raw_input_contents.append(struct.pack("<I", 9) + b"abc")
    with rejected("input 'TEXT'", "claims 9 bytes"):
        grpc_codec.decode_request(msg)


def test_grpc_bad_shape_and_datatype() -> None:
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "INT32", [2, -3])
    with rejected("input 'IN'", "negative"):
        grpc_codec.decode_request(msg)
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "INT32", [2**40, 2])
    with rejected("input 'IN'", "more than"):
        grpc_codec.decode_request(msg)
    msg = gpb.ModelInferRequest()
    grpc_input(msg, "IN", "FLOAT", [1])
    with rejected("input 'IN'", "unknown datatype 'FLOAT'"):
        grpc_codec.decode_request(msg)


def set_params(target: Any, **values: Any) -> None:
    for key, (kind, value) in values.items():
        setattr(target[key], kind, value)


def test_grpc_parameters_of_each_kind() -> None:
    msg = gpb.ModelInferRequest()
    set_params(msg.parameters, flag=("bool_param", True), priority=("int64_param", -(2**40)),
               name=("string_param", "x"), ratio=("double_param", 0.25), big=("uint64_param", 2**64 - 1))
    msg.parameters["unset"].SetInParent()
    t = grpc_input(msg, "IN", "INT32", [1])
    t.contents.int_contents.append(5)
    set_params(t.parameters, shm=("string_param", "region"), off=("int64_param", 0))
    out = msg.outputs.add(name="OUT")
    set_params(out.parameters, binary_data=("bool_param", False), classification=("int64_param", 3))
    msg.outputs.add(name="OUT2")
    request = grpc_codec.decode_request(msg)
    assert request.parameters == {"flag": True, "priority": -(2**40), "name": "x", "ratio": 0.25,
                                  "big": 2**64 - 1, "unset": None}
    assert type(request.parameters["flag"]) is bool and type(request.parameters["priority"]) is int
    assert request.inputs[0].parameters == {"shm": "region", "off": 0}
    assert request.outputs is not None
    assert [(o.name, o.binary_data, o.parameters) for o in request.outputs] == [
        ("OUT", None, {"binary_data": False, "classification": 3}), ("OUT2", None, {})]


def grpc_encode(resp: InferenceResponse) -> gpb.ModelInferResponse:
    """What the wire codec serializes for `resp`, parsed back by protobuf."""
    parts, size = grpc_codec.InferWireCodec().encode(resp)
    body = b"".join(parts)
    assert len(body) == size
    return gpb.ModelInferResponse.FromString(body)


def test_grpc_encode_uses_raw_output_contents_in_output_order() -> None:
    strided = Tensor("S", DataType.INT32, (2, 2), np.arange(8, dtype=np.int32).reshape(2, 4)[:, ::2])
    msg = grpc_encode(response(INT, STR, FP, strided, id="r9"))
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r9")
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("INT", "INT64", [3]), ("STR", "BYTES", [2]), ("FP", "FP32", [2, 2]), ("S", "INT32", [2, 2])]
    assert list(msg.raw_output_contents) == [
        INT.data.tobytes(), length_prefixed(b"hi", "h\xe9".encode()), FP.data.tobytes(),
        np.array([[0, 2], [4, 6]], dtype=np.int32).tobytes()]
    assert not any(o.HasField("contents") for o in msg.outputs)  # typed contents crash perf_analyzer


def test_grpc_encode_empty_output_and_no_id() -> None:
    empty = Tensor("E", DataType.FP32, (0, 4), np.zeros((0, 4), dtype=np.float32))
    msg = grpc_encode(response(empty))
    assert msg.id == ""
    assert list(msg.outputs[0].shape) == [0, 4]
    assert list(msg.raw_output_contents) == [b""]


def test_grpc_encode_then_decode_round_trip() -> None:
    out = grpc_encode(response(FP, STR, INT))
    msg = gpb.ModelInferRequest(model_name="m")
    for o in out.outputs:
        grpc_input(msg, o.name, o.datatype, list(o.shape))
    msg.raw_input_contents.extend(out.raw_output_contents)
    inputs = grpc_codec.decode_request(msg).inputs
    for before, after in zip((FP, STR, INT), inputs, strict=True):
        assert (after.name, after.datatype, after.shape) == (before.name, before.datatype, before.shape)
        assert after.data.tolist() == before.data.tolist()


# ------------------------------------------------------------------------- grpc_codec: the wire fast path

def same_request(a: InferenceRequest, b: InferenceRequest) -> None:
    assert (a.model_name, a.model_version, a.id, a.parameters) == \
        (b.model_name, b.model_version, b.id, b.parameters)
    assert a.outputs == b.outputs
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in a.inputs] == \
        [(t.name, t.datatype, t.shape, t.parameters) for t in b.inputs]
    for x, y in zip(a.inputs, b.inputs, strict=True):
        assert x.data.tolist() == y.data.tolist()


def raw_request(values: np.ndarray, request_id: str = "", big: bool = False) -> gpb.ModelInferRequest:
    msg = gpb.ModelInferRequest(model_name="m", model_version="3", id=request_id)
    msg.parameters["priority"].int64_param = 2
    t = grpc_input(msg, "A", "INT32", list(values.shape))
    t.parameters["tag"].string_param = "x"
    grpc_input(msg, "B", "BYTES", [1])
    msg.outputs.add(name="OUT").parameters["classification"].int64_param = 0
    msg.raw_input_contents.extend([values.tobytes(), length_prefixed(b"y" * (300 if big else 1))])
    return msg


def test_grpc_wire_decode_matches_the_full_decode_and_reuses_the_plan() -> None:
    codec = grpc_codec.InferWireCodec()
    for i in range(3):  # a miss, then hits: ids and tensor bytes change, the rest repeats
        msg = raw_request(np.arange(4, dtype=np.int32).reshape(1, 4) + i, request_id=f"r{i}" if i else "",
                          big=i == 2)
        same_request(codec.decode(msg.SerializeToString()), grpc_codec.decode_request(msg))
    assert len(codec.plans) == 1  # one shape of request: one plan, whatever the ids and data


def test_grpc_wire_decode_of_a_new_shape_makes_a_new_plan() -> None:
    codec = grpc_codec.InferWireCodec()
    for rows in (1, 2, 1):
        msg = raw_request(np.zeros((rows, 4), dtype=np.int32))
        same_request(codec.decode(msg.SerializeToString()), grpc_codec.decode_request(msg))
    assert len(codec.plans) == 2


def test_grpc_wire_decode_checks_tensor_sizes_on_every_request() -> None:
    codec = grpc_codec.InferWireCodec()
    good = raw_request(np.zeros((1, 4), dtype=np.int32))
    codec.decode(good.SerializeToString())
    bad = raw_request(np.zeros((1, 4), dtype=np.int32))
    bad.raw_input_contents[0] = b"\x00" * 12  # the same header, 4 bytes short
    with rejected("'A'", "needs 16 bytes, got 12"):
        codec.decode(bad.SerializeToString())
    del bad.raw_input_contents[1]
    with rejected("2 inputs but 1 raw_input_contents"):
        codec.decode(bad.SerializeToString())


def test_grpc_wire_decode_falls_back_for_what_it_does_not_cut() -> None:
    from google.protobuf.message import DecodeError

    codec = grpc_codec.InferWireCodec()
    msg = raw_request(np.zeros((1, 4), dtype=np.int32))
    wire_bytes = msg.SerializeToString()
    unknown_varint = b"\x48\x01"  # field 9, varint: not ours to cut, the full parse skips it
    same_request(codec.decode(wire_bytes + unknown_varint), grpc_codec.decode_request(msg))
    codec.decode(wire_bytes)
    bad_id = wire_bytes + b"\x1a\x01\xff"  # an id that is not UTF-8: protobuf refuses it, and so do we
    with pytest.raises(DecodeError):
        codec.decode(bad_id)
    with pytest.raises(DecodeError):
        codec.decode(wire_bytes[:-3])  # truncated
    typed = gpb.ModelInferRequest(model_name="m")
    grpc_input(typed, "IN", "INT32", [2]).contents.int_contents.extend([1, 2])
    codec.decode(typed.SerializeToString())
    assert len(codec.plans) == 1  # typed contents are data: never a plan


def expected_grpc_response(resp: InferenceResponse) -> gpb.ModelInferResponse:
    """The response built field by field through protobuf's message API: what the hand-written bytes must
    parse as."""
    msg = gpb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for t in resp.outputs:
        msg.outputs.add(name=t.name, datatype=t.datatype.value, shape=t.shape)
        msg.raw_output_contents.append(bytes(wire.array_to_bytes(t.data, t.datatype)))
    return msg


def test_grpc_wire_encode_parses_as_the_message_protobuf_builds() -> None:
    codec = grpc_codec.InferWireCodec()
    strided = Tensor("S", DataType.INT32, (2, 2), np.arange(8, dtype=np.int32).reshape(2, 4)[:, ::2])
    big = Tensor("BIG", DataType.UINT8, (300,), np.arange(300, dtype=np.int64).astype(np.uint8))
    for resp in (response(INT, STR, FP, strided, big, id="r9"), response(INT, STR, FP, strided, big),
                 response(Tensor("E", DataType.FP32, (0, 4), np.zeros((0, 4), dtype=np.float32)),
                          id="é" * 80)):
        for _ in range(2):  # built, then from the cached head
            parts, size = codec.encode(resp)
            body = b"".join(parts)
            assert len(body) == size
            assert gpb.ModelInferResponse.FromString(body) == expected_grpc_response(resp)
    assert len(codec.heads) == 2


def one_parameter(key: str, value: int) -> bytes:
    return gpb.ModelInferRequest(parameters={key: gpb.InferParameter(int64_param=value)}).SerializeToString()


def test_grpc_request_parameters_keep_the_wire_order() -> None:
    # Triton hands a Python model its parameters in the order sent; protobuf's map has an order of its own.
    head = gpb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 4],
                                 inputs=[gpb.ModelInferRequest.InferInputTensor(name="I", datatype="INT32",
                                                                                shape=[1])])
    message = head.SerializeToString() + b"".join(one_parameter(k, v) for k, v in
                                                  (("z", 1), ("b", 2), ("m", 3), ("z", 4)))
    codec = grpc_codec.InferWireCodec()
    for _ in range(2):  # the full decode, then the cached plan
        assert list(codec.decode(message).parameters.items()) == [("z", 4), ("b", 2), ("m", 3)]
    # An entry with its value before its key, and a top-level field of another wire type, still scan.
    value_first = b"\x22\x07" + b"\x12\x02\x10\x05" + b"\x0a\x01y"
    params = {"x": 1, "y": 5}
    message = b"\x10\x01" + value_first + one_parameter("x", 1)
    assert list(grpc_codec.in_wire_order(message, params)) == ["y", "x"]
    assert grpc_codec.in_wire_order(b"\x22\x7f", params) is params  # bytes that do not scan: as given


def test_response_parameters_in_both_codecs() -> None:
    # A Python model's InferenceResponse(parameters=...): each value in the InferParameter field of its type.
    params = {"b": True, "i": -3, "u": 1 << 63, "d": 0.5, "s": "x"}
    out = Tensor("O", DataType.INT32, (1,), np.array([1], np.int32))
    resp = InferenceResponse("m", "1", [out], "r", params)
    parts, size = grpc_codec.InferWireCodec().encode(resp)
    got = gpb.ModelInferResponse.FromString(b"".join(parts)).parameters
    assert size == len(b"".join(parts))
    assert (got["b"].bool_param, got["i"].int64_param, got["u"].uint64_param, got["d"].double_param,
            got["s"].string_param) == (True, -3, 1 << 63, 0.5, "x")
    request = InferenceRequest("m", "1", [], "r")
    header = http_codec.encode_response_parts(resp, request)[0][0]
    assert json.loads(header)["parameters"] == params
