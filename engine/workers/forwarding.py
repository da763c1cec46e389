"""A frontend's routes and gRPC handlers: inference is decoded, submitted and encoded here, by the
single-process code over the engine client (remote.py); everything else is forwarded as it came and
answered by the engine's own handlers (control.py), so every process answers it identically.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from ..access.caller import NOBODY, Caller
from ..errors import EngineError, ErrorCode
from ..frontend.endpoints import GRPC_METHODS, Endpoint, Kind, Where
from ..frontend.grpc.handlers import GrpcHandlers
from ..frontend.http.path import model_target, parse_target
from ..frontend.http.routes import STATUS, Deferred, HttpRoutes
from ..frontend.http.types import Answer, HttpLimits, HttpRequest, OnDone, Pending
from .messages import GrpcCall, HealthCall, HttpCall
from .remote import EngineClient
from .streams import cancellable

log = logging.getLogger("hubserve.workers")
_LOCAL = Where.LOCAL

_CODE_OF_STATUS = {status: code for code, status in STATUS.items()}
# The unary RPCs answered by the engine, as the endpoint table (frontend/endpoints.py) places them; the others
# (inference, Health/Watch) run here.
FORWARDED_RPCS = tuple(row for row in GRPC_METHODS if row.where is Where.FORWARDED and row.kind is Kind.UNARY)


class FrontendRoutes:
    """`handle` as HttpRoutes has it: a request to an endpoint whose row (frontend/endpoints.py) is LOCAL
    (infer, generate and generate_stream), with a method the row lists, goes to the local routes (decoded
    here, submitted over the engine client); any other request is forwarded, and the engine's HttpRoutes
    answers it. Only inference is decoded here: every other route reads the repository or
    statistics, which only the engine has.

    A generate request needs the model's inputs to map its JSON: the frontend asks the engine for the
    model's metadata (a forwarded GET, as Triton's own generate handler reads the metadata per request),
    then submits the inference like any other. So a stream's responses come through the same channel as
    inference answers, rather than as one forwarded answer that could hold only a finished body."""

    def __init__(self, client: EngineClient, limits: HttpLimits) -> None:
        # only submit() of the client is reached: metadata comes through _metadata
        self.local = HttpRoutes(client, limits, self._metadata)
        self._client = client

    def handle(self, req: HttpRequest, on_done: OnDone) -> Answer | Pending:
        """The request's target is the one the connection parsed and the access check read
        (frontend/http/path.py); it crosses to the engine as parsed, so the engine routes exactly what was
        checked here."""
        target = req.target if req.target is not None else parse_target(req.url)
        row = target.endpoint.row
        if row.where is _LOCAL and row.methods is not None and req.method in row.methods:
            return self.local.handle(req, on_done)
        body = req.body if isinstance(req.body, bytes) else bytes(req.body)
        # A generation (the OpenAI API) is cancelled in the engine when its client leaves, and may stream:
        # then its head and pieces are written to the connection (req.stream) as they come, and the future
        # resolves at the stream's end.
        generation = cancellable(target.endpoint.name)
        call = HttpCall(req.method, req.url, target.to_wire(), req.headers, body, req.owner, *req.ends)
        future = self._client.forward(call, cancellable=generation, stream=req.stream if generation else None)
        future.add_done_callback(on_done)
        return _Forwarded(future)


    async def _metadata(self, name: str, version: str) -> dict[str, Any]:
        """The model's metadata from the engine; its error (an unknown model, say) as the engine said it."""
        target = model_target(Endpoint.MODEL_METADATA, name, version)  # built, never encoded and read back
        path = target.path.encode("utf-8", "replace")
        call = HttpCall(b"GET", path, target.to_wire(), {}, b"", "", None, None)
        status, body, _, _ = await self._client.forward(call)
        # the engine sends a body as one bytes object (control.py _flat)
        doc: dict[str, Any] = orjson.loads(body)
        if status != 200:
            raise EngineError(_CODE_OF_STATUS.get(status, ErrorCode.INTERNAL), doc.get("error", ""))
        return doc


class _Forwarded(Deferred):
    """The engine's answer to a forwarded HTTP request, or why there is none: the engine's HttpRoutes made
    the answer, so it goes out as it came."""

    __slots__ = ()
    _cancelled = "the request was cancelled: the server is stopping"
    _failed = "forwarded HTTP request failed: %r"
    _log = log


class _Serialized:
    """A response message the engine already serialized: the gRPC Call only asks it for its bytes."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def SerializeToString(self) -> bytes:  # protobuf's name, which the Call calls
        return self._data


class FrontendGrpcHandlers(GrpcHandlers):
    """GrpcHandlers whose inference runs over the engine client (inherited: submit_infer_wire and
    stream_infer_wire call `self.dp.submit`) and whose other RPCs are answered by the engine."""

    def __init__(self, client: EngineClient) -> None:
        super().__init__(client)
        self._client = client

    def _forward(self, method: str, request: Any, caller: Caller = NOBODY) -> asyncio.Future[Any]:
        call = GrpcCall(method, request.SerializeToString(), caller.owner, caller.peer, caller.local)
        future = self._client.forward(call)
        out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future[Any]) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif (exc := f.exception()) is not None:
                out.set_exception(exc)
            else:
                out.set_result(_Serialized(f.result()))

        future.add_done_callback(done)
        return out

    async def watch_statuses(self, services: list[str]) -> list[int]:
        """What Health/Watch reports, as the engine sees it: one forwarded HEALTH control per read, for every
        service this process's streams watch (frontend/grpc/health_watch.py)."""
        statuses: list[int] = await self._client.forward(HealthCall(services))
        return statuses


def _forwarder(name: str) -> Any:
    def handler(self: FrontendGrpcHandlers, request: Any, caller: Caller = NOBODY) -> asyncio.Future[Any]:
        return self._forward(name, request, caller)  # the Call passes one where the row says `caller`

    handler.__name__ = name
    return handler


for _row in FORWARDED_RPCS:  # the row's handler, here, forwards its method to the engine's (control.py)
    setattr(FrontendGrpcHandlers, _row.handler, _forwarder(_row.method))
