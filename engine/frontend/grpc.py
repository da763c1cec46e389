"""KServe v2 over gRPC (grpc.aio), plus the standard grpc.health.v1 service.

Each RPC converts, delegates to the data plane, converts back. `STATUS` is the one table from `ErrorCode` to
gRPC status codes. A client cancelling an RPC cancels its handler, which takes its request out of the queue.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

import grpc
from google.protobuf import json_format

from ..dataplane import DataPlane
from ..errors import EngineError, ErrorCode, invalid
from ..proto import grpc_service_pb2 as pb
from ..proto import grpc_service_pb2_grpc as pb_grpc
from ..proto import health_pb2, health_pb2_grpc
from .grpc_codec import decode_request, encode_response, param_value

STATUS = {
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


async def _abort(context: grpc.aio.ServicerContext, error: EngineError) -> None:
    await context.abort(STATUS[error.code], error.message)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.dp.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(**self.dp.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            meta = self.dp.model_metadata(request.name, request.version)
        except EngineError as e:
            await _abort(context, e)
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            config = self.dp.model(request.name, request.version).config.proto()
        except EngineError as e:
            await _abort(context, e)
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            stats = self.dp.statistics(request.name, request.version)
        except EngineError as e:
            await _abort(context, e)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            response = await self.dp.infer(decode_request(request), start)
        except EngineError as e:
            await _abort(context, e)
        return encode_response(response)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Requests on one stream run concurrently; each answer (or error) is sent as it completes."""
        results: asyncio.Queue[Any] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(request: Any) -> None:
            try:
                response = await self.dp.infer(decode_request(request))
                await results.put(pb.ModelStreamInferResponse(infer_response=encode_response(response)))
            except EngineError as e:
                await results.put(pb.ModelStreamInferResponse(
                    error_message=e.message, infer_response=pb.ModelInferResponse(id=request.id)))

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.ensure_future(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*list(tasks))
            await results.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await results.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        rows = self.dp.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state.value,
                                                  reason=e.reason) for e in rows
        ])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        try:
            config_json = None
            params = {k: param_value(v) for k, v in request.parameters.items()}
            if any(k.startswith("file:") for k in params):
                raise EngineError(ErrorCode.UNSUPPORTED, "loading model files through the API is not supported yet")
            if "config" in params:
                try:
                    config_json = json.loads(params["config"])
                except (TypeError, ValueError) as e:
                    raise invalid(f"parameter 'config' is not valid JSON: {e}") from None
                if not isinstance(config_json, dict):
                    raise invalid("parameter 'config' must be a JSON object")
            await self.dp.load(request.model_name, config_json)
        except EngineError as e:
            await _abort(context, e)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            await self.dp.unload(request.model_name)
        except EngineError as e:
            await _abort(context, e)
        return pb.RepositoryModelUnloadResponse()


def _unimplemented(name: str) -> Any:
    async def handler(self: Any, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"hubserve does not implement {name} yet")

    handler.__name__ = name
    return handler


for _name in ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
              "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
              "TraceSetting", "LogSettings"):
    setattr(InferenceService, _name, _unimplemented(_name))


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: the server ("") is SERVING when ready; a model name is SERVING when that model is. A
    name the repository does not know is NOT_FOUND for Check and SERVICE_UNKNOWN for Watch, as the health
    protocol says."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    def _status(self, service: str) -> int:
        resp = health_pb2.HealthCheckResponse
        if service and service not in {e.name for e in self.dp.repository_index()}:
            return resp.SERVICE_UNKNOWN
        ok = self.dp.ready() if not service else self.dp.model_ready(service)
        return resp.SERVING if ok else resp.NOT_SERVING

    async def Check(self, request: Any, context: Any) -> Any:
        status = self._status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        last = None
        while True:
            status = self._status(request.service)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(0.5)


def make_server(dataplane: DataPlane, max_message_bytes: int) -> grpc.aio.Server:
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(dataplane), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(dataplane), server)
    return server
