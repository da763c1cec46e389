"""The gRPC services' per-RPC logic, apart from the transport: a parsed request message in, a response
message out (or an `EngineError`); for ModelInfer and ModelStreamInfer, serialized bytes in and out
(codec.py's wire codec). The h2 frontend (`h2/`) calls `GrpcHandlers` for every RPC it serves.

`STATUS` is the one table from `ErrorCode` to gRPC status codes, as the numbers the protocol puts on the wire
(`grpc-status`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from mypy_extensions import mypyc_attr

from ...access.caller import NOBODY, Caller
from ...dataplane import DataPlane
from ...errors import EngineError, ErrorCode, invalid, not_found, unserved_extension
from ...observability import logs, observe
from ...observability.tracing import settings as trace_settings
from ...proto import grpc_service_pb2, health_pb2
from ...shm import cuda as cuda_shm
from ...streaming.window import StreamWindow
from ...types import EMPTY_FINAL, Completion, InferenceRequest, InferenceResponse
from ..engine import Engine
from .codec import InferWireCodec, param_value

log = logging.getLogger("hubserve.grpc")

# The generated modules carry no type information: their messages are typed Any here.
pb: Any = grpc_service_pb2
health: Any = health_pb2


class GrpcStatus(enum.IntEnum):
    """gRPC status codes as numbers (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


STATUS: dict[ErrorCode, GrpcStatus] = {
    ErrorCode.INVALID_ARG: GrpcStatus.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: GrpcStatus.NOT_FOUND,
    ErrorCode.UNAVAILABLE: GrpcStatus.UNAVAILABLE,
    ErrorCode.RESOURCE_EXHAUSTED: GrpcStatus.UNAVAILABLE,  # a full queue: the client may retry
    ErrorCode.UNSUPPORTED: GrpcStatus.UNIMPLEMENTED,
    # Refused by the server's configuration (client shared memory off): the method exists, so
    # not UNIMPLEMENTED; HTTP answers 400, and FAILED_PRECONDITION is the code google.rpc.Code maps to 400
    # for a well-formed request the server's state refuses.
    ErrorCode.NOT_ENABLED: GrpcStatus.FAILED_PRECONDITION,
    ErrorCode.ALREADY_EXISTS: GrpcStatus.ALREADY_EXISTS,
    ErrorCode.CANCELLED: GrpcStatus.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: GrpcStatus.DEADLINE_EXCEEDED,
    ErrorCode.INTERNAL: GrpcStatus.INTERNAL,
}

# RPCs of inference.GRPCInferenceService that hubserve answers with UNIMPLEMENTED, by the extension they
# belong to (Triton's names, core src/server.cc); HTTP answers their endpoints with 501
# (http/routes.py _UNSERVED).
UNIMPLEMENTED_RPCS: dict[str, str] = {}  # every RPC of the protocol is served

# How a ModelStreamInfer request is answered: with its future, and the serialized answer as (parts, size),
# None when there is nothing to send (cancelled, or a decoupled model's final flag alone while the client
# did not ask for empty final responses), or a bug's exception.
StreamAnswer = tuple[list[Any], int] | BaseException | None
StreamAnswered = Callable[["asyncio.Future[InferenceResponse]", StreamAnswer], None]
# A decoupled model's response before its last, serialized as (parts, size): sent on the stream at once.
StreamPartial = Callable[[tuple[list[Any], int]], None]


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class GrpcHandlers:
    """One per server, shared by every connection. Methods named after a unary RPC take its request message
    and return its response message, or an awaitable of it for RPCs that wait (load, unload); they raise
    `EngineError`. Inference returns a future, so the frontend answers from its callback without a task:
    `submit_infer_wire` queues, `wire.encode` serializes the result."""

    def __init__(self, engine: Engine) -> None:
        """`engine` takes the inferences (engine/frontend/engine.py): the DataPlane, or in a frontend process
        the engine client (workers/forwarding.py FrontendGrpcHandlers forwards every other RPC)."""
        self.engine = engine
        self._dataplane = engine if isinstance(engine, DataPlane) else None
        self.wire = InferWireCodec()

    @property
    def dp(self) -> DataPlane:
        """The DataPlane, for every RPC but inference: only the engine process answers those (a frontend
        process forwards them), and there the engine is the DataPlane."""
        if self._dataplane is None:
            raise TypeError("only inference is answered over the engine client; the engine answers the rest")
        return self._dataplane

    # ------------------------------------------------------------------ inference.GRPCInferenceService

    def ServerLive(self, request: Any) -> Any:
        return pb.ServerLiveResponse(live=self.dp.live())

    def ServerReady(self, request: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.dp.ready())

    def ModelReady(self, request: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    def ServerMetadata(self, request: Any) -> Any:
        return pb.ServerMetadataResponse(**self.dp.server_metadata())

    def ModelMetadata(self, request: Any) -> Any:
        meta = self.dp.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    def ModelConfig(self, request: Any) -> Any:
        return pb.ModelConfigResponse(config=self.dp.model(request.name, request.version).config.proto())

    def ModelStatistics(self, request: Any) -> Any:
        stats = self.dp.statistics(request.name, request.version)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    def RepositoryIndex(self, request: Any) -> Any:
        rows = self.dp.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state.value,
                                                  reason=e.reason) for e in rows
        ])

    async def RepositoryModelLoad(self, request: Any) -> Any:
        params = {k: param_value(v) for k, v in request.parameters.items()}
        files = {k[5:]: v for k, v in params.items() if k.startswith("file:")}  # bytes_param values
        await self.dp.load(request.model_name, params.get("config"), files)  # the data plane parses it
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any) -> Any:
        """`parameters["unload_dependents"].bool_param` also unloads an ensemble's composing models that no
        other loaded ensemble uses (the data plane decides which)."""
        unload_dependents = False
        if "unload_dependents" in request.parameters:
            unload_dependents = param_value(request.parameters["unload_dependents"])
            if not isinstance(unload_dependents, bool):
                raise invalid("parameter 'unload_dependents' must be a boolean")
        await self.dp.unload(request.model_name, unload_dependents)
        return pb.RepositoryModelUnloadResponse()

    def SystemSharedMemoryStatus(self, request: Any, caller: Caller = NOBODY) -> Any:
        resp = pb.SystemSharedMemoryStatusResponse()
        for region in self.dp.shm_status(False, request.name, caller):
            resp.regions[region["name"]].CopyFrom(resp.RegionStatus(**region))
        return resp

    def SystemSharedMemoryRegister(self, request: Any, caller: Caller = NOBODY) -> Any:
        self.dp.shm.require_allowed()
        if not request.name:
            raise invalid("'region name' is necessary to register system shared memory region")
        self.dp.shm_register(request.name, request.key, request.offset, request.byte_size, caller)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request: Any, caller: Caller = NOBODY) -> Any:
        self.dp.shm_unregister(False, request.name, caller)
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request: Any, caller: Caller = NOBODY) -> Any:
        resp = pb.CudaSharedMemoryStatusResponse()
        for region in self.dp.shm_status(True, request.name, caller):
            resp.regions[region["name"]].CopyFrom(resp.RegionStatus(**region))
        return resp

    def CudaSharedMemoryRegister(self, request: Any, caller: Caller = NOBODY) -> Any:
        """The handle arrives as its raw bytes here (HTTP sends it in base64)."""
        self.dp.shm.require_allowed()
        self.dp.cuda_shm_register(cuda_shm.checked(request.name, request.raw_handle, request.device_id,
                                                   request.byte_size), caller)
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, request: Any, caller: Caller = NOBODY) -> Any:
        self.dp.shm_unregister(True, request.name, caller)
        return pb.CudaSharedMemoryUnregisterResponse()

    def _decode(self, message: Any, header_id: bytes | None, owner: str, start_ns: int) -> InferenceRequest:
        """The serialized request decoded; the call's `x-request-id` metadata is its id when its message
        has none; `owner` the owner id of the API key the call presented. A message that cannot be decoded
        raises (an EngineError, or DecodeError for bytes that are no ModelInferRequest), after its access
        line while those are on (engine/observability/observe.py)."""
        try:
            request = self.wire.decode(message)
        except Exception as e:
            if logs.SETTINGS.access:
                _refused(message, header_id, e, start_ns)
            raise
        if header_id and not request.id:
            request.id = header_id.decode("latin-1")
        if owner:
            request.owner = owner
        return request

    def submit_infer_wire(self, message: Any, start_ns: int = 0, on_done: Completion | None = None,
                          header_id: bytes | None = None, owner: str = ""
                          ) -> asyncio.Future[InferenceResponse]:
        """ModelInfer, first half: decode the serialized request and queue it. Raises at once for a bad
        request (EngineError), or DecodeError for bytes that are not a ModelInferRequest; the future resolves
        with the response (answer with `wire.encode(response)`) or an EngineError, and `on_done` is called
        with it once it is done, right after the request is accounted. Cancelling it drops the request.
        `header_id` is the call's `x-request-id` metadata: the request's id when its message has none; `owner`
        the owner id of the API key the call presented (engine/access/caller.py)."""
        start_ns = start_ns or time.perf_counter_ns()
        request = self._decode(message, header_id, owner, start_ns)
        return self.engine.submit(request, start_ns, on_done)

    def stream_infer_wire(self, message: Any, answered: StreamAnswered, partial: StreamPartial | None = None,
                          header_id: bytes | None = None, owner: str = "", window: StreamWindow | None = None
                          ) -> tuple[asyncio.Future[InferenceResponse], bool]:
        """One serialized request of ModelStreamInfer: its future, and whether it belongs to a sequence (has a
        `sequence_id`: the sequence batcher bounds those, so the stream's own cap leaves them out, call.py
        `_must_wait`). `answered(future, answer)` is called once, when the returned future is done: `answer`
        is the serialized ModelStreamInferResponse as (parts, size), None when there is nothing to send, or
        the exception of a bug. Never an EngineError: as Triton does, an error is an answer on the stream
        (`error_message`, with the request's id), which stays open. A decoupled model's responses before its
        last go to `partial` as they come, flagged `triton_final_response: false`; its final flag sent alone
        is answered with Triton's empty final response only when the request sets
        `triton_enable_empty_final_response`. Raises DecodeError for bytes that are not a ModelInferRequest
        (the stream then ends, as grpc ends it). Cancelling the returned future drops the request (a decoupled
        model sees `is_cancelled()`). `owner`: the owner id of the call's API key (InferenceRequest.owner: a
        generative model charges its tokens to it). `window`: where the caller counts the decoupled responses
        its client took (engine/streaming/window.py), so the model's sends wait while too many are not yet
        taken."""
        def error(e: EngineError, final: bool = True) -> tuple[list[Any], int]:
            # the id is needed only here: parse in full
            body = _stream_error(pb.ModelInferRequest.FromString(message), e, final).SerializeToString()
            return [body], len(body)

        def streamed(response: InferenceResponse | EngineError) -> None:
            if partial is None:
                return
            try:
                partial(self.wire.encode_stream(response, final=False)
                        if isinstance(response, InferenceResponse) else error(response, final=False))
            except Exception:  # a bug in encoding: logged, the stream goes on
                log.exception("gRPC stream response encoding failed")

        def done(f: asyncio.Future[InferenceResponse]) -> None:
            answer: StreamAnswer = None
            if not f.cancelled():
                exc = f.exception()
                try:
                    if exc is not None:
                        answer = error(exc) if isinstance(exc, EngineError) else exc
                    elif (result := f.result()) is not EMPTY_FINAL:
                        answer = self.wire.encode_stream(result)
                    elif empty_final:
                        answer = self.wire.encode_stream(InferenceResponse(
                            request.model_name, request.model_version, [], request.id))
                except Exception as bug:  # a bug in encoding: the stream ends INTERNAL
                    answer = bug
            answered(f, answer)

        try:
            start_ns = time.perf_counter_ns()
            request = self._decode(message, header_id, owner, start_ns)
            empty_final = request.parameters.get("triton_enable_empty_final_response") is True
            request.stream = streamed
            request.stream_window = window
            return self.engine.submit(request, start_ns, done), bool(request.parameters.get("sequence_id"))
        except EngineError as refused:  # before queueing: answered on the next loop round, as any other
            future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
            future.set_exception(refused)
            future.add_done_callback(done)
            return future, False

    def stream_refusal(self, message: Any, error: EngineError) -> tuple[list[Any], int]:
        """The answer on a ModelStreamInfer stream to a request refused before it was decoded (its key's
        quotas): the error with the request's id, model and version, final; the stream goes on. Raises
        DecodeError for bytes that are not a ModelInferRequest."""
        body = _stream_error(pb.ModelInferRequest.FromString(message), error).SerializeToString()
        return [body], len(body)

    def LogSettings(self, request: Any) -> Any:
        """Triton's logging extension: each setting's oneof must be of its type (Triton's words)."""
        changes: dict[str, Any] = {}
        for name, value in request.settings.items():
            kind = value.WhichOneof("parameter_choice")
            if name == "log_file":
                changes[name] = value.string_param or "-"  # any log_file setting is refused, as Triton does
            elif name in ("log_info", "log_warning", "log_error"):
                if kind != "bool_param":
                    raise invalid(f"expect boolean for '{name}'")
                changes[name] = value.bool_param
            elif name == "log_verbose_level":
                if kind != "uint32_param":
                    raise invalid(f"expect int32 for '{name}'")
                changes[name] = value.uint32_param
            elif name == "log_format":
                if kind != "string_param":
                    raise invalid(f"expect string for '{name}'")
                changes[name] = value.string_param
        settings = self.dp.log_settings(changes, http=False)
        response = pb.LogSettingsResponse()
        for name, setting in settings.items():
            if isinstance(setting, bool):
                response.settings[name].bool_param = setting
            elif isinstance(setting, int):
                response.settings[name].uint32_param = setting
            else:
                response.settings[name].string_param = setting
        return response

    def TraceSetting(self, request: Any) -> Any:
        """Triton's trace extension, server-wide or for `model_name`; no value clears a setting."""
        changes = trace_settings.changes_from_lists({k: list(v.value) for k, v in request.settings.items()})
        settings = self.dp.trace_setting(request.model_name, changes)
        response = pb.TraceSettingResponse()
        for name, setting in settings.items():
            response.settings[name].value.extend(setting if isinstance(setting, list) else [setting])
        return response

    # ------------------------------------------------------------------ grpc.health.v1.Health

    def health_status(self, service: str) -> int:
        """The server ("") is SERVING when ready; a model name is SERVING when that model is; a name the
        repository does not know is SERVICE_UNKNOWN."""
        return self.health_statuses([service])[0]

    def health_statuses(self, services: list[str]) -> list[int]:
        """`health_status` of each, from one read of the repository's index."""
        resp = health.HealthCheckResponse
        known = {e.name for e in self.dp.repository_index()} if any(services) else set()
        out = []
        for service in services:
            if service and service not in known:
                out.append(resp.SERVICE_UNKNOWN)
                continue
            ok = self.dp.ready() if not service else self.dp.model_ready(service)
            out.append(resp.SERVING if ok else resp.NOT_SERVING)
        return out

    async def watch_statuses(self, services: list[str]) -> list[int]:
        """What Health/Watch reports (health_watch.py reads it once per tick for every stream of this
        process): the services' statuses now."""
        return self.health_statuses(services)

    def Check(self, request: Any) -> Any:
        status = self.health_status(request.service)
        if status == health.HealthCheckResponse.SERVICE_UNKNOWN:  # the health protocol says NOT_FOUND
            raise not_found(f"unknown service '{request.service}'")
        return health.HealthCheckResponse(status=status)


