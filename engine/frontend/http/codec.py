"""The KServe v2 HTTP/REST body: JSON tensors and the binary tensor data extension.

A request body is a JSON header, optionally followed by raw tensor bytes; the header's length is given by the
`Inference-Header-Content-Length` HTTP header. Binary inputs become numpy views over the body.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from ...bounded_cache import BoundedCache
from ...errors import EngineError, invalid
from ...observability.request_ids import check_request_id
from ...types import (
    DataType,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    RequestPlan,
    Tensor,
    element_count,
    in_shared_memory,
)
from ..wire import array_from_bytes, array_to_bytes, check_bytes_element, check_datatype, check_shape
from ..wire import limits as wire_limits

HEADER_LENGTH = "Inference-Header-Content-Length"


class HeaderCache:
    """Decoded request headers, keyed by their exact JSON bytes.

    Clients of the binary extension (perf_analyzer, tritonclient) send the same JSON header with every
    request; only the tensor bytes change. The first sight of a header is decoded and validated in full;
    later requests with the same bytes reuse the result and only wrap their tensor bytes. Bounded, so a
    client sending endless distinct headers cannot grow it."""

    MAX_ENTRIES = 1024
    MAX_HEADER_BYTES = 8192

    def __init__(self) -> None:
        self.plans: BoundedCache[bytes, _Plan] = BoundedCache(self.MAX_ENTRIES, self.MAX_HEADER_BYTES)

    def get(self, header: bytes) -> _Plan | None:
        return self.plans.get(header)

    def put(self, header: bytes, plan: _Plan) -> None:
        self.plans.put(header, plan)


class _Plan(RequestPlan):
    """How to cut a body with a known header into tensors. Shared by requests: never mutated but for the
    model's verdict (RequestPlan) and the response headers it learns (`encoded`)."""

    __slots__ = ("inputs", "outputs", "params", "id", "binary_size", "encoded")

    def __init__(self, request: InferenceRequest, sizes: list[int]) -> None:
        super().__init__()
        # per input: its name, datatype, shape, byte size, and numpy dtype (None for BYTES, whose elements
        # are checked on every request); the full decode checked a fixed-size input's bytes against its shape
        self.inputs = [(t.name, t.datatype, t.shape, size, None if t.datatype is DataType.BYTES else
                        t.datatype.numpy_dtype) for t, size in zip(request.inputs, sizes, strict=True)]
        self.outputs = request.outputs
        self.params = request.parameters
        self.id = request.id
        self.binary_size = sum(sizes)
        self.encoded: dict[Any, tuple[bytes, int]] = {}  # response headers by output shapes


def decode_request(model_name: str, model_version: str, body: bytes | bytearray, header_length: str | None,
                   cache: HeaderCache | None = None) -> InferenceRequest:
    json_part, binary = _split_body(body, header_length)
    if cache is not None and binary:
        plan = cache.get(bytes(json_part))  # bytes already when binary data follows: no copy
        if plan is not None and plan.binary_size == len(binary):
            return _from_plan(plan, model_name, model_version, binary)
    try:
        doc = orjson.loads(json_part)
    except orjson.JSONDecodeError:
        doc = _loads_lenient(json_part)
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object with an 'inputs' list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise invalid("request needs a non-empty 'inputs' list")
    view = memoryview(binary)
    offset = 0
    inputs = []
    sizes = []
    for item in raw_inputs:
        tensor, used = _decode_input(item, view, offset)
        offset += used
        inputs.append(tensor)
        sizes.append(used)
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
    if params:
        check_json_depth(params, wire_limits().max_json_depth - 1)  # at depth 2 of the document
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    check_request_id(request_id, "'id'")
    request = InferenceRequest(model_name, model_version, inputs, request_id, outputs, params)
    if cache is not None and binary and all(sizes):  # only all-binary requests: JSON data varies per request
        cache.put(bytes(json_part), _Plan(request, sizes))
    return request


def _from_plan(plan: _Plan, model_name: str, model_version: str, binary: memoryview) -> InferenceRequest:
    view = memoryview(binary)
    offset = 0
    inputs = []
    for name, datatype, shape, size, dtype in plan.inputs:
        data = view[offset:offset + size]
        # (the plan's size is its shape's: a view, with nothing left to check, but for BYTES)
        array = np.frombuffer(data, dtype=dtype).reshape(shape) if dtype is not None else \
            array_from_bytes(name, datatype, shape, data)
        inputs.append(Tensor(name, datatype, shape, array))
        offset += size
    request = InferenceRequest(model_name, model_version, inputs, plan.id, plan.outputs, plan.params)
    request.plan = plan
    return request


def _loads_lenient(text: bytes | bytearray) -> Any:
    """Python's json accepts the NaN and Infinity that json.dumps (and so tritonclient) writes; orjson,
    the fast path, does not."""
    try:
        return json.loads(text)
    except RecursionError:  # orjson stops at 1024 levels, and so does Python's json, near its own limit
        raise too_deep() from None
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"malformed JSON in request body: {e}") from None


