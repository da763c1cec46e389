"""The nouns every stage shares: datatypes, tensors, requests and responses.

Tensor data is always a numpy array. BYTES tensors are object arrays of `bytes`; BF16 tensors travel as
`uint16` arrays holding the raw bfloat16 bits, because numpy has no bfloat16 type.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EngineError, invalid

if TYPE_CHECKING:  # an annotation only: the load tester shares this module and loads no server stage
    from .streaming.window import StreamWindow


class DataType(enum.Enum):
    """A protocol datatype. The value is the KServe v2 name (`"FP32"`)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    # Set on each member below: `numpy_dtype`, and `itemsize` (bytes per element on the wire; 0 for BYTES,
    # whose elements are length-prefixed). Plain attributes, because they are read on every request and an
    # Enum-keyed dict lookup hashes through Python code.
    numpy_dtype: np.dtype
    itemsize: int

    # Members are singletons compared by identity (a plain Enum, no str mixin), so the identity hash agrees
    # with equality; Enum's own `__hash__` is Python code (`hash(self._name_)`), run wherever a datatype is
    # part of a key: the gRPC response-head cache hashes one per output of every answer.
    __hash__ = object.__hash__

    @property
    def config_name(self) -> str:
        """The model-config spelling: `TYPE_FP32`, `TYPE_STRING` for BYTES."""
        return "TYPE_STRING" if self is DataType.BYTES else f"TYPE_{self.value}"

    @classmethod
    def from_v2(cls, name: str) -> DataType:
        dt = _FROM_V2.get(name)
        if dt is not None:
            return dt
        expected = ", ".join(d.value for d in cls)
        raise invalid(f"unknown datatype '{name}'; expected one of {expected}") from None

    @classmethod
    def from_config(cls, name: str) -> DataType:
        dt = _FROM_CONFIG.get(name)
        if dt is None:
            raise invalid(f"unsupported data_type '{name}'")
        return dt

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DataType:
        if dtype.kind in "OSU":
            return cls.BYTES
        dt = _FROM_NUMPY.get(np.dtype(dtype))
        if dt is None:
            raise invalid(f"numpy dtype {dtype} has no protocol datatype")
        return dt


_NUMPY: dict[DataType, np.dtype] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BYTES: np.dtype(np.object_),
    DataType.BF16: np.dtype(np.uint16),
}
for _dt, _np in _NUMPY.items():
    _dt.numpy_dtype = _np
    _dt.itemsize = 0 if _dt is DataType.BYTES else _np.itemsize
_FROM_CONFIG = {dt.config_name: dt for dt in DataType}
_FROM_V2 = {dt.value: dt for dt in DataType}  # a dict lookup is far cheaper than Enum's constructor
_FROM_NUMPY = {v: k for k, v in _NUMPY.items() if k not in (DataType.BYTES, DataType.BF16)}


# Tensor parameters of Triton's shared-memory extensions (server docs/protocol/extension_shared_memory.md). A
# codec keeps them on the tensor, with no data, so the model refuses them once for every protocol.
SHARED_MEMORY_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def in_shared_memory(parameters: Any) -> bool:
    """Whether a tensor's parameters (a dict or a protobuf map) place its data in a shared-memory region."""
    return "shared_memory_region" in parameters


@dataclass(slots=True)
class Tensor:
    """A named tensor. `data` has exactly `shape` and the numpy dtype of `datatype`."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for by name; `binary_data` is the HTTP binary-extension preference."""

    name: str
    binary_data: bool | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


class RequestPlan:
    """A frontend's cached decoding of a request's header (the HTTP codec's HeaderCache, the gRPC wire
    codec's plans), shared by every request that repeats it: names, datatypes, shapes, outputs, parameters.

    It also carries the model's verdict on it: `validated` is (a model version's `plan_key`, what that
    version's `Model.prepare()` worked out for this header), set by `prepare()` after a full validation, so
    a repeated request is not validated again by the same version; another version (a reload) validates
    it afresh. Only the model writes it; the frontend's own fields are never mutated."""

    __slots__ = ("validated",)

    def __init__(self) -> None:
        self.validated: tuple[object, Any] | None = None


@dataclass(slots=True)
class InferenceRequest:
    """One decoded request. Created by a frontend codec, validated by the model, owned by the batcher
    from `submit()` until its future resolves."""

    model_name: str
    model_version: str  # "" = the router picks (highest ready version)
    inputs: list[Tensor]
    id: str = ""
    outputs: list[RequestedOutput] | None = None  # None = every output
    parameters: dict[str, Any] = field(default_factory=dict)
    plan: RequestPlan | None = None  # the frontend's cached decoding of this request's header, if any
    # The owner id of the API key that sent it (engine/access/api_keys.py `owner_id`; "" on a server without
    # keys), set by the frontend from the access policy's admission, on every path: whose client
    # shared-memory regions it may use, whose share of a sequence backlog it takes and whose tokens_per_minute
    # a generation charges (generate/triton/model.py) (engine/access/caller.py). Never taken from the
    # request's own fields or parameters.
    owner: str = ""
    # Set by whoever streams the answer (engine/streaming/responses.py, the gRPC stream, a frontend's
    # session): where a decoupled model's responses before its final one go, on the loop, in order (an
    # EngineError for an error response, after which more may follow). None: the request wants exactly one
    # response, and a decoupled model refuses it.
    stream: StreamSink | None = None
    # Set with `stream` by a consumer that counts what its client took (engine/streaming/window.py): a
    # decoupled model's sends wait while RESPONSE_WINDOW of this request's responses are not yet taken. None:
    # no wait.
    stream_window: StreamWindow | None = None
    # When it met the batcher (perf_counter ns; 0 = not reached), set only while an access line or a trace may
    # want them (engine/observability/observe.py): entered the queue, its batch left it, its batch's outputs
    # were split; and the elements of the batch it ran in.
    queued_ns: int = 0
    dispatched_ns: int = 0
    computed_ns: int = 0
    executed_batch: int = 0

    @property
    def batch_size(self) -> int:
        """The leading dimension, meaningful only for models with max_batch_size > 0."""
        return self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


# What a decoupled request's future resolves with when its model sent the final flag without a response
# (Triton's empty final response). Compared by identity; never encoded as an answer.
EMPTY_FINAL = InferenceResponse("", "", [])

StreamSink = Callable[["InferenceResponse | EngineError"], None]

# A frontend's answer to a request: called once, with the request's future, when that is done (resolved,
# failed or cancelled), right after the request was accounted (Batcher.enqueue).
Completion = Callable[["asyncio.Future[InferenceResponse]"], None]


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
