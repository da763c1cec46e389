"""The KServe v2 HTTP/REST body: JSON tensors and the binary tensor data extension.

A request body is a JSON header, optionally followed by raw tensor bytes; the header's length is given by the
`Inference-Header-Content-Length` HTTP header. Binary inputs become numpy views over the body.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import invalid
from ..types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor, element_count
from .wire import array_from_bytes, array_to_bytes, check_datatype, check_shape

HEADER_LENGTH = "Inference-Header-Content-Length"


def decode_request(model_name: str, model_version: str, body: bytes, header_length: str | None
                   ) -> InferenceRequest:
    json_part, binary = _split_body(body, header_length)
    try:
        doc = json.loads(json_part)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deep
        raise invalid(f"malformed JSON in request body: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object with an 'inputs' list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise invalid("request needs a non-empty 'inputs' list")
    view = memoryview(binary)
    offset = 0
    inputs = []
    for item in raw_inputs:
        tensor, used = _decode_input(item, view, offset)
        offset += used
        inputs.append(tensor)
    if offset != len(binary):
        raise invalid(f"request has {len(binary) - offset} bytes of binary data that no input claims")
    outputs = None
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise invalid("'outputs' must be a list")
        outputs = [_decode_output(o) for o in raw_outputs]
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid("'parameters' must be a JSON object")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    return InferenceRequest(model_name, model_version, inputs, request_id, outputs, params)


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        raise invalid(f"{HEADER_LENGTH} must be an integer, got '{header_length}'") from None
    if n < 0 or n > len(body):
        raise invalid(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    return body[:n], body[n:]


def _decode_input(item: Any, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise invalid("each input must be a JSON object with name, datatype, shape")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("an input has no 'name'")
    datatype_name = item.get("datatype")
    if not isinstance(datatype_name, str):
        raise invalid(f"input '{name}' has no 'datatype'")
    datatype = check_datatype(name, datatype_name)
    shape = check_shape(name, item.get("shape"))
    params = item.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid(f"input '{name}': 'parameters' must be a JSON object")
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise invalid(f"input '{name}': binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise invalid(f"input '{name}': binary_data_size is {size} but only {len(binary) - offset} "
                          "bytes of binary data remain")
        data = array_from_bytes(name, datatype, shape, binary[offset:offset + size])
        return Tensor(name, datatype, shape, data), size
    if "data" not in item:
        raise invalid(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    return Tensor(name, datatype, shape, _array_from_json(name, datatype, shape, item["data"])), 0


def _flatten(data: Any) -> list:
    if not isinstance(data, list):
        return [data]
    if data and isinstance(data[0], list):
        out: list = []
        for row in data:
            out.extend(_flatten(row))
        return out
    return data


def _array_from_json(name: str, datatype: DataType, shape: tuple[int, ...], data: Any) -> np.ndarray:
    flat = _flatten(data)
    count = element_count(shape)
    if len(flat) != count:
        raise invalid(f"input '{name}': shape {list(shape)} needs {count} elements, 'data' has {len(flat)}")
    if datatype is DataType.BYTES:
        out = np.empty(count, dtype=object)
        for i, v in enumerate(flat):
            if not isinstance(v, str):
                raise invalid(f"input '{name}': BYTES data must be strings, element {i} is {v!r}")
            out[i] = v.encode("utf-8")
        return out.reshape(shape)
    if datatype is DataType.BOOL:
        if not all(isinstance(v, bool) for v in flat):
            raise invalid(f"input '{name}': BOOL data must be true/false")
    elif any(isinstance(v, (bool, str, list, dict)) or v is None for v in flat):
        raise invalid(f"input '{name}': {datatype.value} data must be numbers")
    try:
        if datatype is DataType.BF16:
            f32 = np.asarray(flat, dtype=np.float32)
            arr = (f32.view(np.uint32) >> 16).astype(np.uint16)
        elif datatype.numpy_dtype.kind in "iu":
            if any(isinstance(v, float) and not v.is_integer() for v in flat):
                raise invalid(f"input '{name}': {datatype.value} data must be integers")
            info = np.iinfo(datatype.numpy_dtype)
            if any(v < info.min or v > info.max for v in flat):
                raise invalid(f"input '{name}': a value is out of range for {datatype.value}")
            arr = np.asarray(flat, dtype=datatype.numpy_dtype)
        else:
            arr = np.asarray(flat, dtype=datatype.numpy_dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise invalid(f"input '{name}': data does not fit {datatype.value}: {e}") from None
    return arr.reshape(shape)


def _decode_output(item: Any) -> RequestedOutput:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise invalid("each requested output must be an object with a 'name'")
    params = item.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid(f"output '{item['name']}': 'parameters' must be a JSON object")
    binary = params.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise invalid(f"output '{item['name']}': binary_data must be true or false")
    return RequestedOutput(item["name"], binary, params)


def encode_response(response: InferenceResponse, request: InferenceRequest) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows (else None)."""
    default_binary = bool(request.parameters.get("binary_data_output", False))
    wanted = {o.name: o.binary_data for o in request.outputs} if request.outputs else {}
    outputs = []
    chunks: list[Any] = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype.value,
                                 "shape": list(tensor.shape)}
        binary = wanted.get(tensor.name)
        if binary is None:
            binary = default_binary
        if binary:
            raw = array_to_bytes(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(tensor)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    doc["outputs"] = outputs
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def _json_data(tensor: Tensor) -> list:
    arr = tensor.data.reshape(-1)
    if tensor.datatype is DataType.BYTES:
        return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in arr]
    if tensor.datatype is DataType.BF16:
        return (arr.astype(np.uint32) << 16).view(np.float32).tolist()
    return arr.tolist()
