"""KServe v2 over HTTP/1.1, on an asyncio.Protocol with the httptools (llhttp) parser.

Why not a web framework: on the small models that dominate serving traffic, a framework's per-request
machinery (request objects, middleware, routing tables, header multidicts) costs more CPU than the inference.
Here a request is parsed by llhttp in C, routed by splitting the path, and answered with one `write` of status
line, headers and body (no Nagle stall, no second packet). Inference does not even create a task: the frontend
attaches a callback to the batcher's future.

Semantics: keep-alive by default (HTTP/1.1), `Connection: close` honoured, `Expect: 100-continue` answered,
pipelined requests answered in order (one at a time per connection), bodies capped at `max_body_bytes` (413).
A client that disconnects cancels its in-flight request, which takes it out of the batcher's queue.
Errors leave as `{"error": "..."}` with the status from `STATUS`, the one table from `ErrorCode` to HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

from ..dataplane import DataPlane
from ..errors import EngineError, ErrorCode, invalid, not_found, unserved_extension
from ..types import InferenceRequest, InferenceResponse
from . import compression
from .http_codec import HEADER_LENGTH, HeaderCache, decode_request, encode_response

log = logging.getLogger("hubserve.http")

STATUS = {
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 409,
    ErrorCode.CANCELLED: 499,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INTERNAL: 500,
}
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 409: b"Conflict",
            413: b"Payload Too Large", 415: b"Unsupported Media Type", 429: b"Too Many Requests",
            499: b"Client Closed Request",
            500: b"Internal Server Error", 501: b"Not Implemented", 503: b"Service Unavailable",
            504: b"Gateway Timeout"}
_HEADER_LENGTH_LOWER = HEADER_LENGTH.lower().encode()
_JSON = b"application/json"


class _Request:
    __slots__ = ("method", "url", "headers", "body", "keep_alive", "start_ns")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.keep_alive = True
        self.start_ns = 0


# A route answers with (status, body, content type, extra header lines) or with an awaitable/future of it,
# or, for inference, with an _Infer: the batcher's own future, converted to an Answer in its done-callback.
Answer = tuple[int, bytes, bytes, bytes]


class _Infer:
    """An inference in flight: answering from the data plane's future itself, rather than through a second
    future, saves an allocation and a round of the event loop per request."""

    __slots__ = ("future", "request")

    def __init__(self, future: asyncio.Future[InferenceResponse], request: InferenceRequest) -> None:
        self.future = future
        self.request = request


class HttpProtocol(asyncio.Protocol):
    def __init__(self, app: "HttpApp") -> None:
        self._app = app
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._current: _Request | None = None
        self._body_size = 0
        self._queue: deque[_Request] = deque()
        self._busy = False
        self._inflight: asyncio.Future[Any] | None = None
        self._closing = False

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._app.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._app.connections.discard(self)
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()  # the batcher drops it from its queue
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail_connection(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as e:
            self._fail_connection(400, f"malformed HTTP request: {e}")
        except _BodyTooLarge as e:
            self._fail_connection(413, str(e))

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._current = _Request()
        self._current.start_ns = time.perf_counter_ns()
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        assert self._current is not None
        self._current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._current is not None
        self._current.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        req = self._current
        assert req is not None
        req.method = self._parser.get_method()
        req.keep_alive = self._parser.should_keep_alive()
        length = req.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self._app.max_body_bytes:
            raise _BodyTooLarge(f"request body of {int(length)} bytes exceeds the limit of "
                                f"{self._app.max_body_bytes} bytes (--max-message-mb)")
        if req.headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        assert self._current is not None
        self._body_size += len(body)
        if self._body_size > self._app.max_body_bytes:
            raise _BodyTooLarge(f"request body exceeds the limit of {self._app.max_body_bytes} bytes")
        self._current.body.append(body)

    def on_message_complete(self) -> None:
        req = self._current
        self._current = None
        if req is None:
            return
        self._queue.append(req)
        if not self._busy:
            self._next()

    # ------------------------------------------------------------------ dispatch

    def _next(self) -> None:
        while self._queue and not self._closing:
            req = self._queue.popleft()
            self._busy = True
            try:
                answer = self._app.route(req)
            except EngineError as e:
                answer = _error(STATUS[e.code], e.message)
            except Exception as e:  # a bug: answer 500, keep serving
                log.exception("HTTP handler failed")
                answer = _error(500, f"internal error: {e}")
            if isinstance(answer, tuple):
                self._respond(req, answer)
                continue
            future, request = (answer.future, answer.request) if isinstance(answer, _Infer) else (answer, None)
            self._inflight = future
            future.add_done_callback(lambda fut, req=req, request=request: self._on_done(req, fut, request))
            return
        self._busy = False

    def _on_done(self, req: _Request, fut: asyncio.Future[Any], request: InferenceRequest | None) -> None:
        """Answer `req` from its future: an Answer, or with `request` given, an InferenceResponse to encode."""
        self._inflight = None
        if fut.cancelled():
            return  # the connection went away (it cancelled the request): nobody to answer
        exc = fut.exception()
        if exc is None:
            try:
                answer = fut.result() if request is None else _infer_answer(fut.result(), request)
            except Exception as e:  # a bug in encoding: answer 500, keep serving
                log.exception("HTTP response encoding failed")
                answer = _error(500, f"internal error: {e}")
        elif isinstance(exc, EngineError):
            answer = _error(STATUS[exc.code], exc.message)
        else:
            log.error("HTTP handler failed: %r", exc)
            answer = _error(500, f"internal error: {exc}")
        self._respond(req, answer)
        self._next()

    def _respond(self, req: _Request, answer: Answer) -> None:
        transport = self._transport
        if transport is None:
            return
        status, body, content_type, extra = answer
        keep = req.keep_alive and not self._app.closing
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status, _REASONS.get(status, b"Unknown"), content_type, len(body), extra,
            b"" if keep else b"Connection: close\r\n")
        transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            transport.write(body)
        if not keep:
            transport.close()
            self._closing = True
        self._busy = False

    def _fail_connection(self, status: int, message: str) -> None:
        if self._transport is not None:
            body = orjson.dumps({"error": message})
            self._transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                  b"Connection: close\r\n\r\n%s" % (status, _REASONS.get(status, b""), len(body), body))
            self._transport.close()
        self._closing = True

    def close_if_idle(self) -> None:
        if not self._busy and not self._queue and self._transport is not None:
            self._transport.close()


class _BodyTooLarge(Exception):
    pass


def _error(status: int, message: str) -> Answer:
    return status, orjson.dumps({"error": message}), _JSON, b""


def _json(data: Any, status: int = 200) -> Answer:
    return status, orjson.dumps(data), _JSON, b""


def _status(ok: bool) -> Answer:
    return (200 if ok else 503), b"", b"text/plain", b""


def _json_body(req: _Request, limit: int) -> dict[str, Any]:
    body = _body(req, limit)
    if not body.strip():
        return {}  # tritonclient sends some requests with no body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise invalid(f"malformed JSON in request body: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("request body must be a JSON object")
    return doc


class HttpApp:
    """Routes parsed requests to the data plane. One per server; owns the set of open connections."""

    def __init__(self, dataplane: DataPlane, max_body_bytes: int) -> None:
        self.dp = dataplane
        self.max_body_bytes = max_body_bytes
        self.connections: set[HttpProtocol] = set()
        self.closing = False
        self.header_cache = HeaderCache()
        self._tasks: set[asyncio.Future[Any]] = set()

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    def route(self, req: _Request) -> Answer | asyncio.Future[Answer] | _Infer:
        try:
            return self._route(req)
        except compression.TooLarge as e:  # a compressed body inflating past the limit, as one over it
            return _error(413, e.message)
        except compression.UnsupportedEncoding as e:
            return _error(415, e.message)

    def _route(self, req: _Request) -> Answer | asyncio.Future[Answer] | _Infer:
        path = req.url.split(b"?", 1)[0]
        text = path.decode("utf-8", "replace")
        parts = text.strip("/").split("/")
        if "%" in text:
            parts = [unquote(p) for p in parts]
        method = req.method
        if not parts or parts[0] != "v2":
            raise not_found(f"no endpoint at {path.decode('utf-8', 'replace')}")
        rest = parts[1:]
        extension = _unserved(rest)
        if extension is not None:
            raise unserved_extension(extension, f"{method.decode()} {path.decode('utf-8', 'replace')}")
        if method in (b"GET", b"HEAD"):
            if not rest or rest == [""]:
                return _json(self.dp.server_metadata())
            if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
                return _status(self.dp.live() if rest[1] == "live" else self.dp.ready())
            if rest == ["models", "stats"]:
                return _json({"model_stats": self.dp.statistics()})
        if rest and rest[0] == "models" and len(rest) >= 2:
            name, version, action = _model_path(rest[1:], path)
            return self._model_route(req, method, name, version, action)
        if method == b"POST" and rest and rest[0] == "repository":
            if rest[1:] == ["index"]:
                return self._index(req)
            if len(rest) == 4 and rest[1] == "models" and rest[3] in ("load", "unload"):
                doc = _json_body(req, self.max_body_bytes)  # parsed here, so its errors are answered here
                return self._spawn(self._load(doc, rest[2]) if rest[3] == "load" else self._unload(rest[2]))
        raise not_found(f"no endpoint {method.decode()} {path.decode('utf-8', 'replace')}")

    def _model_route(self, req: _Request, method: bytes, name: str, version: str, action: str
                     ) -> Answer | _Infer | asyncio.Future[Answer]:
        if action == "infer":
            if method != b"POST":
                return _error(405, "infer needs POST")
            return self._infer(req, name, version)
        if method not in (b"GET", b"HEAD"):
            return _error(405, f"{action or 'metadata'} needs GET")
        if action == "":
            return _json(self.dp.model_metadata(name, version))
        if action == "ready":
            return _status(self.dp.require_model_ready(name, version))
        if action == "config":
            return _json(self.dp.model_config(name, version))
        if action == "stats":
            return _json({"model_stats": self.dp.statistics(name, version)})
        raise not_found(f"no endpoint {action!r} for model '{name}'")

    def _infer(self, req: _Request, name: str, version: str) -> _Infer | asyncio.Future[Answer]:
        """Decode and submit. A compressed body is decompressed first (Inference-Header-Content-Length counts
        the JSON of the decompressed body, as tritonclient sends it); a client accepting a compressed
        response gets one, built in a task of its own."""
        body = _body(req, self.max_body_bytes)
        header_length = req.headers.get(_HEADER_LENGTH_LOWER)
        request = decode_request(name, version, body,
                                 header_length.decode("latin-1") if header_length is not None else None,
                                 self.header_cache)
        future = self.dp.submit(request, req.start_ns)
        accept = req.headers.get(b"accept-encoding")
        encoding = compression.accepted(accept.decode("latin-1")) if accept else None
        if encoding is None:
            return _Infer(future, request)
        return self._spawn(_compressed_answer(future, request, encoding))

    def _index(self, req: _Request) -> Answer:
        doc = _json_body(req, self.max_body_bytes)
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

    async def _unload(self, name: str) -> Answer:
        await self.dp.unload(name)
        return 200, b"", _JSON, b""

    def _spawn(self, coro: Any) -> asyncio.Future[Answer]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _base64(key: str, value: Any) -> bytes:
    """A `file:` load parameter: the file's bytes, base64-encoded in the JSON (Triton's protocol)."""
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError):
        raise invalid(f"parameter '{key}' must be the file's content as a base64 string") from None


def _model_path(parts: list[str], path: bytes) -> tuple[str, str, str]:
    """models/{name}[/versions/{v}][/{action}] → (name, version, action)."""
    name, rest = parts[0], parts[1:]
    version = ""
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    if len(rest) > 1:
        raise not_found(f"no endpoint at {path.decode('utf-8', 'replace')}")
    return name, version, rest[0] if rest else ""


def _body(req: _Request, limit: int) -> bytes:
    """The request body, decompressed when it has a Content-Encoding (gzip, deflate), within `limit` bytes:
    compression.TooLarge beyond it, compression.UnsupportedEncoding for other encodings."""
    body = req.body[0] if len(req.body) == 1 else b"".join(req.body)
    encoding = req.headers.get(b"content-encoding")
    if encoding is None or compression.is_identity(encoding.decode("latin-1").strip().lower()):
        return body
    return compression.decode(encoding.decode("latin-1"), body, limit)


# Triton's HTTP endpoints of extensions hubserve does not serve (server src/http_server.cc; docs/protocol/
# extension_*.md), by first path segment after /v2: each answers 501 naming its extension (as the gRPC
# RPCs answer UNIMPLEMENTED), not 404 as if it were no endpoint at all.
_UNSERVED = {"systemsharedmemory": "system_shared_memory", "cudasharedmemory": "cuda_shared_memory",
             "trace": "trace", "logging": "logging"}
_SHM_ACTIONS = ("status", "register", "unregister")


def _unserved(rest: list[str]) -> str | None:
    """The extension of an endpoint we don't serve at /v2/<rest>, or None."""
    if not rest:
        return None
    extension = _UNSERVED.get(rest[0])
    if extension is not None:
        tail = rest[1:]
        if extension == "logging":
            return extension if not tail else None
        if extension == "trace":
            return extension if tail == ["setting"] else None
        if len(tail) == 1 and tail[0] in _SHM_ACTIONS or len(tail) == 3 and tail[0] == "region" \
                and tail[2] in _SHM_ACTIONS:
            return extension
        return None
    if rest[0] == "models" and len(rest) >= 3:
        tail = rest[2:]
        if len(tail) >= 2 and tail[0] == "versions":
            tail = tail[2:]
        if tail in (["generate"], ["generate_stream"]):
            return "generate"
        if tail == ["trace", "setting"]:
            return "trace"
    return None


