"""KServe v2 over HTTP/1.1: the endpoints. `HttpRoutes.handle()` turns a parsed request into an `Answer`, or
a `Pending` one for work that finishes later (an inference, a generate request, a repository load or
unload). The generate extension (generate.py) runs in a task per request; `generate_stream` writes its
events through the connection's `ResponseStream` while that task runs.

Routing dispatches on the request's target, parsed once by the connection (path.py), the same result
the access check read: its endpoint's row in the endpoint table (frontend/endpoints.py) names the methods
it answers and the handler here that answers it. Inference creates no task: the connection's `on_done` becomes
the data plane's one done-callback, and `_Infer` answers from that future. Errors leave as
`{"error": "..."}` with the status from `STATUS`, the one table from `ErrorCode` to HTTP. The connections
that call `handle()` are connection.py's, owned by `HttpApp` (app.py).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from ...access.caller import Caller
from ...dataplane import DataPlane
from ...errors import EngineError, ErrorCode, endpoint_message, invalid, not_found
from ...observability import logs, observe
from ...observability.request_ids import check_header_request_id
from ...observability.tracing import settings as trace_settings
from ...types import InferenceRequest, InferenceResponse
from .. import compression
from ..endpoints import Api, Endpoint, HttpRow, WrongMethod
from ..engine import Engine
from ..wire import limits as wire_limits
from .codec import (
    HEADER_LENGTH,
    HeaderCache,
    check_json_depth,
    decode_request,
    encode_response_parts,
    too_deep,
)
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
            return _error(503, self._cancelled)
        exc = fut.exception()
        if exc is None:
            try:
                return self._convert(fut.result())
            except Exception as e:  # a bug in encoding: answer 500, keep serving
                log.exception("HTTP response encoding failed")
                return _error(500, f"internal error: {e}")
        if isinstance(exc, EngineError):
            return _error(STATUS[exc.code], endpoint_message(exc, "HTTP end point"))
        self._log.error(self._failed, exc)
        return _error(500, f"internal error: {exc}")

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


def _error(status: int, message: str) -> Answer:
    return status, orjson.dumps({"error": message}), _JSON, b""


def _json(data: Any, status: int = 200) -> Answer:
    return status, orjson.dumps(data), _JSON, b""


def _status(ok: bool) -> Answer:
    return (200 if ok else 503), b"", b"text/plain", b""


def _json_body(req: HttpRequest, limit: int) -> dict[str, Any]:
    body = _body(req, limit)
    if not body.strip():
        return {}  # tritonclient sends some requests with no body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if str(e).startswith("depth limit exceeded"):  # orjson stops at 1024 levels
            raise too_deep() from None
        raise invalid(f"malformed JSON in request body: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object")
    check_json_depth(doc, wire_limits().max_json_depth)
    return doc


class HttpRoutes:
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
        except compression.TooLarge as e:  # a compressed body inflating past the limit, as one over it
            return _error(413, e.message)
        except compression.UnsupportedEncoding as e:
            return _error(415, e.message)
        except EngineError as e:
            return _error(STATUS[e.code], endpoint_message(e, "HTTP end point"))
        except Exception as e:  # a bug: answer 500, keep serving
            log.exception("HTTP handler failed")
            return _error(500, f"internal error: {e}")

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
        return _json(self.dp.server_metadata())

    def health_live(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.live())

    def health_ready(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.ready())

    def models_stats(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json({"model_stats": self.dp.statistics()})

    def model_metadata(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json(self.dp.model_metadata(target.name, target.version))

    def model_ready(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _status(self.dp.require_model_ready(target.name, target.version))

    def model_config(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json(self.dp.model_config(target.name, target.version))

    def model_stats(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json({"model_stats": self.dp.statistics(target.name, target.version)})

    def generate(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        """generate and generate_stream (generate.py); the stream's events go through the connection's
        `ResponseStream`."""
        body = _body(req, self.limits.max_body_bytes)
        stream = req.stream if target.endpoint is Endpoint.MODEL_GENERATE_STREAM else None
        return self._spawn(answer_generate(self.engine, self.metadata, target.name, target.version, body,
                                           self.limits.max_body_bytes, req.start_ns, stream, req.owner),
                           on_done)

    def repository_index(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return self._index(req)

    def repository_load(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        doc = _json_body(req, self.limits.max_body_bytes)  # parsed here, so its errors are answered here
        return self._spawn(self._load(doc, target.name), on_done)

    def repository_unload(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        doc = _json_body(req, self.limits.max_body_bytes)
        return self._spawn(self._unload(doc, target.name), on_done)

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
            body = _body(req, self.limits.max_body_bytes)
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

    def shared_memory(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """/v2/{system,cuda}sharedmemory[/region/{name}]/{status,register,unregister} (Triton's endpoints,
        server src/http_server.cc HandleSystemSharedMemory / HandleCudaSharedMemory)."""
        cuda = target.endpoint is Endpoint.CUDA_SHM
        name, action = target.name, target.action
        if (req.method not in (b"GET", b"HEAD")) if action == "status" else req.method != b"POST":
            return _error(405, "Method Not Allowed")  # the row lists no methods: they depend on the action
        caller = Caller(req.owner, *req.ends)
        if action == "status":
            return _json(self.dp.shm_status(cuda, name, caller))
        if action == "unregister":
            self.dp.shm_unregister(cuda, name, caller)
            return 200, b"", _JSON, b""
        kind = "cuda" if cuda else "system"
        self.dp.shm.require_allowed()  # the flag's message first, before the body is read, as Triton's
        if not name:
            raise invalid(f"'region name' is necessary to register {kind} shared memory region")
        if cuda:
            self.dp.cuda_shm_register(name)
            return 200, b"", _JSON, b""
        doc = _json_body(req, self.limits.max_body_bytes)
        if "key" not in doc:
            raise invalid("Shared memory register request has no 'key' field")
        if "byte_size" not in doc:
            raise invalid("Shared memory register request has no 'byte_size' field")
        self.dp.shm_register(name, doc["key"], doc.get("offset", 0), doc["byte_size"], caller)
        return 200, b"", _JSON, b""

    def log_settings(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """Triton's logging extension: GET reads the settings, POST changes those it names (null: left as
        is), each checked for its JSON type first."""
        changes = None
        if req.method == b"POST":
            changes = _log_changes(_json_body(req, self.limits.max_body_bytes))
        return _json(self.dp.log_settings(changes, http=True))

    def trace_setting(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """Triton's trace extension, server-wide (/v2/trace/setting: `target.name` "") or for one model."""
        changes = None
        if req.method == b"POST":
            changes = trace_settings.changes_from_json(_json_body(req, self.limits.max_body_bytes))
        return _json(self.dp.trace_setting(target.name, changes))

    def _index(self, req: HttpRequest) -> Answer:
        doc = _json_body(req, self.limits.max_body_bytes)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("'ready' must be true or false")
        return _json([{"name": e.name, "version": e.version, "state": e.state.value, "reason": e.reason}
                      for e in self.dp.repository_index(ready)])

    async def _load(self, doc: dict[str, Any], name: str) -> Answer:
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("'parameters' must be a JSON object")
        files = {k[5:]: _base64(k, v) for k, v in params.items() if k.startswith("file:")}
        await self.dp.load(name, params.get("config"), files)  # the data plane parses the config override
        return 200, b"", _JSON, b""

    async def _unload(self, doc: dict[str, Any], name: str) -> Answer:
        """`{"parameters": {"unload_dependents": true}}` also unloads an ensemble's composing models that no
        other loaded ensemble uses (the data plane decides which)."""
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("'parameters' must be a JSON object")
        unload_dependents = params.get("unload_dependents", False)
        if not isinstance(unload_dependents, bool):
            raise invalid("parameter 'unload_dependents' must be a boolean")
        await self.dp.unload(name, unload_dependents)
        return 200, b"", _JSON, b""

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
        return _error(405, f"{row.action} needs {row.methods[0].decode()}")
    if row.wrong_method is WrongMethod.NOT_ALLOWED:
        return _error(405, "Method Not Allowed")
    raise not_found(f"no endpoint {method.decode()} {target.path}")


