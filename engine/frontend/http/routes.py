"""KServe v2 over HTTP/1.1: the endpoints. `HttpRoutes.handle()` turns a parsed request into an `Answer`, or
a `Pending` one for work that finishes later (an inference, a generate request, a repository load or
unload). Here: routing and KServe v2's core (health, metadata, statistics, inference); Triton's extensions
(repository, shared memory, logging, trace) are in extension_routes.py, mixed into HttpRoutes; the
OpenAI API's rows go to its own router (frontend/openai/routes.py). The generate extension (generate.py)
runs in a task per request; `generate_stream` writes its events through the connection's `ResponseStream`
while that task runs.

Routing dispatches on the request's target, parsed once by the connection (path.py), the same result
the access check read: its endpoint's row in the endpoint table (frontend/endpoints.py) names the methods
it answers and the handler here that answers it. Inference creates no task: the connection's `on_done` becomes
the data plane's one done-callback, and `_Infer` answers from that future. Errors leave as
`{"error": "..."}` with the status from `STATUS`, the one table from `ErrorCode` to HTTP. The connections
that call `handle()` are connection.py's, owned by `HttpApp` (app.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from ...dataplane import DataPlane
from ...errors import EngineError, ErrorCode, endpoint_message, invalid, not_found
from ...observability import logs, observe
from ...observability.request_ids import check_header_request_id
from ...types import InferenceRequest, InferenceResponse
from .. import compression
from ..endpoints import Api, Endpoint, HttpRow, WrongMethod
from ..engine import Engine
from .answers import error_answer, json_answer
from .bodies import request_body
from .codec import HEADER_LENGTH, HeaderCache, decode_request, encode_response_parts
from .extension_routes import ExtensionRoutes
from .generate import MetadataSource, answer_generate
from .path import HttpTarget, parse_target
from .types import Answer, HttpLimits, HttpRequest, OnDone, Pending

if TYPE_CHECKING:
    from ..openai.routes import OpenAIRoutes

log = logging.getLogger("hubserve.http")

STATUS = {
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.NOT_ENABLED: 400,
    ErrorCode.ALREADY_EXISTS: 400,  # as Triton answers it (server src/http_server.cc HttpCodeFromError)
    ErrorCode.CANCELLED: 499,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}
_HEADER_LENGTH_LOWER = HEADER_LENGTH.lower().encode()
_JSON = b"application/json"
_UNSAFE_IN_HEADER = re.compile(rb"[^\x20-\x7e]")  # what a request id may not carry into a header


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class Deferred:
    """A route answered by a task (repository load and unload), or, subclassed, an inference here or a
    request a frontend process forwarded to the engine (workers/forwarding.py): `answer()` runs once the
    future is done and maps its outcome to an answer, the same way for each."""

    __slots__ = ("future",)
    _cancelled = "the request was cancelled: the server is stopping or the model unloading"
    _failed = "HTTP handler failed: %r"  # logged with the exception, to _log
    _log = log

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def answer(self) -> Answer:
        fut = self.future
        if fut.cancelled():
            return error_answer(503, self._cancelled)
        exc = fut.exception()
        if exc is None:
            try:
                return self._convert(fut.result())
            except Exception as e:  # a bug in encoding: answer 500, keep serving
                log.exception("HTTP response encoding failed")
                return error_answer(500, f"internal error: {e}")
        if isinstance(exc, EngineError):
            return error_answer(STATUS[exc.code], endpoint_message(exc, "HTTP end point"))
        self._log.error(self._failed, exc)
        return error_answer(500, f"internal error: {exc}")

    def _convert(self, result: Any) -> Answer:
        return result  # type: ignore[no-any-return]


class _Infer(Deferred):
    """An inference in flight: answering from the data plane's future itself, rather than through a second
    future, saves an allocation and a round of the event loop per request."""

    __slots__ = ("request",)

    def __init__(self, future: asyncio.Future[InferenceResponse], request: InferenceRequest) -> None:
        super().__init__(future)
        self.request = request

    def _convert(self, result: Any) -> Answer:
        return _infer_answer(result, self.request)


def _status(ok: bool) -> Answer:
    return (200 if ok else 503), b"", b"text/plain", b""


class HttpRoutes(ExtensionRoutes):
    """The endpoints, over the data plane. One per server (`HttpApp` holds it); keeps the tasks of the
    routes answered later (compressed inferences, repository load and unload) until they are done."""

    def __init__(self, engine: Engine, limits: HttpLimits, metadata: MetadataSource | None = None,
                 openai: OpenAIRoutes | None = None) -> None:
        """`engine` takes the inferences (engine/frontend/engine.py): the DataPlane, or in a frontend process
        the engine client, whose routes here answer inference alone. `metadata` is where the generate
        endpoints learn a model's inputs: the data plane's metadata by default; a frontend process asks the
        engine (workers/forwarding.py). `openai` answers /v1 (the OpenAI-compatible API, openai/routes.py)
        where the process holds the generation engines; without it /v1 is no endpoint."""
        self.engine = engine
        self._dataplane = engine if isinstance(engine, DataPlane) else None
        self.limits = limits
        self.openai = openai
        self.header_cache = HeaderCache()
        self.metadata = metadata or self._local_metadata
        self._tasks: set[asyncio.Future[Any]] = set()

    @property
    def dp(self) -> DataPlane:
        """The DataPlane, for every endpoint but inference: only the engine process answers those (a frontend
        process forwards them: workers/forwarding.py), and there the engine is the DataPlane."""
        if self._dataplane is None:
            raise TypeError("only inference is answered over the engine client; the engine answers the rest")
        return self._dataplane

    def handle(self, req: HttpRequest, on_done: OnDone) -> Answer | Pending:
        """Called by a connection for each request, in order; never raises. An answer still being computed
        (a `Pending`) calls `on_done` with its future once that is done."""
        try:
            return self.route(req, on_done)
        except compression.TooLarge as too_large:  # compressed, inflating past the limit: as a body over it
            return error_answer(413, too_large.message)
        except compression.UnsupportedEncoding as unsupported:
            return error_answer(415, unsupported.message)
        except EngineError as refused:
            return error_answer(STATUS[refused.code], endpoint_message(refused, "HTTP end point"))
        except Exception as bug:  # a bug: answer 500, keep serving
            log.exception("HTTP handler failed")
            return error_answer(500, f"internal error: {bug}")

    def route(self, req: HttpRequest, on_done: OnDone) -> Answer | Pending:
        """Dispatch on the request's parsed target (path.py): the one the access check read. Its endpoint's
        row (frontend/endpoints.py) names the methods it answers and the handler below that answers it. A
        request that came with none (nothing in the server makes one so) is parsed here by the same
        function."""
        target = req.target if req.target is not None else parse_target(req.url)
        row = target.endpoint.row
        # an OpenAI API row's router checks the method itself, after its own first checks (the Batch API
        # off: 501)
        if row.methods is not None and req.method not in row.methods and row.api is Api.KSERVE:
            return _wrong_method(row, req.method, target)
        return _HANDLERS[target.endpoint](self, req, target, on_done)

    # The handlers, one per row of the endpoint table (frontend/endpoints.py `Endpoint`), each called as
    # handler(req, target, on_done) once the row's methods were checked.

    def server_metadata(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return json_answer(self.dp.server_metadata())

    def health_live(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.live())

    def health_ready(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.ready())

    def models_stats(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return json_answer({"model_stats": self.dp.statistics()})

    def model_metadata(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return json_answer(self.dp.model_metadata(target.name, target.version))

    def model_ready(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.require_model_ready(target.name, target.version))

    def model_config(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return json_answer(self.dp.model_config(target.name, target.version))

    def model_stats(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return json_answer({"model_stats": self.dp.statistics(target.name, target.version)})

    def generate(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        """generate and generate_stream (generate.py); the stream's events go through the connection's
        `ResponseStream`."""
        body = request_body(req, self.limits.max_body_bytes)
        stream = req.stream if target.endpoint is Endpoint.MODEL_GENERATE_STREAM else None
        return self._spawn(answer_generate(self.engine, self.metadata, target.name, target.version, body,
                                           self.limits.max_body_bytes, req.start_ns, stream, req.owner),
                           on_done)

    def openai_api(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        """The handler of every OpenAI API row (/v1/...): its own router answers it (openai/routes.py, from
        the same row); no endpoint in a process without it."""
        if self.openai is None:
            raise not_found(f"no endpoint at {target.path}")
        return self.openai.handle(req, target, on_done)

    def no_endpoint(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        raise not_found(f"no endpoint at {target.path}")

    def malformed(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """Refused by the connection before routing (400); answered the same should one get here."""
        raise invalid(target.problem)

    def infer(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        """Decode and submit, with `on_done` as the answer: the data plane's one done-callback accounts the
        request, then calls it. A compressed body is decompressed first (Inference-Header-Content-Length
        counts the JSON of the decompressed body, as tritonclient sends it); a client accepting a compressed
        response gets one, built in a task of its own."""
        name, version = target.name, target.version
        header_id = req.headers.get(b"x-request-id")
        checked = check_header_request_id(header_id, "header X-Request-ID") if header_id else ""
        try:
            body = request_body(req, self.limits.max_body_bytes)
            header_length = req.headers.get(_HEADER_LENGTH_LOWER)
            request = decode_request(name, version, body,
                                     header_length.decode("latin-1") if header_length is not None else None,
                                     self.header_cache)
        except EngineError as e:  # malformed: it reaches no model, but has its access line
            if logs.SETTINGS.access:
                observe.refused(name, version, checked, e, req.start_ns)
            raise
        if checked and not request.id:
            request.id = checked
        if req.owner:
            request.owner = req.owner
        accept = req.headers.get(b"accept-encoding")
        encoding = compression.accepted(accept.decode("latin-1")) if accept else None
        if encoding is None:
            return _Infer(self.engine.submit(request, req.start_ns, on_done), request)
        future = self.engine.submit(request, req.start_ns)
        return self._spawn(_compressed_answer(future, request, encoding), on_done)

    async def _local_metadata(self, name: str, version: str) -> dict[str, Any]:
        return self.dp.model_metadata(name, version)

    def _spawn(self, coro: Any, on_done: OnDone) -> Deferred:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(on_done)
        return Deferred(task)


Handler = Callable[[HttpRoutes, HttpRequest, HttpTarget, OnDone], "Answer | Pending"]


def _handlers() -> dict[Endpoint, Handler]:
    """Each endpoint's handler, by the name its row gives (frontend/endpoints.py): a row without one fails
    here, at import. The OpenAI API's rows are handed to its router (`openai_api`), which reads their
    handlers there."""
    kserve = [e for e in Endpoint if e.row.api is Api.KSERVE]
    missing = [f"{e.name} ({e.row.handler})" for e in kserve
               if not callable(getattr(HttpRoutes, e.row.handler, None))]
    if missing:
        raise TypeError(f"endpoint rows without a handler in HttpRoutes: {', '.join(missing)}")
    handlers: dict[Endpoint, Handler] = {e: HttpRoutes.openai_api for e in Endpoint}
    handlers.update((e, getattr(HttpRoutes, e.row.handler)) for e in kserve)
    return handlers


_HANDLERS = _handlers()


def _wrong_method(row: HttpRow, method: bytes, target: HttpTarget) -> Answer:
    """A method the endpoint's row does not list, answered as the row says."""
    if row.wrong_method is WrongMethod.NEEDS:
        assert row.methods is not None
        return error_answer(405, f"{row.action} needs {row.methods[0].decode()}")
    if row.wrong_method is WrongMethod.NOT_ALLOWED:
        return error_answer(405, "Method Not Allowed")
    raise not_found(f"no endpoint {method.decode()} {target.path}")


