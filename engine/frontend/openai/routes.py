"""The OpenAI-compatible endpoints on the HTTP port, under /v1 (HttpRoutes hands every /v1 path here):

    GET  /v1/models, /v1/models/{model}      the generative models that serve now, and their LoRA adapters
                                             (`model:adapter`)
    POST /v1/completions                     text completion
    POST /v1/chat/completions                chat, through the model folder's chat template
    /v1/files, /v1/batches                   the Batch API (batch_routes.py)

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
from typing import Any

import orjson

from ...openai.batch.runner import BatchRunner
from ...openai.errors import NOT_FOUND, OpenAIError, bad_request, from_engine
from ...openai.generation import Generation
from ...openai.protocol import ApiRequest, parse_body, parse_request
from ...openai.service import OpenAIService
from ..http.types import Answer, HttpRequest, OnDone, Pending, ResponseStream
from .batch_routes import BatchRoutes
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
    """One per server, beside HttpRoutes (which calls `handle` for /v1 paths)."""

    def __init__(self, service: OpenAIService, batches: BatchRunner | None = None) -> None:
        self.service = service
        self.batches = BatchRoutes(batches)
        self._tasks: set[asyncio.Future[Any]] = set()

    def handle(self, req: HttpRequest, parts: list[str], on_done: OnDone) -> Answer | Pending:
        """`parts`: the path's segments after "v1". Never raises."""
        try:
            return self._route(req, parts, on_done)
        except OpenAIError as e:
            return _error_answer(e)
        except Exception as e:  # a bug: answer 500, keep serving
            log.exception("OpenAI handler failed")
            return _error_answer(OpenAIError(500, f"internal error: {e}", "server_error"))

    def _route(self, req: HttpRequest, parts: list[str], on_done: OnDone) -> Answer | Pending:
        method = req.method
        if parts and parts[0] == "models" and len(parts) <= 2:
            if method not in (b"GET", b"HEAD"):
                raise OpenAIError(405, f"{method.decode()} is not allowed on /v1/models; use GET.")
            if len(parts) == 1:
                return _json(self.service.list_models())
            return _json(self.service.retrieve_model(parts[1]))
        chat = parts == ["chat", "completions"]
        if chat or parts == ["completions"]:
            if method != b"POST":
                raise OpenAIError(405, f"{method.decode()} is not allowed on /v1/{'/'.join(parts)}; "
                                       "use POST.")
            return self._generate(req, chat, on_done)
        if parts and parts[0] in ("files", "batches"):
            reply = self.batches.handle(req, parts)
            if isinstance(reply, tuple):
                return reply
            batch_task: asyncio.Future[Answer | None] = asyncio.ensure_future(reply)
            self._tasks.add(batch_task)
            batch_task.add_done_callback(self._tasks.discard)
            batch_task.add_done_callback(on_done)
            return _Task(batch_task, b"")
        raise OpenAIError(404, f"Unknown request URL: {method.decode()} /v1/{'/'.join(parts)}.", NOT_FOUND,
                          code="unknown_url")

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
    given = req.headers.get(b"x-request-id")
    if given is not None:
        text = given.decode("latin-1")
        if _REQUEST_ID.fullmatch(text):
            return text
        raise bad_request("X-Request-ID must be 1-128 characters of letters, digits and . _ : -",
                          "X-Request-ID")
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
