"""The OpenAI-compatible endpoints on the HTTP port, under /v1, each a row of the endpoint table
(frontend/endpoints.py) whose handler is a method here or of BatchRoutes; HttpRoutes hands each here:

    GET  /v1/models, /v1/models/{model}      the generative models that serve now, and their LoRA adapters
                                             (`model:adapter`), then the embedding models
    POST /v1/completions                     text completion
    POST /v1/chat/completions                chat, through the model folder's chat template
    POST /v1/embeddings                      an embedding model's vectors (engine/openai/embedding_service.py)
    /v1/files, /v1/batches                   the Batch API (batch_routes.py)

and vLLM's operational endpoints beside them, outside /v1 as vLLM serves them:

    GET  /health                             200, empty, while the server takes requests and every
                                             generative engine runs; else 503
    GET  /version                            {"version": hubserve's}
    POST /tokenize, /detokenize              a prompt's token ids through the generation's prompt path, and
                                             back (engine/openai/tokenize.py)
    GET  /metrics                            the metrics port's page (engine/observability/metrics.py)

A generation request runs as one task: the engine's work is on its own thread
(engine/generate/serving/driver.py), the task only waits for its events. Without `stream` the task's result is
the JSON answer; with it, the task writes the events through the request's `ResponseStream` from the first
event on (stream.py `stream_generation`) and ends when the stream does, so the request's admission (a
key's concurrency slot) is held for the stream's life. A client that leaves cancels the task, which aborts the
generation. Errors leave as OpenAI's error object (engine/openai/errors.py); an error before the first
event is a plain JSON answer.

The request id is the client's `X-Request-ID`, or one made here (`chatcmpl-…`, `cmpl-…`): it is the answer's
`id`, its `X-Request-ID` header, and the engine's id for the request (its log lines name it).

With `--workers N` these routes run in the engine process, where the engines are: a frontend forwards each
/v1 request there, and a stream comes back to it in pieces (engine/workers/streams.py): the request's
`stream` there is the engine's end of the channel.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from ... import __version__
from ...openai.batch.runner import BatchRunner
from ...openai.embeddings import parse_embedding
from ...openai.errors import NOT_IMPLEMENTED, OpenAIError, bad_request, from_engine
from ...openai.generation import Generation
from ...openai.protocol import ApiRequest, parse_body, parse_request
from ...openai.service import OpenAIService
from ...openai.tokenize import parse_detokenize, parse_tokenize
from ..endpoints import Api, Endpoint, HttpRow
from ..http.metrics_routes import METRICS_CONTENT_TYPE
from ..http.path import HttpTarget
from ..http.types import Answer, HttpRequest, OnDone, Pending, ResponseStream
from .batch_routes import BatchRoutes, Reply, unknown_url
from .stream import stream_generation

log = logging.getLogger("hubserve.openai")

_JSON = b"application/json"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def _error_answer(error: OpenAIError, extra: bytes = b"") -> Answer:
    if error.retry_after_secs:
        extra += b"Retry-After: %d\r\n" % error.retry_after_secs
    return error.status, error.json(), _JSON, extra


def _json(doc: Any, extra: bytes = b"") -> Answer:
    return 200, orjson.dumps(doc), _JSON, extra


class _Task:
    """A generation request in flight (a `Pending`): the task's result is the answer (None once it has
    streamed it: the connection does not ask then)."""

    __slots__ = ("extra", "future")

    def __init__(self, future: asyncio.Future[Answer | None], extra: bytes) -> None:
        self.future = future
        self.extra = extra

    def answer(self) -> Answer:
        fut = self.future
        if fut.cancelled():
            return _error_answer(OpenAIError(503, "The request was cancelled: the server is stopping.",
                                             "service_unavailable_error"), self.extra)
        exc = fut.exception()
        if exc is None:
            result = fut.result()
            if result is None:  # streamed: only a caller that does not know it asks (an internal error)
                return _error_answer(OpenAIError(500, "internal error: the answer was streamed",
                                                 "server_error"), self.extra)
            return result
        if isinstance(exc, OpenAIError):
            return _error_answer(exc, self.extra)
        log.error("OpenAI request failed: %r", exc)
        return _error_answer(OpenAIError(500, f"internal error: {exc}", "server_error"), self.extra)


class OpenAIRoutes:
    """One per server, beside HttpRoutes (which calls `handle` for the OpenAI API's rows of the endpoint
    table, frontend/endpoints.py). Each row names its handler: a method here (`Api.OPENAI`), called as
    `handler(req, target, on_done)`, or one of BatchRoutes (`Api.BATCH`), called as
    `handler(req, target, owner)`."""

    def __init__(self, service: OpenAIService, batches: BatchRunner | None = None,
                 metrics: Callable[[], bytes] | None = None, accepting: Callable[[], bool] = lambda: True
                 ) -> None:
        """`metrics`: the Prometheus page (the server's, which the metrics port serves too; None: /metrics
        is 404 here). `accepting`: whether the server takes requests (false once it is stopping)."""
        self.service = service
        self.batches = BatchRoutes(batches) if batches is not None else None
        self._metrics = metrics
        self._accepting = accepting
        self._tasks: set[asyncio.Future[Any]] = set()

    def handle(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        """`target`: the request's parsed target (http/path.py), one of the OpenAI API's rows. Never
        raises."""
        try:
            return self._route(req, target, on_done)
        except OpenAIError as e:
            return _error_answer(e)
        except Exception as e:  # a bug: answer 500, keep serving
            log.exception("OpenAI handler failed")
            return _error_answer(OpenAIError(500, f"internal error: {e}", "server_error"))

    def _route(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        """The checks in their order: the Batch API on (501) and the request's owner known (401), for its
        rows; then the row's methods (405); then its handler."""
        endpoint = target.endpoint
        row = endpoint.row
        if row.api is Api.BATCH:
            batches = self.batches
            if batches is None:
                raise OpenAIError(501, "The Batch API is off on this server: start it with --batch-dir PATH "
                                       "(a folder for its files and jobs).", NOT_IMPLEMENTED)
            owner = batches.runner.owners.of_request(req.owner)
            _check_method(req.method, row, target)
            reply = _BATCH_HANDLERS[endpoint](batches, req, target, owner)
            if isinstance(reply, tuple):
                return reply
            batch_task: asyncio.Future[Answer | None] = asyncio.ensure_future(reply)
            self._tasks.add(batch_task)
            batch_task.add_done_callback(self._tasks.discard)
            batch_task.add_done_callback(on_done)
            return _Task(batch_task, b"")
        _check_method(req.method, row, target)
        return _HANDLERS[endpoint](self, req, target, on_done)

    # The handlers of the OpenAI API's rows (Api.OPENAI), each called as handler(req, target, on_done) once
    # the row's methods were checked.

    def list_models(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json(self.service.list_models())

    def retrieve_model(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json(self.service.retrieve_model(target.name))

    def completions(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        return self._generate(req, False, on_done)

    def chat_completions(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        return self._generate(req, True, on_done)

    def embeddings(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        embedder = self.service.embeddings
        if embedder is None:
            raise OpenAIError(501, "This server serves no embeddings.", NOT_IMPLEMENTED)
        request = parse_embedding(parse_body(req.body))
        request_id = _given_request_id(req) or f"embd-{uuid.uuid4().hex}"
        return self._spawn(embedder.embed(request, request_id, req.owner), on_done)

    def unknown_url(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        raise unknown_url(req.method, target)

    # vLLM's operational endpoints

    def health(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        ok = self._accepting() and self.service.engines_alive()
        return (200 if ok else 503), b"", b"text/plain", b""

    def version(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return _json({"version": __version__})

    def metrics(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        if self._metrics is None:
            raise unknown_url(req.method, target)
        return 200, self._metrics(), METRICS_CONTENT_TYPE, b""

    def tokenize(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        request = parse_tokenize(parse_body(req.body))
        return self._spawn(self.service.tokenize(request), on_done)

    def detokenize(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer | Pending:
        request = parse_detokenize(parse_body(req.body))
        return self._spawn(self.service.detokenize(request), on_done)

    def _spawn(self, work: Coroutine[Any, Any, dict[str, Any]], on_done: OnDone) -> Pending:
        """`work`'s JSON answer, as a task: the connection asks for it when `on_done` says it is ready."""

        async def answer() -> Answer:
            return _json(await work)

        task: asyncio.Future[Answer | None] = asyncio.ensure_future(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(on_done)
        return _Task(task, b"")

    def _generate(self, req: HttpRequest, chat: bool, on_done: OnDone) -> Answer | Pending:
        request_id = _request_id(req, chat)
        extra = b"X-Request-ID: %s\r\n" % request_id.encode()
        try:
            api = parse_request(parse_body(req.body), chat)
        except OpenAIError as e:
            return _error_answer(e, extra)
        task = asyncio.ensure_future(self._run(api, request_id, req.owner, extra, req.stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(on_done)
        return _Task(task, extra)

    async def _run(self, api: ApiRequest, request_id: str, owner: str, extra: bytes,
                   stream: ResponseStream | None) -> Answer | None:
        """The request's task: the JSON answer, or None once the events were written to `stream`. `owner`:
        who sent it (HttpRequest.owner), whose tokens_per_minute it draws from."""
        created = int(time.time())
        gen: Generation = await self.service.start(api, request_id, owner)
        try:
            if api.stream:
                await gen.first
                if gen.error is not None and not any(c.text for c in gen.choices):
                    return _error_answer(from_engine(gen.error), extra)
                if stream is None:  # a caller with no connection to stream to (none does today)
                    raise OpenAIError(500, "internal error: no stream to write to", "server_error")
                await stream_generation(gen, api, created, extra, stream)
                return None
            await gen.done
        except BaseException:
            gen.abort()  # the client left (or a bug) before the end: the engine frees its blocks
            raise
        return _json(self.service.answer(gen, api, created), extra)


def _request_id(req: HttpRequest, chat: bool) -> str:
    return _given_request_id(req) or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def _given_request_id(req: HttpRequest) -> str | None:
    """The client's X-Request-ID (None: none sent); a 400 for one we do not take."""
    given = req.headers.get(b"x-request-id")
    if given is None:
        return None
    text = given.decode("latin-1")
    if _REQUEST_ID.fullmatch(text):
        return text
    raise bad_request("X-Request-ID must be 1-128 characters of letters, digits and . _ : -", "X-Request-ID")


def _check_method(method: bytes, row: HttpRow, target: HttpTarget) -> None:
    """A method the row does not list: 405, naming the row's `action` (or the path) and its first method."""
    if row.methods is not None and method not in row.methods:
        where = row.action or "/v1/" + "/".join(target.segments[1:])
        raise OpenAIError(405, f"{method.decode()} is not allowed on {where}; use {row.methods[0].decode()}.")


OpenAIHandler = Callable[[OpenAIRoutes, HttpRequest, HttpTarget, OnDone], "Answer | Pending"]
BatchHandler = Callable[[BatchRoutes, HttpRequest, HttpTarget, str], Reply]


def _handlers(api: Api, routes: type) -> dict[Endpoint, Any]:
    """The handlers of `api`'s rows, by the names the rows give (frontend/endpoints.py): a row without one
    fails here, at import."""
    rows = [e for e in Endpoint if e.row.api is api]
    missing = [f"{e.name} ({e.row.handler})" for e in rows
               if not callable(getattr(routes, e.row.handler, None))]
    if missing:
        raise TypeError(f"endpoint rows without a handler in {routes.__name__}: {', '.join(missing)}")
    return {e: getattr(routes, e.row.handler) for e in rows}


_HANDLERS: dict[Endpoint, OpenAIHandler] = _handlers(Api.OPENAI, OpenAIRoutes)
_BATCH_HANDLERS: dict[Endpoint, BatchHandler] = _handlers(Api.BATCH, BatchRoutes)
