"""`triton_python_backend_utils`: the API a Triton Python model imports, as hubserve serves it.

A model does `import triton_python_backend_utils as pb_utils`; runner.py binds that name to this module before
it imports a model, so models written for Triton run unchanged. The surface follows Triton's Python backend
(python_backend README, and what its stub binds): `Tensor`, `InferenceRequest` (also the BLS request a model
builds, with `exec()` / `async_exec()`), `InferenceResponse`, `TritonError` with Triton's codes,
`TritonModelException`, `Logger`, the lookup helpers and the auto-complete `ModelConfig` (pb_config.py).

Runs wherever the model runs: in its instance process (stub.py) or, for a model that opts into running
in-process, on its instance thread in the server. Imports only numpy and the standard library (plus engine
modules that do the same), so it also loads in a model's own EXECUTION_ENV_PATH venv.

BLS requests leave through the `Transport` of the current context (`set_transport`): the stub's channel to
the engine, or the in-process instance's hand-off to the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from .pb_config import ModelConfig
from .pb_helpers import (
    _NUMPY_TO_V2,
    _TRITON_DTYPE,
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)

# TRITONSERVER_Error_Code values, as the stub binds them on TritonError.
_CODES = {"UNKNOWN": 0, "INTERNAL": 1, "NOT_FOUND": 2, "INVALID_ARG": 3, "UNAVAILABLE": 4, "UNSUPPORTED": 5,
          "ALREADY_EXISTS": 6, "CANCELLED": 7}
CODE_NAMES = {v: k for k, v in _CODES.items()}

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

class TritonModelException(Exception):
    """What a model raises to fail the whole batch (Triton's name)."""


class TritonError:
    """An error for one response (`InferenceResponse(error=...)`), or the error of a BLS response."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if code not in CODE_NAMES:
            raise TritonModelException(f"TritonError code {code!r} is not one of Triton's codes")
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {CODE_NAMES[self._code]})"


def v2_datatype(array: np.ndarray) -> str:
    """The KServe v2 datatype of a numpy array a model hands back (BYTES for object and bytes arrays)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _NUMPY_TO_V2.get(array.dtype)
    if name is None:
        raise TritonModelException(f"numpy dtype {array.dtype} has no Triton datatype")
    return name


class _Capsule:
    """Lets numpy import a bare DLPack capsule (numpy wants an object with __dlpack__). A capsule does not say
    its device before it is consumed: numpy refuses one that is not on the CPU (`Tensor.from_dlpack`)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)


# DLPack's device types (dlpack.h DLDeviceType) a model's tensors may report, by the names in its messages.
KDL_CPU = 1
_DLPACK_DEVICES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                   10: "ROCm", 13: "CUDA managed", 14: "oneAPI"}
NO_GPU_TENSORS = ("hubserve serves Python models' tensors from host memory only: its path for tensors on a "
                  "GPU (Triton's CUDA outputs and BLS tensors) has not yet passed a device run, so it is not "
                  "available; copy the tensor to the host first (PyTorch: .cpu(), CuPy: cupy.asnumpy())")


def _device_of(source: Any, name: str) -> tuple[int, int]:
    """`(device type, device id)` from the object's `__dlpack_device__`, CPU when it has none."""
    report = getattr(source, "__dlpack_device__", None)
    if report is None:
        return (KDL_CPU, 0)
    try:
        kind, device = report()
        return int(kind), int(device)
    except Exception as e:
        raise TritonModelException(f"Tensor.from_dlpack: '{name}' has a __dlpack_device__ that failed: "
                                   f"{type(e).__name__}: {e}") from None


class Tensor:
    """A named tensor over a numpy array. BYTES tensors are object arrays of `bytes`, as in Triton. Input
    tensors of an isolated instance are views over the shared memory the engine wrote: read them during
    `execute`, copy what must outlive it."""

    __slots__ = ("_array", "_datatype", "_name")

    def __init__(self, name: str, data: Any, datatype: str = "") -> None:
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind == "U":  # numpy str arrays: BYTES as UTF-8, as Triton serializes them
            array = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(array) if array.size \
                else array.astype(object)
        self._name = str(name)
        self._array = array
        self._datatype = datatype or v2_datatype(array)

    @staticmethod
    def _of(name: str, array: np.ndarray, datatype: str) -> Tensor:
        """hubserve's, for the tensors it hands a model (inputs, BLS outputs): `array` and `datatype` are
        already what the engine checked and the channel read, so none of `__init__`'s conversion applies
        (measured: ~1 µs less per input tensor in the instance process, perf/history/pipelines.md)."""
        tensor = object.__new__(Tensor)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int:
        return _TRITON_DTYPE[self._datatype]

    def datatype(self) -> str:
        """The KServe v2 name ('FP32'); hubserve's addition, handy in messages."""
        return self._datatype

    def is_cpu(self) -> bool:
        """Always True here: every tensor hubserve gives or takes is in host memory (`NO_GPU_TENSORS`), as
        Triton's with FORCE_CPU_ONLY_INPUT_TENSORS left at its default."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the tensor's memory (a copy for a read-only array), kDLCPU device 0."""
        return self._exportable().__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._exportable().__dlpack__(**kwargs)

    def _exportable(self) -> np.ndarray:
        """DLPack cannot say "read-only": such an array is exported as a copy."""
        return self._array if self._array.flags.writeable else self._array.copy()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A Tensor over any DLPack producer (an object with `__dlpack__`: numpy, PyTorch, CuPy, JAX) or a
        bare capsule, sharing its memory where the producer allows (numpy copies nothing for a CPU tensor);
        dtype and shape are kept. A tensor on a device other than the CPU is refused with the reason, before
        anything is consumed: TritonModelException, which fails the request with Triton's error form."""
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        kind, device = _device_of(source, name)
        if kind != KDL_CPU:
            where = _DLPACK_DEVICES.get(kind, f"DLPack device type {kind}")
            raise TritonModelException(f"Tensor.from_dlpack: '{name}' is on {where} device {device}; "
                                       f"{NO_GPU_TENSORS}")
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise TritonModelException(f"Tensor.from_dlpack: '{name}' cannot be read through DLPack: {e}") \
                from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, {self.shape()})"


