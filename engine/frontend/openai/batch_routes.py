"""The Batch API's endpoints, under /v1 (OpenAIRoutes hands /v1/files and /v1/batches here):

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
not exist. `handle` answers at once from the runner's indexes in
memory, or returns a coroutine (the multipart split and file I/O on worker threads) that OpenAIRoutes runs
as a task. Off (every endpoint answers 501 saying how to turn it on) unless the server has a `--batch-dir`.

A download streams through the request's `ResponseStream` (http/types.py), a chunk at a time read on a
worker thread (download.py), awaiting the stream's `drain` before the next: N clients downloading a file of
the size of a key's whole storage quota hold N chunks, not N copies of the file, however slowly they read
(with --workers N the chunks cross the channel under its window of bytes: engine/workers/credit.py). The
body is chunked (close-delimited for an HTTP/1.0 client), without a Content-Length.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qs

import orjson

from ...openai.batch.download import FileChunks
from ...openai.batch.files import not_found
from ...openai.batch.multipart import parse_form
from ...openai.batch.runner import BatchRunner
from ...openai.errors import NOT_FOUND, NOT_IMPLEMENTED, OpenAIError, bad_request
from ...openai.protocol import parse_body
from ..http.types import Answer, HttpRequest, ResponseStream

_JSON = b"application/json"
_BINARY = b"application/octet-stream"

# An answer now, or a task's coroutine whose result is the answer (None: it streamed the answer)
Reply = Answer | Coroutine[Any, Any, Answer | None]


def _json(doc: Any) -> Answer:
    return 200, orjson.dumps(doc), _JSON, b""


class BatchRoutes:
    def __init__(self, runner: BatchRunner | None) -> None:
        self.runner = runner

    def handle(self, req: HttpRequest, parts: list[str]) -> Reply:
        """`parts`: the path after "v1" ("files" or "batches" first). Raises OpenAIError."""
        runner = self.runner
        if runner is None:
            raise OpenAIError(501, "The Batch API is off on this server: start it with --batch-dir PATH (a "
                                   "folder for its files and jobs).", NOT_IMPLEMENTED)
        owner = runner.owners.of_request(req.owner)
        method = req.method
        if parts[0] == "files":
            files = runner.files
            if len(parts) == 1:
                if method == b"GET":
                    return _json(files.list(owner, *_file_page(req.url)))
                _allow(method, b"POST", parts)
                return _upload(runner, owner, req)
            if len(parts) == 2:
                if method == b"DELETE":
                    return _json(files.delete(owner, parts[1]))
                _allow(method, b"GET", parts)
                return _json(files.get(owner, parts[1]))
            if len(parts) == 3 and parts[2] == "content":
                _allow(method, b"GET", parts)
                return _content(runner, owner, parts[1], req.stream)
        else:
            if len(parts) == 1:
                if method == b"GET":
                    return _json(runner.list(owner, *_page(req.url)))
                _allow(method, b"POST", parts)
                return _json(runner.create(owner, parse_body(req.body)))
            if len(parts) == 2:
                _allow(method, b"GET", parts)
                return _json(runner.get(owner, parts[1]))
            if len(parts) == 3 and parts[2] == "cancel":
                _allow(method, b"POST", parts)
                return _json(runner.cancel(owner, parts[1]))
        raise OpenAIError(404, f"Unknown request URL: {method.decode()} /v1/{'/'.join(parts)}.", NOT_FOUND,
                          code="unknown_url")


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


def _allow(method: bytes, allowed: bytes, parts: list[str]) -> None:
    if method != allowed:
        raise OpenAIError(405, f"{method.decode()} is not allowed on /v1/{'/'.join(parts)}; use "
                               f"{allowed.decode()}.")


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
