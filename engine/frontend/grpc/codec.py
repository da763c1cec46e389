"""ModelInferRequest / ModelInferResponse ↔ engine types.

Inputs arrive as `raw_input_contents` (one entry per input, in order) or typed `contents`; outputs always
leave as `raw_output_contents`, one entry per output in order (perf_analyzer crashes on typed contents).

ModelInfer and ModelStreamInfer work on the serialized bytes (`InferWireCodec`): reading fields of a parsed
message through the protobuf runtime costs ~20 µs per small request and building a response message ~12 µs,
several times what the rest of the frontend spends. Clients repeat the same request apart from its tensor
bytes and id, so a request is cut into its fields (every top-level field of ModelInferRequest is
length-delimited), the fields other than `id` and `raw_input_contents` are the key of a plan made by the full
decode (`decode_request`), and a response is a cached serialized head followed by `id` and
`raw_output_contents` fields written by hand. Protobuf parsers accept fields in any order, and a field
repeated is merged/last-wins exactly as on the first, full decode, so the result is the message the full
path would produce.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...bounded_cache import BoundedCache
from ...errors import invalid
from ...observability.request_ids import check_request_id
from ...proto import grpc_service_pb2 as pb
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

# Which typed `contents` field carries each datatype.
_CONTENTS_FIELD = {
    DataType.BOOL: "bool_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}


def param_value(p: Any) -> Any:
    choice = p.WhichOneof("parameter_choice")
    return getattr(p, choice) if choice else None


def decode_request(msg: pb.ModelInferRequest) -> InferenceRequest:
    """The full decode: the wire path's first sight of a request, and its fallback for what it does not
    cut."""
    raw = msg.raw_input_contents
    if raw:  # checked first, as Triton does (server src/grpc/infer_handler.cc), so its words come first
        for t in msg.inputs:
            if t.HasField("contents"):
                raise invalid(f"contents field must not be specified when using raw_input_contents for "
                              f"'{t.name}' for model '{msg.model_name}'")
    shared = sum(1 for t in msg.inputs if in_shared_memory(t.parameters))
    if raw and len(raw) != len(msg.inputs) - shared:
        raise invalid(f"request has {len(msg.inputs)} inputs but {len(raw)} raw_input_contents entries")
    inputs = []
    next_raw = 0
    for t in msg.inputs:
        datatype = check_datatype(t.name, t.datatype)
        shape = check_shape(t.name, list(t.shape))
        if shared and in_shared_memory(t.parameters):  # no data here: Model.prepare refuses it, as for HTTP
            data = np.empty(0, datatype.numpy_dtype)
        elif raw:
            data = array_from_bytes(t.name, datatype, shape, raw[next_raw])
            next_raw += 1
        else:
            data = _from_contents(t, datatype, shape)
        params = {k: param_value(v) for k, v in t.parameters.items()} if t.parameters else {}
        inputs.append(Tensor(t.name, datatype, shape, data, params))
    outputs = None
    if msg.outputs:
        outputs = [RequestedOutput(o.name, None, {k: param_value(v) for k, v in o.parameters.items()})
                   for o in msg.outputs]
    params = {k: param_value(v) for k, v in msg.parameters.items()} if msg.parameters else {}
    request_id = check_request_id(msg.id, "'id'")
    return InferenceRequest(msg.model_name, msg.model_version, inputs, request_id, outputs, params)


def _from_contents(t: Any, datatype: DataType, shape: tuple[int, ...]) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise invalid(f"input '{t.name}': {datatype.value} data must be sent in raw_input_contents")
    values = getattr(t.contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise invalid(f"input '{t.name}': shape {list(shape)} needs {count} elements, "
                      f"contents has {len(values)}")
    if datatype is DataType.BYTES:
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        limit = wire_limits().max_bytes_element
        for i, v in enumerate(arr):
            if len(v) > limit:
                check_bytes_element(t.name, i, len(v))
        return arr.reshape(shape)
    try:
        return np.array(values, dtype=datatype.numpy_dtype).reshape(shape)
    except OverflowError:
        raise invalid(f"input '{t.name}': a value is out of range for {datatype.value}") from None


def _response_head(response: InferenceResponse) -> pb.ModelInferResponse:
    """Everything of the response but its id and tensor bytes."""
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version)
    for tensor in response.outputs:
        out = msg.outputs.add()
        out.name = tensor.name
        out.datatype = tensor.datatype.value
        out.shape.extend(tensor.shape)
    return msg


# ------------------------------------------------------------------------------------- the wire fast path

_ID_TAG = 0x1A  # field 3 (id), wire type 2, in both ModelInferRequest and ModelInferResponse
_PARAMETERS_TAG = 0x22  # ModelInferRequest field 4, parameters (one map entry each)
_RAW_INPUT_TAG = 0x3A  # ModelInferRequest field 7, raw_input_contents
_RAW_OUTPUT_TAG = 0x32  # ModelInferResponse field 6, raw_output_contents
_STREAM_RESPONSE_TAG = 0x12  # ModelStreamInferResponse field 2, infer_response
# The `parameters` field of a ModelInferResponse holding triton_final_response: true, serialized once: every
# answer on a stream carries it, as Triton's do for a non-decoupled model (server
# src/grpc/stream_infer_handler.cc StreamInferResponseComplete).
_FINAL_PARAMETER = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=True)}).SerializeToString()
# ... and false, on a decoupled model's responses before its last.
_NOT_FINAL_PARAMETER = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=False)}).SerializeToString()


def response_parameters(params: dict[str, Any]) -> bytes:
    """The serialized `parameters` field of a ModelInferResponse holding `params`, each in the
    InferParameter field Triton uses for its type (bool, int64, double, string)."""
    msg = pb.ModelInferResponse()
    for key, value in params.items():
        param = msg.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
            param.int64_param = value
        elif isinstance(value, int) and 0 <= value < (1 << 64):
            param.uint64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)
    return msg.SerializeToString()


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    """(value, position after it); raises IndexError past the end, ValueError past 10 bytes."""
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def field_head(tag: int, length: int) -> bytes:
    """The tag and length that open a length-delimited field of `length` bytes."""
    if length < 0x80:
        return bytes((tag, length))
    out = bytearray((tag,))
    while length > 0x7F:
        out.append(length & 0x7F | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out)


def split_infer_request(message: Any) -> tuple[bytes, Any, list[Any]] | None:
    """A serialized ModelInferRequest cut into (key, id bytes, raw_input_contents views), or None when some
    top-level field is not a length-delimited field with a one-byte tag (unknown fields, malformed bytes):
    the caller then parses it in full, which also gives the error for malformed ones."""
    view = memoryview(message)
    pos, end = 0, len(view)
    key: list[Any] = []
    # the key's fields as runs of adjacent bytes: an encoder writes fields in number order, so the key is
    # usually one run (model name, inputs, outputs) and one slice, not a slice per field
    run_start = run_stop = 0
    raw: list[Any] = []
    request_id: Any = b""
    try:
        while pos < end:
            tag = view[pos]
            if tag & 0x87 != 2:  # not wire type 2, or a tag longer than one byte
                return None
            length = view[pos + 1]
            if length < 0x80:
                start = pos + 2
            else:
                length, start = _varint(view, pos + 1)
            stop = start + length
            if stop > end:
                return None
            if tag == _RAW_INPUT_TAG:
                raw.append(view[start:stop])
            elif tag == _ID_TAG:
                request_id = view[start:stop]
            elif pos == run_stop:
                run_stop = stop
            else:
                if run_stop > run_start:
                    key.append(view[run_start:run_stop])
                run_start, run_stop = pos, stop
            pos = stop
    except (IndexError, ValueError):
        return None
    if not key:
        return view[run_start:run_stop].tobytes(), request_id, raw
    key.append(view[run_start:run_stop])
    return b"".join(key), request_id, raw


class _WirePlan(RequestPlan):
    """A decoded request minus its id and tensor bytes. Shared by requests: never mutated but for the
    model's verdict (RequestPlan)."""

    __slots__ = ("inputs", "model_name", "model_version", "outputs", "params")

    def __init__(self, request: InferenceRequest) -> None:
        super().__init__()
        self.model_name = request.model_name
        self.model_version = request.model_version
        # Per input: what array_from_bytes would check and build, worked out once.
        self.inputs = [(t.name, t.datatype, t.shape, t.parameters, t.datatype.numpy_dtype,
                        element_count(t.shape) * t.datatype.itemsize) for t in request.inputs]
        self.outputs = request.outputs
        self.params = request.parameters