async def _compressed_answer(future: asyncio.Future[InferenceResponse], request: InferenceRequest,
                             encoding: str) -> Answer:
    """An inference answer compressed with `encoding`, for a client that accepts it (Accept-Encoding).
    Cancelling this task (the client left) cancels the request; large bodies compress on a worker thread."""
    status, payload, content_type, extra = _infer_answer(await future, request)
    if len(payload) < 1 << 20:
        body = compression.encode(encoding, [payload])
    else:
        body = await asyncio.to_thread(compression.encode, encoding, [payload])
    return status, body, content_type, extra + b"Content-Encoding: %s\r\n" % encoding.encode()


def _infer_answer(response: InferenceResponse, request: InferenceRequest) -> Answer:
    payload, header_length = encode_response(response, request)
    if header_length is None:
        return 200, payload, _JSON, b""
    return 200, payload, b"application/octet-stream", b"Inference-Header-Content-Length: %d\r\n" % header_length


async def serve(app: HttpApp, host: str, port: int) -> asyncio.AbstractServer:
    loop = asyncio.get_running_loop()
    return await loop.create_server(app.protocol, host, port, backlog=1024, reuse_address=True)


async def shutdown(app: HttpApp, server: asyncio.AbstractServer, timeout_s: float) -> None:
    """Stop accepting, let in-flight requests finish (answered with Connection: close), close idle ones."""
    app.closing = True
    server.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for conn in list(app.connections):
            conn.close_if_idle()
        if not app.connections:
            break
        await asyncio.sleep(0.02)
    for conn in list(app.connections):
        if conn._transport is not None:
            conn._transport.close()


__all__ = ["HttpApp", "serve", "shutdown", "STATUS"]
