"""The helper functions of `triton_python_backend_utils`: lookups by name and datatype conversions.

Part of pb_utils (which re-exports every name here); kept apart so each module reads in one sitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .pb_utils import InferenceRequest, InferenceResponse, Tensor

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# TRITONSERVER_DataType numbers (Tensor.triton_dtype), by KServe v2 name.
_TRITON_DTYPE = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
                 "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14}
_NUMPY_TO_V2 = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16",
                np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64", np.dtype(np.int8): "INT8",
                np.dtype(np.int16): "INT16", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
                np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64"}


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return _named(inference_request.inputs(), name)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return _named(inference_response.output_tensors(), name)


def _named(tensors: Sequence[Tensor], name: str) -> Tensor | None:
    for tensor in tensors:
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_named(model_config.get("input", ()), name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_named(model_config.get("output", ()), name)


def _config_named(entries: Any, name: str) -> dict[str, Any] | None:
    for entry in entries:
        if entry.get("name") == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


_BY_NUMBER = {n: v2 for v2, n in _TRITON_DTYPE.items()}


def triton_to_numpy_type(data_type: int) -> Any:
    v2 = _BY_NUMBER.get(data_type)
    if v2 is None or v2 == "BF16":
        return None
    return TRITON_STRING_TO_NUMPY["TYPE_STRING" if v2 == "BYTES" else f"TYPE_{v2}"]


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return _TRITON_DTYPE["BYTES"]
    name = _NUMPY_TO_V2.get(dtype)
    return None if name is None else _TRITON_DTYPE[name]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """BYTES elements in Triton's wire form (4-byte little-endian length, then the bytes), as uint8."""
    if input_tensor.size == 0:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    data = bytes(encoded_tensor)
    out, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 4], "little")
        offset += 4
        out.append(data[offset:offset + length])
        offset += length
    return np.array(out, dtype=np.object_)
