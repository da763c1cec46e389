"""ModelInferRequest / ModelInferResponse ↔ engine types.

Inputs arrive as `raw_input_contents` (one entry per input, in order) or typed `contents`; outputs always
leave as `raw_output_contents`, one entry per output in order (perf_analyzer crashes on typed contents).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import invalid
from ..proto import grpc_service_pb2 as pb
from ..types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor, element_count
from .wire import array_from_bytes, array_to_bytes, check_datatype, check_shape

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
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise invalid(f"request has {len(msg.inputs)} inputs but {len(raw)} raw_input_contents entries")
    inputs = []
    for i, t in enumerate(msg.inputs):
        datatype = check_datatype(t.name, t.datatype)
        shape = check_shape(t.name, list(t.shape))
        if raw:
            data = array_from_bytes(t.name, datatype, shape, raw[i])
        else:
            data = _from_contents(t, datatype, shape)
        params = {k: param_value(v) for k, v in t.parameters.items()} if t.parameters else {}
        inputs.append(Tensor(t.name, datatype, shape, data, params))
    outputs = None
    if msg.outputs:
        outputs = [RequestedOutput(o.name, None, {k: param_value(v) for k, v in o.parameters.items()})
                   for o in msg.outputs]
    params = {k: param_value(v) for k, v in msg.parameters.items()} if msg.parameters else {}
    return InferenceRequest(msg.model_name, msg.model_version, inputs, msg.id, outputs, params)


def _from_contents(t: Any, datatype: DataType, shape: tuple[int, ...]) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise invalid(f"input '{t.name}': {datatype.value} data must be sent in raw_input_contents")
    values = getattr(t.contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise invalid(f"input '{t.name}': shape {list(shape)} needs {count} elements, contents has {len(values)}")
    if datatype is DataType.BYTES:
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    try:
        return np.array(values, dtype=datatype.numpy_dtype).reshape(shape)
    except OverflowError:
        raise invalid(f"input '{t.name}': a value is out of range for {datatype.value}") from None


def encode_response(response: InferenceResponse) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                id=response.id)
    raw = msg.raw_output_contents
    for tensor in response.outputs:
        out = msg.outputs.add()
        out.name = tensor.name
        out.datatype = tensor.datatype.value
        out.shape.extend(tensor.shape)
        raw.append(bytes(array_to_bytes(tensor.data, tensor.datatype)))
    return msg