async def _compressed_answer(future: asyncio.Future[InferenceResponse], request: InferenceRequest,
                             encoding: str) -> Answer:
    """An inference answer compressed with `encoding`, for a client that accepts it (Accept-Encoding).
    Cancelling this task (the client left) cancels the request; large bodies compress on a worker thread."""
    parts, size, header_length = encode_response_parts(await future, request)
    if size < 1 << 20:
        body = compression.encode(encoding, parts)
    else:
        body = await asyncio.to_thread(compression.encode, encoding, parts)
    content_type, extra = _infer_head(header_length)
    if request.id:
        extra += b"X-Request-ID: %s\r\n" % _header_safe(request.id)
    return 200, body, content_type, extra + b"Content-Encoding: %s\r\n" % encoding.encode()


def _infer_answer(response: InferenceResponse, request: InferenceRequest) -> Answer:
    """An inference's answer, its body as the codec's parts: the tensor bytes are not copied on the way."""
    parts, _, header_length = encode_response_parts(response, request)
    content_type, extra = _infer_head(header_length)
    if response.id:
        extra += b"X-Request-ID: %s\r\n" % _header_safe(response.id)
    return 200, parts[0] if len(parts) == 1 else parts, content_type, extra


def _header_safe(value: str) -> bytes:
    """A request id as a header value: control characters (a CR LF would split the head) become '_'."""
    return _UNSAFE_IN_HEADER.sub(b"_", value.encode("utf-8", "replace"))


def _infer_head(header_length: int | None) -> tuple[bytes, bytes]:
    """Content-Type and the extra header lines of an inference answer: binary data follows the JSON when
    the codec says how long that is."""
    if header_length is None:
        return _JSON, b""
    return b"application/octet-stream", b"Inference-Header-Content-Length: %d\r\n" % header_length


__all__ = ["STATUS", "HttpRoutes"]