def _log_changes(doc: dict[str, Any]) -> dict[str, Any]:
    """A logging POST body's settings as Python values; a value of the wrong JSON type is refused."""
    changes: dict[str, Any] = {}
    for name, value in doc.items():
        if value is None:
            continue
        if name == "log_file":
            changes[name] = value
        elif name in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise invalid(f"expect boolean for '{name}'")
            changes[name] = value
        elif name == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid(f"expect unsigned integer for '{name}'")
            changes[name] = value
        elif name == "log_format":
            if not isinstance(value, str):
                raise invalid(f"expect string for '{name}'")
            changes[name] = value
    return changes


def _base64(key: str, value: Any) -> bytes:
    """A `file:` load parameter: the file's bytes, base64-encoded in the JSON (Triton's protocol)."""
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError):
        raise invalid(f"parameter '{key}' must be the file's content as a base64 string") from None


def _body(req: HttpRequest, limit: int) -> bytes | bytearray:
    """The request body, decompressed when it has a Content-Encoding (gzip, deflate), within `limit` bytes:
    compression.TooLarge beyond it, compression.UnsupportedEncoding for other encodings."""
    body = req.body
    encoding = req.headers.get(b"content-encoding")
    if encoding is None or compression.is_identity(encoding.decode("latin-1").strip().lower()):
        return body
    return compression.decode(encoding.decode("latin-1"), body, limit)


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
