"""The generate extension's JSON, pure: a generate request body → an `InferenceRequest`, and an
`InferenceResponse` → the generate response's JSON. generate.py drives it; nothing here does I/O.

Triton's mapping (server src/http_server.cc, GenerateRequestClass; docs/protocol/extension_generate.md), each
rule checked against Triton 2.51:
- every top-level key naming one of the model's inputs becomes that input, its datatype and shape from the
  model's metadata; `parameters` is an object whose keys map the same way (an input or a parameter); any
  other key, `id` included, becomes a request parameter. `id` must be a string and is also the request id.
- an input's value is a scalar or a flat list; its shape fills the metadata's shape: the fixed dimensions
  must divide the element count, the innermost variable one takes the rest and the others are 1
  (`{"INPUT0": [16 ints]}` is [1, 16] for `simple`'s [-1, 16]). BYTES elements are strings (UTF-8).
- a parameter is a string, an integer (int64), a boolean or another number (a double); anything else is
  refused.
- the answer is one flat object: `id` (when the request had one), `model_name`, `model_version`, the
  response's parameters and each output by name (its elements flattened; one element as a scalar, not a
  list), with the keys in byte order as Triton writes them; a name taken earlier in that list wins.
The words of each error are Triton's. Triton answers its JSON reader's errors (a wrong element type, a
nested list, an `id` that is no string) with 500; hubserve answers them 400, INVALID_ARG, as it answers
malformed request JSON everywhere (the client's request is at fault, not the server).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from ...errors import EngineError, ErrorCode, invalid
from ...observability.request_ids import check_request_id
from ...types import DataType, InferenceRequest, InferenceResponse, Tensor

PARAMETERS_KEY = "parameters"  # Triton's one nested schema key in a generate request
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SIGNED = "attempt to access JSON non-signed-integer as signed-integer"
_UNSIGNED = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NUMBER = "attempt to access JSON non-number as double"
_BOOLEAN = "attempt to access JSON non-boolean as boolean"

# The model metadata's `inputs` by name: {"name", "datatype", "shape"} each, as DataPlane.model_metadata
# gives them (a batching model's shapes start with -1).
InputMetadata = dict[str, dict[str, Any]]


def input_metadata(metadata: dict[str, Any]) -> InputMetadata:
    """The inputs of a model metadata answer, by name."""
    return {i["name"]: i for i in metadata.get("inputs", ())}


def decode_generate(model_name: str, model_version: str, doc: Any, inputs: InputMetadata,
                    max_input_bytes: int) -> InferenceRequest:
    """The inference a generate request body (parsed JSON) asks for. Raises EngineError in Triton's words;
    what the model then refuses (a missing input, a wrong batch size) is Model.prepare's to say."""
    if not isinstance(doc, dict):
        raise invalid("attempt to get members for non-object")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("Unable to parse 'id': attempt to access JSON non-string as string")
    check_request_id(request_id, "'id'")
    request = InferenceRequest(model_name, model_version, [], request_id)
    budget = _Budget(max_input_bytes)
    for key, value in doc.items():
        if key == PARAMETERS_KEY:
            if key in inputs:
                raise invalid(f"Keyword '{key}' for nested schema also given as input tensor name")
            if not isinstance(value, dict):
                raise invalid(f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object "
                              "as object")
            for nested_key, nested_value in value.items():
                try:
                    _map(request, nested_key, nested_value, inputs, budget)
                except EngineError as e:
                    raise EngineError(e.code, f"Converting keyword: '{key}': {e.message}") from None
        else:
            _map(request, key, value, inputs, budget)
    return request