class _ResponseHead:
    """A cached response head: the serialized fields before the tensor bytes, and per output the byte length
    its shape and datatype give with the `raw_output_contents` tag and length for it (BYTES: -1, never
    matched)."""

    __slots__ = ("head", "prefixes")

    def __init__(self, head: bytes, outputs: list[Tensor]) -> None:
        self.head = head
        self.prefixes: list[tuple[int, bytes]] = []
        for t in outputs:
            length = element_count(t.shape) * t.datatype.itemsize if t.datatype.itemsize else -1
            self.prefixes.append((length, field_head(_RAW_OUTPUT_TAG, max(length, 0))))


class InferWireCodec:
    """ModelInfer on serialized bytes: decoded plans cached by request key, serialized response heads by
    model, version and output names, datatypes and shapes. One per server. Bounded, so a client sending
    endless distinct requests cannot grow it."""

    MAX_ENTRIES = 1024
    MAX_KEY_BYTES = 8192

    def __init__(self) -> None:
        self.plans: BoundedCache[bytes, _WirePlan] = BoundedCache(self.MAX_ENTRIES, self.MAX_KEY_BYTES)
        self.heads: BoundedCache[Any, _ResponseHead] = BoundedCache(self.MAX_ENTRIES)

    def decode(self, message: Any) -> InferenceRequest:
        """Raises EngineError for a request the protocol or the engine refuses, DecodeError for bytes that
        are not a ModelInferRequest. A plan is made only by a full decode that succeeded, and its key holds
        the typed `contents` of every input, so a request the full decode refuses (raw and typed contents
        together) never finds one."""
        cut = split_infer_request(message)
        if cut is not None:
            key, request_id, raw = cut
            plan = self.plans.get(key)
            if plan is not None and len(raw) == len(plan.inputs):
                try:
                    rid = str(request_id, "utf-8") if request_id else ""
                except UnicodeDecodeError:
                    pass  # the full parse refuses it, as protobuf does
                else:
                    return _from_plan(plan, check_request_id(rid, "'id'"), raw)
        request = decode_request(pb.ModelInferRequest.FromString(message))
        if len(request.parameters) > 1:  # a cached plan keeps this order: the hot path pays nothing
            request.parameters = in_wire_order(message, request.parameters)
        if cut is not None and cut[2]:
            # Only raw-content requests: typed contents are data, in the key, different every time.
            self.plans.put(cut[0], _WirePlan(request))
        return request

    def encode(self, response: InferenceResponse) -> tuple[list[Any], int]:
        """The serialized ModelInferResponse as (parts, total length), the tensor bytes not copied. Runs for
        every answer, so its loops are spelled out (no comprehension or helper call per output where the
        output is a contiguous array of its datatype, as a model's outputs are)."""
        outputs = response.outputs
        chunks: list[Any] = []
        described = []
        for t in outputs:
            arr, datatype = t.data, t.datatype
            if datatype.itemsize and arr.dtype == datatype.numpy_dtype and arr.size and \
                    arr.flags.c_contiguous:
                chunks.append(arr.data.cast("B"))  # what array_to_bytes returns for it
            else:
                chunks.append(array_to_bytes(arr, datatype))
            described.append((t.name, datatype, t.shape))
        key = (response.model_name, response.model_version, tuple(described))
        cached = self.heads.get(key)
        if cached is None:
            cached = self.heads.put(key, _ResponseHead(_response_head(response).SerializeToString(), outputs))
        head = cached.head
        parts: list[Any] = [head]
        size = len(head)
        if response.id:
            rid = response.id.encode("utf-8")
            tagged = field_head(_ID_TAG, len(rid)) + rid
            parts.append(tagged)
            size += len(tagged)
        for chunk, (length, prefix) in zip(chunks, cached.prefixes, strict=True):
            if len(chunk) != length:  # BYTES, whose length the shape does not tell
                prefix = field_head(_RAW_OUTPUT_TAG, len(chunk))
            parts.append(prefix)
            parts.append(chunk)
            size += len(prefix) + len(chunk)
        if response.parameters:  # set by a Python model's InferenceResponse(parameters=...): rare, not cached
            serialized = response_parameters(response.parameters)
            parts.append(serialized)
            size += len(serialized)
        return parts, size

    def encode_stream(self, response: InferenceResponse, final: bool = True) -> tuple[list[Any], int]:
        """The serialized ModelStreamInferResponse carrying `response`, flagged `triton_final_response`, as
        (parts, total length)."""
        parts, size = self.encode(response)
        flag = _FINAL_PARAMETER if final else _NOT_FINAL_PARAMETER
        parts.append(flag)
        size += len(flag)
        head = field_head(_STREAM_RESPONSE_TAG, size)
        return [head, *parts], len(head) + size


