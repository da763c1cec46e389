"""KServe v2 over gRPC with grpc.aio (`--grpc-frontend grpcio`), plus the standard grpc.health.v1 service.

A thin wrapper: every RPC calls the transport-neutral `GrpcHandlers` (grpc_handlers.py), which the lean
HTTP/2 frontend (h2/) calls too. `STATUS` is derived from that module's one ErrorCode → gRPC status table.
A client cancelling an RPC cancels its handler, which takes its request out of the queue.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ..dataplane import DataPlane
from ..errors import EngineError
from ..proto import grpc_service_pb2_grpc as pb_grpc
from ..proto import health_pb2_grpc
from . import grpc_handlers
from .grpc_handlers import GrpcHandlers

_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
STATUS = {error: _BY_NUMBER[int(status)] for error, status in grpc_handlers.STATUS.items()}


async def _abort(context: grpc.aio.ServicerContext, error: EngineError) -> None:
    await context.abort(STATUS[error.code], error.message)


def _unary(name: str) -> Any:
    """A servicer method that calls the handler of the same name and aborts with its EngineError."""

    async def method(self: Any, request: Any, context: Any) -> Any:
        try:
            response = getattr(self.handlers, name)(request)
            if inspect.isawaitable(response):
                response = await response
            return response
        except EngineError as e:
            await _abort(context, e)

    method.__name__ = name
    return method


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, handlers: GrpcHandlers) -> None:
        self.handlers = handlers

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            response = await self.handlers.submit_infer(request, start)
        except EngineError as e:
            await _abort(context, e)
        return self.handlers.encode_response(response)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Requests on one stream run concurrently; each answer (or error) is sent as it completes."""
        results: asyncio.Queue[Any] = asyncio.Queue()
        pending: set[asyncio.Future[Any]] = set()
        reading_done = False

        def done(fut: asyncio.Future[Any]) -> None:
            pending.discard(fut)
            results.put_nowait(fut)

        async def read() -> None:
            nonlocal reading_done
            async for request in request_iterator:
                fut = self.handlers.stream_infer(request)
                pending.add(fut)
                fut.add_done_callback(done)
            reading_done = True
            results.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while not (reading_done and not pending and results.empty()):
                item = await results.get()
                if item is not None and not item.cancelled():
                    yield item.result()
        finally:
            reader.cancel()
            for fut in list(pending):
                fut.cancel()


for _name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig",
              "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
              *grpc_handlers.UNIMPLEMENTED_RPCS):
    setattr(InferenceService, _name, _unary(_name))


class HealthService(health_pb2_grpc.HealthServicer):
    def __init__(self, handlers: GrpcHandlers) -> None:
        self.handlers = handlers

    Check = _unary("Check")

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self.handlers.Watch(request):
            yield response


def make_server(dataplane: DataPlane, max_message_bytes: int) -> grpc.aio.Server:
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    handlers = GrpcHandlers(dataplane)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(handlers), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(handlers), server)
    return server


__all__ = ["STATUS", "make_server"]