class Transport:
    """How BLS requests reach the engine from the current context: `submit` returns a future of the
    `InferenceResponse` (never raises: a failure is a response with an error)."""

    def submit(self, request: InferenceRequest) -> Future[InferenceResponse]:
        raise NotImplementedError


_local = threading.local()
_default: list[Transport | None] = [None]


def set_transport(transport: Transport | None, thread_only: bool = False) -> None:
    """Called by hubserve, not by models: the stub sets its channel for the whole process; an in-process
    instance sets its hand-off for its own thread only."""
    if thread_only:
        _local.transport = transport
    else:
        _default[0] = transport


def _transport() -> Transport:
    transport = getattr(_local, "transport", None) or _default[0]
    if transport is None:
        raise TritonModelException("BLS requests can be made only from execute(), not initialize() or "
                                   "finalize()")
    return transport


class InferenceRequest:
    """A request given to `execute`, or one a model builds to call another model (BLS)."""

    def __init__(self, request_id: str = "", correlation_id: int | str = 0,
                 inputs: Sequence[Tensor] | None = None, requested_output_names: Sequence[str] | None = None,
                 model_name: str = "", model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: Any = None, trace: Any = None, parameters: Any = None) -> None:
        if inputs is None or requested_output_names is None:
            raise TypeError("InferenceRequest needs inputs and requested_output_names")
        if not isinstance(correlation_id, (int, str, bytes)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        # Strings may come as bytes (a name read from a BYTES input), which Triton's binding accepts too.
        self._id = _text(request_id)
        self._correlation_id = _text(correlation_id) if isinstance(correlation_id, bytes) else correlation_id
        self._inputs = list(inputs)
        self._outputs = [_text(n) for n in requested_output_names]
        self.model_name = _text(model_name)
        self.model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        if isinstance(parameters, str):
            self._parameters = parameters
        else:
            params = parameters or {}
            for key, value in params.items():
                if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
                    raise TritonModelException("request parameters must map str keys to bool, int or str "
                                               f"values; got {key!r}: {type(value).__name__}")
            self._parameters = compact_json(params)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def parameters(self) -> str:
        """The request's parameters as compact JSON, in the order sent ("{}" when none)."""
        return self._parameters

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        """The BLS timeout in microseconds (0: none)."""
        return self._timeout

    def is_cancelled(self) -> bool:
        """True once the client of a decoupled model's request has gone (its stream closed or reset)."""
        sender = getattr(self, "_sender", None)
        return sender is not None and sender.is_cancelled()

    def trace(self) -> Any:
        return _NoTrace()

    def get_response_sender(self) -> InferenceResponseSender:
        sender = getattr(self, "_sender", None)
        if sender is None:
            raise TritonModelException("hubserve serves the response sender to decoupled models only "
                                       "(model_transaction_policy { decoupled: true }); return one "
                                       "InferenceResponse per request from execute()")
        return sender  # type: ignore[no-any-return]

    def set_release_flags(self, flags: int) -> None:
        raise TritonModelException("hubserve does not support request rescheduling (set_release_flags)")

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on `model_name` through the engine and wait for its response (BLS)."""
        self._check_bls(decoupled)
        return _transport().submit(self).result()

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[InferenceResponse]:
        """`exec` without waiting: an awaitable for the response; call it from `async def execute`."""
        self._check_bls(decoupled)
        return asyncio.wrap_future(_transport().submit(self))

    def _check_bls(self, decoupled: bool) -> None:
        if decoupled:
            raise TritonModelException("hubserve does not serve BLS calls to decoupled models yet: call "
                                       "exec() or async_exec() without decoupled=True, on a model that is "
                                       "not decoupled")
        if not self.model_name:
            raise TritonModelException("a BLS request needs model_name")


compact_json = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(..., separators=...) alike


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class _NoTrace:
    def get_context(self) -> None:
        return None


class InferenceResponse:
    """What `execute` returns for one request: output tensors, or an error."""

    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None,
                 parameters: Any = None) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        if isinstance(parameters, str):
            self._parameters = parameters
        else:  # most responses have none: "{}" without the encoder (json.dumps with separators makes one)
            self._parameters = compact_json(parameters) if parameters else "{}"

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class ResponseSink:
    """Where a decoupled request's sends go (set by hubserve, not by models): the instance process's channel
    to the engine, or an in-process instance's hand-off to the event loop."""

    def send(self, key: int, response: InferenceResponse | None, final: bool) -> None:
        raise NotImplementedError

    def is_cancelled(self, key: int) -> bool:
        raise NotImplementedError


class InferenceResponseSender:
    """A decoupled request's sender (`request.get_response_sender()`): 0..N responses, then the final flag,
    from `execute` or from any thread of the model, before or after `execute` returned. Thread-safe."""

    def __init__(self, key: int, sink: ResponseSink) -> None:
        self._key = key
        self._sink = sink
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags "
                                       "is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"send() takes a pb_utils.InferenceResponse, got "
                                       f"{type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:  # the check and the send together, so two threads cannot both send a final
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._sink.send(self._key, response, final)

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled(self._key)

    def close(self) -> None:
        """hubserve's: execute failed, the engine answered the request with that error; sends now raise."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


class Logger:
    """Triton's model logger: lines go to hubserve's log, named after the model instance."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        logging.getLogger(_logger_name[0]).log(level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, logging.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, logging.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, logging.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, logging.DEBUG)


_logger_name = ["hubserve.python"]


def set_logger_name(name: str) -> None:
    """Called by the stub: the instance's log lines carry its name."""
    _logger_name[0] = name


def make_request(inputs: list[Tensor], requested: list[str], request_id: str, correlation_id: int | str,
                 flags: int, parameters: str, sender: InferenceResponseSender | None = None
                 ) -> InferenceRequest:
    """A request for `execute`, as hubserve builds it (no model name: it is not a BLS request); `sender` for
    a decoupled model's. The values are the engine's, already typed (the stub's come through messages.py's
    checked `RequestHeader`), and `requested` is the request's own list: none of `InferenceRequest.__init__`'s
    checks or copies applies, so they are skipped (it ran for every request of every batch)."""
    if type(correlation_id) is not int and type(correlation_id) is not str:  # e.g. a bool: the checks apply
        request = InferenceRequest(request_id, correlation_id, inputs, requested, "", -1, flags, 0,
                                   parameters=parameters)
        request._sender = sender  # type: ignore[attr-defined]
        return request
    request = InferenceRequest.__new__(InferenceRequest)
    request._id = request_id
    request._correlation_id = correlation_id
    request._inputs = inputs
    request._outputs = requested
    request.model_name = ""
    request.model_version = -1
    request._flags = flags
    request._timeout = 0
    request._parameters = parameters
    request._sender = sender  # type: ignore[attr-defined]
    return request


__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY", "InferenceRequest", "InferenceResponse",
    "InferenceResponseSender",
    "Logger", "ModelConfig", "Tensor", "TritonError", "TritonModelException", "deserialize_bytes_tensor",
    "get_input_config_by_name", "get_input_tensor_by_name", "get_output_config_by_name",
    "get_output_tensor_by_name", "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy",
    "triton_to_numpy_type", "using_decoupled_model_transaction_policy",
]
