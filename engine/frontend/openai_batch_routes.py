"""The Batch API's endpoints, under /v1 (OpenAIRoutes hands /v1/files and /v1/batches here):

    POST /v1/files                      upload a JSONL of requests (multipart/form-data, purpose "batch")
    GET  /v1/files/{id}                 its file object
    GET  /v1/files/{id}/content         its bytes (inputs, and a job's output and error files)
    POST /v1/batches                    a job: input_file_id, endpoint, completion_window "24h", metadata
    GET  /v1/batches                    the jobs, newest first (?limit=, ?after=)
    GET  /v1/batches/{id}               one job
    POST /v1/batches/{id}/cancel        cancel it

`handle` answers at once, or returns a coroutine (file I/O off the loop) that OpenAIRoutes runs as a task.
Off (every endpoint answers 501 saying how to turn it on) unless the server has a `--batch-dir`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qs

import orjson

from ..openai.batch.multipart import parse_form
from ..openai.batch.runner import BatchRunner
from ..openai.errors import NOT_FOUND, NOT_IMPLEMENTED, OpenAIError, bad_request
from ..openai.protocol import parse_body
from .http_types import Answer, HttpRequest

_JSON = b"application/json"
_BINARY = b"application/octet-stream"

Reply = Answer | Coroutine[Any, Any, Answer]


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
        method = req.method
        if parts[0] == "files":
            if len(parts) == 1:
                _allow(method, b"POST", parts)
                return self._upload(runner, req)
            if len(parts) == 2:
                _allow(method, b"GET", parts)
                return _json(runner.files.get(parts[1]))
            if len(parts) == 3 and parts[2] == "content":
                _allow(method, b"GET", parts)
                return _content(runner, parts[1])
        else:
            if len(parts) == 1:
                if method == b"GET":
                    return _json(runner.list(*_page(req.url)))
                _allow(method, b"POST", parts)
                return _json(runner.create(parse_body(req.body)))
            if len(parts) == 2:
                _allow(method, b"GET", parts)
                return _json(runner.get(parts[1]))
            if len(parts) == 3 and parts[2] == "cancel":
                _allow(method, b"POST", parts)
                return _json(runner.cancel(parts[1]))
        raise OpenAIError(404, f"Unknown request URL: {method.decode()} /v1/{'/'.join(parts)}.", NOT_FOUND,
                          code="unknown_url")

    def _upload(self, runner: BatchRunner, req: HttpRequest) -> Reply:
        fields = parse_form(req.headers.get(b"content-type", b""), bytes(req.body))
        purpose = fields.get("purpose")
        upload = fields.get("file")
        if purpose is None:
            raise bad_request("Missing required parameter: 'purpose'.", "purpose")
        if upload is None or upload.filename is None:
            raise bad_request("Missing required parameter: 'file' (a file field of the form).", "file")
        name, kind, data = upload.filename, purpose.data.decode("utf-8", "replace"), upload.data

        async def store() -> Answer:
            return _json(await asyncio.to_thread(runner.files.upload, name[:255], kind, data))

        return store()


def _content(runner: BatchRunner, file_id: str) -> Reply:
    runner.files.get(file_id)  # a 404 at once

    async def read() -> Answer:
        return 200, await asyncio.to_thread(runner.files.content, file_id), _BINARY, b""

    return read()


def _allow(method: bytes, allowed: bytes, parts: list[str]) -> None:
    if method != allowed:
        raise OpenAIError(405, f"{method.decode()} is not allowed on /v1/{'/'.join(parts)}; use "
                               f"{allowed.decode()}.")


def _page(url: bytes) -> tuple[int, str | None]:
    query = parse_qs(url.partition(b"?")[2].decode("latin-1"))
    try:
        limit = int(query.get("limit", ["20"])[0])
    except ValueError:
        raise bad_request("limit must be an integer from 1 to 100.", "limit") from None
    if not 1 <= limit <= 100:
        raise bad_request("limit must be an integer from 1 to 100.", "limit")
    return limit, query.get("after", [None])[0]