class _Budget:
    """The input bytes a request may still decode: --http-max-input-size, as Triton counts it."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, name: str, size: int) -> None:
        if self.used + size > self.limit:
            raise invalid(f"request size of {self.used} bytes with input '{name}' of size {size} bytes "
                          f"exceeds the maximum allowed input size of {self.limit}. Use "
                          "--http-max-input-size to increase the limit.")
        self.used += size


def _map(request: InferenceRequest, key: str, value: Any, inputs: InputMetadata, budget: _Budget) -> None:
    """One key of the request: the input it names, else a parameter."""
    meta = inputs.get(key)
    if meta is None:
        request.parameters[key] = _parameter(key, value)
        return
    if any(t.name == key for t in request.inputs):
        raise invalid(f"input '{key}' already exists in request")
    request.inputs.append(_tensor(key, meta, value, budget))


def _parameter(key: str, value: Any) -> Any:
    if isinstance(value, (str, bool, float)):
        return value
    if isinstance(value, int):
        return value if _INT64[0] <= value <= _INT64[1] else float(value)  # a double past int64, as Triton
    raise invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _tensor(name: str, meta: dict[str, Any], value: Any, budget: _Budget) -> Tensor:
    datatype = DataType.from_v2(meta["datatype"])
    if datatype in (DataType.FP16, DataType.BF16):
        raise invalid(f"receiving {datatype.value} data via JSON is not supported. Please use the binary "
                      f"data format for input {name}")
    flat = value if isinstance(value, list) else [value]
    if any(isinstance(v, (list, dict)) for v in flat):
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype is DataType.BYTES:
        if not all(isinstance(v, str) for v in flat):
            raise invalid("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
        encoded = [v.encode("utf-8") for v in flat]
        size = sum(len(b) + 4 for b in encoded)
    else:
        size = len(flat) * datatype.itemsize
    budget.take(name, size)
    shape = _fill_shape(name, [int(d) for d in meta["shape"]], len(flat))
    if datatype is DataType.BYTES:
        data = np.empty(len(encoded), dtype=object)
        data[:] = encoded
    else:
        data = _numbers(datatype, flat)
    return Tensor(name, datatype, shape, data.reshape(shape))


def _fill_shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """Triton's two passes: fixed dimensions divide the count, the innermost variable dimension takes what
    is left and the other variable ones are 1."""
    refused = invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    left = count
    for d in reversed(dims):
        if d != -1:
            if d == 0:
                if left:
                    raise refused
                continue
            if left % d:
                raise refused
            left //= d
    shape = list(dims)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], left = left, 1
    if left != 1 and count:
        raise refused
    return tuple(shape)


def _numbers(datatype: DataType, flat: list[Any]) -> np.ndarray:
    if datatype is DataType.BOOL:
        if not all(isinstance(v, bool) for v in flat):
            raise invalid(f"Unable to parse 'data': {_BOOLEAN}")
        return np.array(flat, dtype=np.bool_)
    kind = datatype.numpy_dtype.kind
    if kind in "iu":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise invalid(f"Unable to parse 'data': {_SIGNED if kind == 'i' else _UNSIGNED}")
        info = np.iinfo(datatype.numpy_dtype)
        if any(v < info.min or v > info.max for v in flat):  # Triton wraps such a value around; we refuse
            raise invalid(f"Unable to parse 'data': a value is out of range for {datatype.value}")
        return np.array(flat, dtype=datatype.numpy_dtype)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise invalid(f"Unable to parse 'data': {_NUMBER}")
    return np.array(flat, dtype=datatype.numpy_dtype)


def encode_generate(response: InferenceResponse) -> bytes:
    """The generate response JSON of one inference response (see the module's docstring)."""
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = response.model_version
    for key, value in response.parameters.items():
        fields.setdefault(key, value)
    nonfinite = False
    for tensor in response.outputs:
        if tensor.name in fields:
            continue
        values = _json_values(tensor)
        fields[tensor.name] = values[0] if len(values) == 1 else values
        nonfinite = nonfinite or tensor.data.dtype.kind == "f" and not np.isfinite(tensor.data).all()
    doc = dict(sorted(fields.items(), key=lambda kv: kv[0].encode()))
    if nonfinite:  # orjson writes NaN and Inf as null; JSON readers of v2 answers expect NaN / Infinity
        return json.dumps(doc, separators=(",", ":")).encode()
    try:
        return orjson.dumps(doc)
    except (TypeError, OverflowError):
        return json.dumps(doc, separators=(",", ":")).encode()


def _json_values(tensor: Tensor) -> list[Any]:
    arr = tensor.data.reshape(-1)
    if tensor.datatype is DataType.BYTES:
        return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in arr]
    if tensor.datatype is DataType.BF16:
        return (arr.astype(np.uint32) << 16).view(np.float32).tolist()  # type: ignore[no-any-return]
    return arr.tolist()  # type: ignore[no-any-return]


def many_responses() -> EngineError:
    """`generate` (not `_stream`) on a model that answered with other than one response."""
    return EngineError(ErrorCode.INTERNAL, "generate expects model to produce exactly 1 response, use "
                                           "generate stream for model that generates various number of "
                                           "responses")


__all__ = ["InputMetadata", "decode_generate", "encode_generate", "input_metadata", "many_responses"]
