"""engine/frontend/http/generate_codec.py: Triton's mapping of generate JSON to an inference and back, pure.
The expected words and shapes are what Triton 2.51 answered to the same bodies."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from engine.errors import EngineError, ErrorCode
from engine.frontend.http.generate_codec import (
    decode_generate,
    encode_generate,
    input_metadata,
    many_responses,
)
from engine.types import DataType, InferenceResponse, Tensor

SIMPLE = input_metadata({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                                    {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]})
ECHO = input_metadata({"inputs": [
    {"name": "text_input", "datatype": "BYTES", "shape": [1]},
    {"name": "count", "datatype": "INT32", "shape": [-1]},
    {"name": "u", "datatype": "UINT8", "shape": [-1]},
    {"name": "flt", "datatype": "FP32", "shape": [2, -1]},
    {"name": "half", "datatype": "FP16", "shape": [1]},
    {"name": "flag", "datatype": "BOOL", "shape": [1]}]})
LIMIT = 1 << 20


def decode(doc, inputs=ECHO, limit=LIMIT):
    return decode_generate("m", "", doc, inputs, limit)


def refused(doc, inputs=ECHO, limit=LIMIT) -> str:
    with pytest.raises(EngineError) as e:
        decode(doc, inputs, limit)
    assert e.value.code is ErrorCode.INVALID_ARG
    return e.value.message


def test_inputs_by_name_with_the_metadata_datatype_and_shape():
    request = decode({"INPUT0": list(range(16)), "INPUT1": [1] * 32}, SIMPLE)
    a, b = request.inputs
    assert (a.name, a.datatype, a.shape, a.data.dtype) == ("INPUT0", DataType.INT32, (1, 16), np.int32)
    assert a.data.tolist() == [list(range(16))]
    assert b.shape == (2, 16)
    assert request.parameters == {} and request.id == ""


def test_scalars_lists_bytes_and_fixed_dims():
    request = decode({"text_input": "héllo", "count": 5, "flt": [1, 2, 3, 4], "flag": True})
    tensors = {t.name: t for t in request.inputs}
    assert tensors["text_input"].shape == (1,) and tensors["text_input"].data.tolist() == ["héllo".encode()]
    assert tensors["count"].shape == (1,) and tensors["count"].data.tolist() == [5]
    assert tensors["flt"].shape == (2, 2) and tensors["flt"].data.dtype == np.float32
    assert tensors["flag"].data.tolist() == [True]
    empty = decode({"count": []}).inputs[0]
    assert empty.shape == (0,)


def test_other_keys_and_parameters_become_parameters_in_order_and_id_is_both():
    request = decode({"text_input": "a", "id": "42", "parameters": {"temperature": 0.5, "stream": False,
                                                                     "n": 3, "s": "x", "count": [1, 2]},
                      "top": 1, "big": 18446744073709551615})
    assert request.id == "42"
    assert list(request.parameters.items()) == [("id", "42"), ("temperature", 0.5), ("stream", False),
                                                ("n", 3), ("s", "x"), ("top", 1),
                                                ("big", 18446744073709551615.0)]
    assert [t.name for t in request.inputs] == ["text_input", "count"]  # an input under "parameters"


@pytest.mark.parametrize("doc, message", [
    ({"bad": [1, 2]}, "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"bad": {"a": 1}}, "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"bad": None}, "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"parameters": {"x": [1]}}, "Converting keyword: 'parameters': parameter 'x' has invalid type. It "
                                 "should be either 'int', 'bool', or 'string'."),
    ({"parameters": [1]}, "Expected JSON object for keyword: 'parameters': attempt to access JSON "
                          "non-object as object"),
    ({"id": 5}, "Unable to parse 'id': attempt to access JSON non-string as string"),
    ({"text_input": 5}, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ({"count": "x"}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"count": 1.5}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"count": True}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"u": [-1]}, "Unable to parse 'data': a value is out of range for UINT8"),
    ({"u": ["a"]}, "Unable to parse 'data': attempt to access JSON non-unsigned-integer as "
                   "unsigned-integer"),
    ({"count": 3000000000}, "Unable to parse 'data': a value is out of range for INT32"),
    ({"flt": ["x", "y"]}, "Unable to parse 'data': attempt to access JSON non-number as double"),
    ({"flag": 1}, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ({"count": [[1, 2], [3, 4]]}, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ({"flt": [1, 2, 3]}, "The schema can not convert input 'flt' to tensor with proper shape"),
    ({"half": 1}, "receiving FP16 data via JSON is not supported. Please use the binary data format for "
                  "input half"),
    ({"count": 1, "parameters": {"count": 2}}, "Converting keyword: 'parameters': input 'count' already "
                                               "exists in request"),
    ([1], "attempt to get members for non-object"),
])
def test_errors_in_tritons_words(doc, message):
    assert refused(doc) == message


def test_simple_shape_refusal_and_input_size_limit():
    assert refused({"INPUT0": list(range(15))}, SIMPLE) == \
        "The schema can not convert input 'INPUT0' to tensor with proper shape"
    message = refused({"INPUT0": list(range(16)), "INPUT1": list(range(16))}, SIMPLE, limit=100)
    assert message == ("request size of 64 bytes with input 'INPUT1' of size 64 bytes exceeds the maximum "
                       "allowed input size of 100. Use --http-max-input-size to increase the limit.")


def test_an_input_named_parameters_clashes_with_the_nested_schema():
    inputs = input_metadata({"inputs": [{"name": "parameters", "datatype": "INT32", "shape": [1]}]})
    assert refused({"parameters": {}}, inputs) == \
        "Keyword 'parameters' for nested schema also given as input tensor name"


def response(outputs, parameters=None, id_=""):
    return InferenceResponse("m", "3", outputs, id_, parameters or {})


def test_response_is_flat_sorted_and_unwraps_one_element():
    body = encode_generate(response([
        Tensor("text_output", DataType.BYTES, (1, 1), np.array([[b"HI"]], dtype=object)),
        Tensor("OUTPUT0", DataType.INT32, (1, 3), np.array([[1, 2, 3]], np.int32)),
        Tensor("FLT", DataType.FP32, (2,), np.array([0.5, 1.5], np.float32))], id_="42"))
    assert body == (b'{"FLT":[0.5,1.5],"OUTPUT0":[1,2,3],"id":"42","model_name":"m","model_version":"3",'
                    b'"text_output":"HI"}')


def test_response_parameters_are_keys_and_reserved_names_win():
    body = orjson.loads(encode_generate(response(
        [Tensor("pint", DataType.INT32, (1,), np.array([9], np.int32)),
         Tensor("EMPTY", DataType.INT32, (0,), np.zeros(0, np.int32))],
        {"pint": 3, "model_name": "x", "ok": True})))
    assert body == {"EMPTY": [], "model_name": "m", "model_version": "3", "ok": True, "pint": 3}
    assert "id" not in body


def test_nonfinite_floats_are_written_as_json_readers_expect():
    body = encode_generate(response([Tensor("F", DataType.FP32, (2,), np.array([math.nan, 1], np.float32))]))
    assert body == b'{"F":[NaN,1.0],"model_name":"m","model_version":"3"}'


def test_more_than_one_response_is_internal():
    e = many_responses()
    assert e.code is ErrorCode.INTERNAL
    assert e.message == ("generate expects model to produce exactly 1 response, use generate stream for "
                         "model that generates various number of responses")