def _refused(message: Any, header_id: bytes | None, error: BaseException, start_ns: int) -> None:
    """The access line of a ModelInfer message that could not be decoded: its model, version and id as far
    as the message parses."""
    try:
        parsed = pb.ModelInferRequest.FromString(bytes(message))
        model, version, request_id = parsed.model_name, parsed.model_version, parsed.id
    except Exception:  # not even a ModelInferRequest
        model = version = request_id = ""
    if not request_id and header_id:
        request_id = header_id.decode("latin-1")
    observe.refused(model, version, request_id, error, start_ns)


def _stream_error(request: Any, error: EngineError, final: bool = True) -> Any:
    """A failed request's answer on the stream: the error, and the request's id, model and version, flagged
    final as Triton flags it (server src/grpc/stream_infer_handler.cc StreamInferResponseComplete)."""
    infer_response = pb.ModelInferResponse(id=request.id, model_name=request.model_name,
                                           model_version=request.model_version)
    infer_response.parameters["triton_final_response"].bool_param = final
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=infer_response)


def _unimplemented(name: str, extension: str) -> Any:
    def handler(self: GrpcHandlers, request: Any) -> Any:
        raise unserved_extension(extension, name)

    handler.__name__ = name
    return handler


for _name, _extension in UNIMPLEMENTED_RPCS.items():
    setattr(GrpcHandlers, _name, _unimplemented(_name, _extension))
