"""The engine's side of everything that is not inference: a frontend forwards the request as it came and the
engine answers it with the single-process handlers themselves (HTTP: `HttpRoutes.handle`; gRPC: the unary
methods of `GrpcHandlers`), so no endpoint is written twice and every answer (health, readiness, metadata,
config, statistics, the repository index, load and unload) is the one a single process gives, from the one
repository and the one set of statistics.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..access.caller import Caller
from ..dataplane import DataPlane
from ..frontend.grpc.handlers import GrpcHandlers
from ..frontend.grpc.rpcs import Kind, rpc_table
from ..frontend.http.path import HttpTarget
from ..frontend.http.routes import HttpRoutes
from ..frontend.http.types import Answer, HttpLimits, HttpRequest, Pending
from ..frontend.openai.routes import OpenAIRoutes
from .credit import SendWindow
from .messages import Control, GrpcCall, HealthCall, HttpCall, error_payload
from .streams import StreamHead, StreamOut

log = logging.getLogger("hubserve.workers")

# How a control request is answered: (cid, ok, result or error payload), once. An HTTP result is the route's
# `Answer`, or None for the end of an answer the route streamed (the OpenAI API's server-sent events), whose
# head and pieces went out through `Piece` before it (streams.py).
Reply = Callable[[int, bool, Any], None]
Piece = Callable[[int, "StreamHead | bytes"], None]


class ControlRunner:
    """One per engine, shared by every frontend's session. `run(control, reply)` never raises: whatever
    happens, `reply` is called once (at once or from the loop later)."""

    def __init__(self, dataplane: DataPlane, limits: HttpLimits, openai: OpenAIRoutes | None = None) -> None:
        self.http = HttpRoutes(dataplane, limits, openai=openai)
        self.grpc = GrpcHandlers(dataplane)
        self._unary = {name.rsplit(b"/", 1)[1].decode(): rpc for name, rpc in rpc_table(self.grpc).items()
                       if rpc.kind is Kind.UNARY}
        self._tasks: set[asyncio.Future[Any]] = set()

    def run(self, control: Control, reply: Reply, piece: Piece,
            window: SendWindow | None = None) -> Pending | None:
        """Returns an HTTP request's `Pending` while it is being answered (or streamed, through `piece`,
        paced by `window`: credit.py), so the session can cancel it (its client left); None when it was
        answered at once or is not HTTP."""
        cid, call = control.cid, control.call
        try:
            if isinstance(call, HttpCall):
                return self._http(cid, call, reply, piece, window)
            if isinstance(call, GrpcCall):
                self._grpc(cid, call, reply)
            elif isinstance(call, HealthCall):
                reply(cid, True, self.grpc.health_statuses(list(call.services)))
        except Exception as e:  # EngineError (gRPC), or a bug: the frontend answers it as it would its own
            reply(cid, False, error_payload(e))
        return None

    def _http(self, cid: int, call: HttpCall, reply: Reply, piece: Piece,
              window: SendWindow | None) -> Pending | None:
        """The request as the frontend had it. The target comes parsed, as the frontend's access check read
        it (frontend/http/path.py): the routes here dispatch on it, never on the URL read again."""
        req = HttpRequest()
        req.method, req.url, req.headers, req.body = call.method, call.url, call.headers, call.body
        req.target = HttpTarget.from_wire(call.target)
        req.owner, req.ends = call.owner, (call.peer, call.local)
        stream = StreamOut(cid, piece, window)
        req.stream = stream
        held: list[Pending] = []

        def done(_: asyncio.Future[Any]) -> None:  # never called before handle() returns: it is a callback
            if stream.started:  # the answer went out in pieces: this is its end
                reply(cid, True, None)
                return
            reply(cid, True, _flat(held[0].answer()))

        answer = self.http.handle(req, done)
        if isinstance(answer, tuple):
            reply(cid, True, _flat(answer))
            return None
        held.append(answer)
        return answer

    def _grpc(self, cid: int, call: GrpcCall, reply: Reply) -> None:
        method = call.method
        rpc = self._unary.get(method)
        if rpc is None:
            raise ValueError(f"no unary RPC {method!r} to forward to")
        request = rpc.request_type.FromString(call.request)
        result = rpc.handler(request, Caller(call.owner, call.peer, call.local)) if rpc.caller \
            else rpc.handler(request)
        if not inspect.isawaitable(result):
            reply(cid, True, result.SerializeToString())
            return
        task = asyncio.ensure_future(result)
        self._tasks.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                reply(cid, False, error_payload(asyncio.CancelledError()))
            elif (exc := t.exception()) is not None:
                reply(cid, False, error_payload(exc))
            else:
                reply(cid, True, t.result().SerializeToString())

        task.add_done_callback(done)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _flat(answer: Answer) -> Answer:
    """An HTTP answer whose body may be parts, with the body as one bytes object (messages.py
    `HttpAnswer`)."""
    status, body, content_type, extra = answer
    if isinstance(body, list):
        body = b"".join(bytes(p) for p in body)
    elif not isinstance(body, bytes):
        body = bytes(body)
    return status, body, content_type, extra
