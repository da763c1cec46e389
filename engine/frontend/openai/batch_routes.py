"""The Batch API's endpoints, under /v1, each a row of the endpoint table (frontend/endpoints.py, `Api.BATCH`)
whose handler is a method here; OpenAIRoutes calls it:

    POST   /v1/files                    upload a JSONL of requests (multipart/form-data, purpose "batch")
    GET    /v1/files                    the caller's files, newest first (?purpose= ?limit= ?order= ?after=)
    GET    /v1/files/{id}               its file object
    DELETE /v1/files/{id}               delete it
    GET    /v1/files/{id}/content       its bytes (inputs, and a job's output and error files), streamed
    POST   /v1/batches                  a job: input_file_id, endpoint, completion_window "24h", metadata
    GET    /v1/batches                  the caller's jobs, newest first (?limit=, ?after=)
    GET    /v1/batches/{id}             one job
    POST   /v1/batches/{id}/cancel      cancel it

Every endpoint acts for the request's owner, the owner id of its key as the access policy admitted it
(`HttpRequest.owner`; engine/openai/batch/owners.py): another key's files and jobs answer 404 as if they did
not exist. A handler answers at once from the runner's indexes in memory, or returns a coroutine (the
multipart split and file I/O on worker threads) that OpenAIRoutes runs as a task. Off (every endpoint, and
every other path under /v1/files and /v1/batches, answers 501 saying how to turn it on: OpenAIRoutes checks
that first) unless the server has a `--batch-dir`.

With `--batch-shared` (replicas sharing one `--batch-dir`: docs/replicas.md) every handler first reads the
folder again (`BatchRunner.refresh`, on worker threads), so it answers for what any replica wrote.

A download streams through the request's `ResponseStream` (http/types.py), a chunk at a time read on a
worker thread (download.py), awaiting the stream's `drain` before the next: N clients downloading a file of
the size of a key's whole storage quota hold N chunks, not N copies of the file, however slowly they read
(with --workers N the chunks cross the channel under its window of bytes: engine/workers/credit.py). The
body is chunked (close-delimited for an HTTP/1.0 client), without a Content-Length.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import parse_qs

import orjson

from ...openai.batch.download import FileChunks
from ...openai.batch.files import not_found
from ...openai.batch.multipart import parse_form
from ...openai.batch.runner import BatchRunner
from ...openai.errors import NOT_FOUND, OpenAIError, bad_request
from ...openai.protocol import parse_body
from ..http.path import HttpTarget
from ..http.types import Answer, HttpRequest, ResponseStream

_JSON = b"application/json"
_BINARY = b"application/octet-stream"

# An answer now, or a task's coroutine whose result is the answer (None: it streamed the answer)
Reply = Answer | Coroutine[Any, Any, Answer | None]


def _json(doc: Any) -> Answer:
    return 200, orjson.dumps(doc), _JSON, b""


class BatchRoutes:
    """The Batch API's handlers, one per row of the endpoint table whose `api` is BATCH
    (frontend/endpoints.py), each called by OpenAIRoutes as handler(req, target, owner) once it has found the
    Batch API on, the owner known and the row's methods right. Each raises OpenAIError."""

    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner

    def files(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        if req.method == b"GET":
            return self._fresh(lambda: _json(self.runner.files.list(owner, *_file_page(req.url))))
        return self._fresh(lambda: _upload(self.runner, owner, req))

    def file(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        if req.method == b"DELETE":
            return self._fresh(lambda: _json(self.runner.files.delete(owner, target.name)))
        return self._fresh(lambda: _json(self.runner.files.get(owner, target.name)))

    def file_content(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        return self._fresh(lambda: _content(self.runner, owner, target.name, req.stream))

    def batches(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        if req.method == b"GET":
            return self._fresh(lambda: _json(self.runner.list(owner, *_page(req.url))))
        return self._fresh(lambda: _json(self.runner.create(owner, parse_body(req.body))))

    def batch(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        return self._fresh(lambda: _json(self.runner.get(owner, target.name)))

    def cancel_batch(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        return self._fresh(lambda: _json(self.runner.cancel(owner, target.name)))

    def _fresh(self, answer: Callable[[], Reply]) -> Reply:
        """`answer()` now, or, shared, once the runner has read the folder again."""
        if not self.runner.shared:
            return answer()

        async def after_refresh() -> Answer | None:
            await self.runner.refresh()
            reply = answer()
            return await reply if inspect.iscoroutine(reply) else reply  # type: ignore[return-value]

        return after_refresh()

    def unknown_url(self, req: HttpRequest, target: HttpTarget, owner: str) -> Reply:
        raise unknown_url(req.method, target)


def unknown_url(method: bytes, target: HttpTarget) -> OpenAIError:
    """OpenAI's 404 for a path under /v1 that names no endpoint."""
    return OpenAIError(404, f"Unknown request URL: {method.decode()} /v1/{'/'.join(target.segments[1:])}.",
                       NOT_FOUND, code="unknown_url")


async def _upload(runner: BatchRunner, owner: str, req: HttpRequest) -> Answer:
    """The form split on a thread (views into the body, no copies), room reserved in the owner's quota, the
    file checked and written on a thread. Once the write has started it is registered (or its room given
    back) when it ends, even if the client has left meanwhile."""
    fields = await asyncio.to_thread(parse_form, req.headers.get(b"content-type", b""), req.body)
    purpose = fields.get("purpose")
    upload = fields.get("file")
    if purpose is None:
        raise bad_request("Missing required parameter: 'purpose'.", "purpose")
    if upload is None or upload.filename is None:
        raise bad_request("Missing required parameter: 'file' (a file field of the form).", "file")
    files = runner.files
    reservation = files.reserve(owner, len(upload.data))
    kind = bytes(purpose.data).decode("utf-8", "replace")
    written = asyncio.get_running_loop().run_in_executor(
        None, files.write_upload, owner, upload.filename[:255], kind, upload.data)

    def settle(f: asyncio.Future[dict[str, Any]]) -> None:
        if f.cancelled() or f.exception() is not None:
            files.release(reservation)
        else:
            files.register(owner, f.result(), reservation)

    written.add_done_callback(settle)  # before the answer's own callback: registered when the client hears
    return _json(await asyncio.shield(written))


def _content(runner: BatchRunner, owner: str, file_id: str, stream: ResponseStream | None) -> Reply:
    path = runner.files.path(owner, file_id)  # a 404 at once
    if stream is None:  # a caller with no connection to stream to (none does today)
        raise OpenAIError(500, "internal error: no stream to write to", "server_error")

    async def send() -> None:
        try:
            chunks = await FileChunks.open(path)
        except FileNotFoundError:  # deleted since: as if it never was
            raise not_found("File", file_id) from None
        try:
            stream.start(200, _BINARY)
            while chunk := await chunks.read():
                stream.send(chunk)
                await stream.drain()  # the next chunk once the client has taken enough of this one
        finally:
            await chunks.close()

    return send()


def _query(url: bytes) -> dict[str, list[str]]:
    return parse_qs(url.partition(b"?")[2].decode("latin-1"))


def _limit(query: dict[str, list[str]], default: int, most: int) -> int:
    try:
        limit = int(query.get("limit", [str(default)])[0])
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise bad_request(f"limit must be an integer from 1 to {most}.", "limit")
    return limit


def _page(url: bytes) -> tuple[int, str | None]:
    """A job listing's ?limit= (1-100, default 20, as OpenAI's) and ?after=."""
    query = _query(url)
    return _limit(query, 20, 100), query.get("after", [None])[0]


def _file_page(url: bytes) -> tuple[str | None, int, str | None, bool]:
    """A file listing's ?purpose=, ?limit= (1-10000, default 10000, as OpenAI's), ?after= and ?order= (desc,
    the default: newest first)."""
    query = _query(url)
    order = query.get("order", ["desc"])[0]
    if order not in ("asc", "desc"):
        raise bad_request("order must be 'asc' or 'desc'.", "order")
    return (query.get("purpose", [None])[0], _limit(query, 10_000, 10_000), query.get("after", [None])[0],
            order == "desc")