def _split_body(body: bytes | bytearray, header_length: str | None) -> tuple[bytes | bytearray, memoryview]:
    """The JSON header (bytes when the binary part follows: it keys the HeaderCache) and a view of the binary
    part, so the tensor bytes are never copied out of the received body."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        raise invalid(f"{HEADER_LENGTH} must be an integer, got '{header_length}'") from None
    if n < 0 or n > len(body):
        raise invalid(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
    view = memoryview(body)
    return view[:n].tobytes(), view[n:]


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
    if params:
        check_json_depth(params, wire_limits().max_json_depth - 3)  # document, 'inputs', the input
    if in_shared_memory(params):  # no data here: Model.prepare refuses it, as for gRPC
        return Tensor(name, datatype, shape, np.empty(0, datatype.numpy_dtype), params), 0
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


# Where an input's 'data' sits in the request document: the document, 'inputs', the input object.
_DATA_DEPTH = 3


def _flatten(data: Any, depth: int, limit: int) -> list:
    if not isinstance(data, list):
        return [data]
    if depth > limit:
        raise RecursionError
    if data and isinstance(data[0], list):
        out: list = []
        for row in data:
            out.extend(_flatten(row, depth + 1, limit))
        return out
    return data


def too_deep() -> EngineError:
    return invalid(f"request body: JSON nested deeper than {wire_limits().max_json_depth} levels "
                   "(--max-json-depth)")


def check_json_depth(doc: Any, limit: int) -> None:
    """INVALID_ARG when `doc` nests objects and arrays deeper than `limit` (the document itself is 1).
    Walks without recursion; a list's scalars are skipped at C speed (the common case: tensor data)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise too_deep()
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _array_from_json(name: str, datatype: DataType, shape: tuple[int, ...], data: Any) -> np.ndarray:
    limit = wire_limits().max_json_depth
    try:
        flat = _flatten(data, _DATA_DEPTH + 1, limit)
    except RecursionError:
        raise invalid(f"input '{name}': 'data' is nested deeper than the request's JSON depth limit of "
                      f"{limit} (--max-json-depth)") from None
    count = element_count(shape)
    if len(flat) != count:
        raise invalid(f"input '{name}': shape {list(shape)} needs {count} elements, 'data' has {len(flat)}")
    if datatype is DataType.BYTES:
        out = np.empty(count, dtype=object)
        most = wire_limits().max_bytes_element
        for i, v in enumerate(flat):
            if not isinstance(v, str):
                raise invalid(f"input '{name}': BYTES data must be strings, element {i} is {v!r}")
            encoded = v.encode("utf-8")
            if len(encoded) > most:
                check_bytes_element(name, i, len(encoded))
            out[i] = encoded
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
    if params:
        check_json_depth(params, wire_limits().max_json_depth - 3)  # document, 'outputs', the output
    binary = params.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise invalid(f"output '{item['name']}': binary_data must be true or false")
    return RequestedOutput(item["name"], binary, params)


def encode_response(response: InferenceResponse, request: InferenceRequest) -> tuple[bytes, int | None]:
    """The response body in one piece, and the JSON header's length when binary data follows (else None)."""
    parts, _, header_length = encode_response_parts(response, request)
    return parts[0] if len(parts) == 1 else b"".join(parts), header_length


def encode_response_parts(response: InferenceResponse, request: InferenceRequest
                          ) -> tuple[list[Any], int, int | None]:
    """The response body as parts (the JSON header, then each binary output's bytes: views of the output
    arrays, not copies), its size in bytes, and the JSON header's length when binary data follows (else
    None). The connection writes the parts as they are (connection.py `_write`)."""
    plan = request.plan if isinstance(request.plan, _Plan) else None
    placed = False  # outputs written to clients' shared memory: their header differs, never cached
    output_shapes = []
    for t in response.outputs:  # (every answer: spelled out, no generator resumed per output)
        if t.parameters:
            placed = True
        output_shapes.append(t.shape)
    if placed:
        plan = None
    if plan is not None and not response.parameters:  # a cached header carries no response parameters
        cached = plan.encoded.get((response.model_name, response.model_version, tuple(output_shapes)))
        if cached is not None:
            header, n = cached
            parts: list[Any] = [header]
            size = 0
            for t in response.outputs:
                arr, datatype = t.data, t.datatype
                if datatype.itemsize and arr.dtype == datatype.numpy_dtype and arr.size and \
                        arr.flags.c_contiguous:
                    chunk: bytes | memoryview = arr.data.cast("B")  # what array_to_bytes returns for it
                else:
                    chunk = array_to_bytes(arr, datatype)
                parts.append(chunk)
                size += len(chunk)
            if size == n:
                return parts, len(header) + n, len(header)
    default_binary = bool(request.parameters.get("binary_data_output", False))
    wanted = {o.name: o.binary_data for o in request.outputs} if request.outputs else {}
    outputs = []
    chunks = []
    json_nonfinite = False
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype.value,
                                 "shape": list(tensor.shape)}
        if placed and in_shared_memory(tensor.parameters):  # in the client's region: no data, as Triton
            outputs.append(entry)
            continue
        binary = wanted.get(tensor.name)
        if binary is None:
            binary = default_binary
        if binary:
            raw = array_to_bytes(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(tensor)
            if tensor.data.dtype.kind == "f" and not np.isfinite(tensor.data).all():
                json_nonfinite = True
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:  # set by a Python model's InferenceResponse(parameters=...), as Triton sends them
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    try:
        header = orjson.dumps(doc)
    except (TypeError, OverflowError):
        header = json.dumps(doc, separators=(",", ":")).encode()
    if json_nonfinite:  # orjson writes NaN and Inf as null; v2 JSON readers expect NaN/Infinity
        header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return [header], len(header), None
    if plan is not None and len(chunks) == len(response.outputs) and len(plan.encoded) < 64 and \
            not response.parameters:
        # every output binary: the header depends only on the shapes, so the next one is a lookup
        plan.encoded[(response.model_name, response.model_version, tuple(output_shapes))] = (
            header, sum(len(c) for c in chunks))
    return [header, *chunks], len(header) + sum(len(c) for c in chunks), len(header)


def _json_data(tensor: Tensor) -> list:
    arr = tensor.data.reshape(-1)
    if tensor.datatype is DataType.BYTES:
        return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in arr]
    if tensor.datatype is DataType.BF16:
        return (arr.astype(np.uint32) << 16).view(np.float32).tolist()
    return arr.tolist()