def _skip_field(view: Any, pos: int, wire_type: int) -> int:
    """The position after a field's value that starts at `pos`; ValueError for the group wire types."""
    if wire_type == 0:
        return _varint(view, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == 5:
        return pos + 4
    if wire_type == 2:
        length, pos = _varint(view, pos)
        return pos + length
    raise ValueError("group wire type")


def _entry_key(entry: Any) -> str | None:
    """The key (field 1) of one serialized map entry; None when it has none."""
    pos, key = 0, None
    while pos < len(entry):
        tag, pos = _varint(entry, pos)
        if tag == 0x0A:
            length, pos = _varint(entry, pos)
            key = str(entry[pos:pos + length], "utf-8")
            pos += length
        else:
            pos = _skip_field(entry, pos, tag & 7)
    return key


def in_wire_order(message: Any, params: dict[str, Any]) -> dict[str, Any]:
    """`params` (as the protobuf map gave them: upb orders a map by hash) in the order their entries came
    on the wire, as Triton hands them to a Python model (`request.parameters()`). A key keeps the place of its
    first entry and the map's value (the last). `params` unchanged for bytes that do not scan."""
    view = memoryview(message)
    order: dict[str, Any] = {}
    pos, end = 0, len(view)
    try:
        while pos < end:
            tag = view[pos]
            if tag < 0x80 and tag & 7 == 2 and view[pos + 1] < 0x80:  # a one-byte tag and length
                start = pos + 2
                stop = start + view[pos + 1]
            else:
                tag, start = _varint(view, pos)
                stop = _skip_field(view, start, tag & 7)
                if tag & 7 == 2:
                    start = _varint(view, start)[1]
            if tag == _PARAMETERS_TAG:
                if view[start] == 0x0A and view[start + 1] < 0x80:  # the key first, as every encoder writes
                    key: str | None = str(view[start + 2:start + 2 + view[start + 1]], "utf-8")
                else:
                    key = _entry_key(view[start:stop])
                if key in params and key not in order:
                    order[key] = params[key]
            pos = stop
    except (IndexError, ValueError, UnicodeDecodeError):
        return params
    return order if len(order) == len(params) else params


def _from_plan(plan: _WirePlan, request_id: str, raw: list[Any]) -> InferenceRequest:
    inputs = []
    for (name, datatype, shape, params, dtype, size), data in zip(plan.inputs, raw, strict=True):
        if size and len(data) == size:  # fixed-size datatype, the expected byte count: a view, no checks left
            array = np.frombuffer(data, dtype=dtype).reshape(shape)
        else:  # BYTES, empty tensors, or the wrong size: the full path builds the array or the error
            array = array_from_bytes(name, datatype, shape, data)
        inputs.append(Tensor(name, datatype, shape, array, params))
    return InferenceRequest(plan.model_name, plan.model_version, inputs, request_id, plan.outputs,
                            plan.params, plan)
