"""Batch jobs run: `BatchRunner`, one per server, in the process that holds the engines (with `--workers
N`, the engine process, where /v1 requests are forwarded). Every method but the job tasks is called on the
loop by the routes (engine/frontend/openai_batch_routes.py).

A job is one task: validate the input file (on a worker thread) → in_progress → each request through
`OpenAIService.start` at `Priority.BATCH`, at most `requests_in_flight` (`--batch-requests-in-flight`) at
once over all jobs; the scheduler serves every interactive request first (preempting a job's request for
its seat or blocks), so the job fills what interactive traffic leaves → each result appended to
the job's result files (jobs.py) → the output and error files → completed.

Restarts: the state and each finished result are on disk as they happen. `resume()` (at start, once the
models loaded) restarts every job left validating or in_progress with the requests that have no result
yet, and finishes a job left cancelling as cancelled. A server stopping (`close`) aborts the job's requests
in the engine and leaves the job in_progress on disk, for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from ...generate.request import Priority
from ..errors import OpenAIError, bad_request
from ..protocol import parse_request
from ..service import OpenAIService
from .files import FileLimits, FileStore, not_found
from .jobs import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    TERMINAL,
    BatchLine,
    BatchStatus,
    JobStore,
    new_batch,
    parse_input,
    set_status,
    status_of,
)
from .store import new_id

log = logging.getLogger("hubserve.batch")

REQUESTS_IN_FLIGHT = 16  # the default: the jobs' requests in the engine at once, over all jobs
SAVE_EVERY_SECS = 1.0    # the job's counts on disk at most this often while it runs (and at every change)


class BatchRunner:
    def __init__(self, root: Path, service: OpenAIService, limits: FileLimits,
                 requests_in_flight: int = REQUESTS_IN_FLIGHT) -> None:
        self.files = FileStore(root, limits)
        self.jobs = JobStore(root)
        self.service = service
        self._docs: dict[str, dict[str, Any]] = {}  # the jobs not yet ended, by id (the loop's copy)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.requests_in_flight = requests_in_flight
        self._slots = asyncio.Semaphore(requests_in_flight)
        self._saved_at: dict[str, float] = {}
        self._closing = False

    # ------------------------------------------------------------------ the routes' side

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise bad_request("Missing required parameter: 'input_file_id'.", "input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise bad_request(f"Invalid endpoint {endpoint!r}: a batch's endpoint must be one of "
                              f"{', '.join(ENDPOINTS)}.", "endpoint", "invalid_value")
        window = body.get("completion_window")
        if window not in COMPLETION_WINDOWS:
            raise bad_request(f"Invalid completion_window {window!r}: it must be '24h'.", "completion_window",
                              "invalid_value")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items())):
            raise bad_request("metadata must be an object of at most 16 string keys (64 characters) and "
                              "string values (512 characters).", "metadata")
        if self.files.get(input_file_id)["purpose"] != "batch":
            raise bad_request(f"File {input_file_id} was not uploaded with purpose 'batch'.", "input_file_id")
        doc = new_batch(new_id("batch_"), input_file_id, endpoint, window, metadata)
        self.jobs.save(doc)
        self._start(doc)
        return doc

    def get(self, batch_id: str) -> dict[str, Any]:
        doc = self._docs.get(batch_id) or self.jobs.load(batch_id)
        if doc is None:
            raise not_found("Batch", batch_id)
        return doc

    def list(self, limit: int, after: str | None) -> dict[str, Any]:
        docs = [self._docs.get(d["id"], d) for d in self.jobs.all()]
        if after is not None:
            ids = [d["id"] for d in docs]
            docs = docs[ids.index(after) + 1:] if after in ids else []
        page = docs[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(docs) > limit}

    def cancel(self, batch_id: str) -> dict[str, Any]:
        doc = self.get(batch_id)
        status = status_of(doc)
        if status in TERMINAL or status is BatchStatus.FINALIZING:
            raise OpenAIError(409, f"Cannot cancel a batch with status '{status.value}'.",
                              "invalid_request_error", None, "batch_not_cancellable")
        if status is not BatchStatus.CANCELLING:
            set_status(doc, BatchStatus.CANCELLING)
            self.jobs.save(doc)
            task = self._tasks.get(batch_id)
            if task is not None:
                task.cancel()  # the task sees the status and finishes the job as cancelled
        return doc

    # ------------------------------------------------------------------ lifecycle

    def resume(self) -> None:
        """At start: every job the last run left unfinished runs on (or ends, if it was being cancelled)."""
        for doc in self.jobs.all():
            if status_of(doc) not in TERMINAL:
                log.info("batch %s: resuming (%s)", doc["id"], doc["status"])
                self._start(doc)

    async def close(self) -> None:
        """The server stops: every job's requests are aborted; their state stays on disk as it is."""
        self._closing = True
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _start(self, doc: dict[str, Any]) -> None:
        self._docs[doc["id"]] = doc
        task = asyncio.get_running_loop().create_task(self._run(doc))
        self._tasks[doc["id"]] = task

    # ------------------------------------------------------------------ a job

    async def _run(self, doc: dict[str, Any]) -> None:
        batch_id = doc["id"]
        try:
            if status_of(doc) is not BatchStatus.CANCELLING:
                await self._work(doc)
            await self._finish(doc)
        except asyncio.CancelledError:
            if self._closing:
                return  # stays in_progress on disk: resumed at the next start
            await self._finish(doc)  # cancelled by the client
        except Exception as e:
            log.exception("batch %s failed", batch_id)
            doc["errors"] = {"object": "list", "data": [{"code": "server_error", "message": str(e),
                                                         "param": None, "line": None}]}
            set_status(doc, BatchStatus.FAILED)
            self.jobs.save(doc)
        finally:
            if not self._closing:
                self._docs.pop(batch_id, None)
                self._tasks.pop(batch_id, None)

    async def _work(self, doc: dict[str, Any]) -> None:
        batch_id = doc["id"]
        path = self.files.content_path(doc["input_file_id"])
        lines, errors = await asyncio.to_thread(_read_input, path, doc["endpoint"])
        if errors:
            doc["errors"] = {"object": "list", "data": errors}
            set_status(doc, BatchStatus.FAILED)
            self.jobs.save(doc)
            return
        done_ok = self.jobs.read_results(batch_id, errors=False)
        done_failed = self.jobs.read_results(batch_id, errors=True)
        doc["request_counts"] = {"total": len(lines), "completed": len(done_ok), "failed": len(done_failed)}
        if status_of(doc) is BatchStatus.VALIDATING:
            set_status(doc, BatchStatus.IN_PROGRESS)
        self.jobs.save(doc)
        todo = [line for line in lines if line.custom_id not in done_ok and line.custom_id not in done_failed]
        chat = doc["endpoint"] == "/v1/chat/completions"
        pending = iter(todo)  # shared by the job's workers: each takes the next request when it is free
        with open(self.jobs.result_path(batch_id, False), "ab") as out, \
                open(self.jobs.result_path(batch_id, True), "ab") as err:

            async def worker() -> None:
                for line in pending:
                    await self._one(doc, line, chat, out, err)

            tasks = [asyncio.ensure_future(worker()) for _ in range(min(self.requests_in_flight, len(todo)))]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, doc: dict[str, Any], line: BatchLine, chat: bool, out: Any, err: Any) -> None:
        async with self._slots:
            request_id = f"{doc['id']}-{line.line}"
            status, body = await self._answer(line, chat, request_id)
        result = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
                  "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}
        target = out if status == 200 else err
        target.write(orjson.dumps(result) + b"\n")
        target.flush()
        counts = doc["request_counts"]
        counts["completed" if status == 200 else "failed"] += 1
        now = time.monotonic()
        if now - self._saved_at.get(doc["id"], 0.0) >= SAVE_EVERY_SECS:
            self._saved_at[doc["id"]] = now
            self.jobs.save(doc)

    async def _answer(self, line: BatchLine, chat: bool, request_id: str) -> tuple[int, dict[str, Any]]:
        """One request's (status, body), as the interactive endpoint would answer it."""
        try:
            api = parse_request(line.body, chat)
            if api.stream:
                raise bad_request("Streaming is not available in a batch: leave 'stream' out.", "stream")
            gen = await self.service.start(api, request_id, None, Priority.BATCH)
            try:
                await gen.done
            except asyncio.CancelledError:
                gen.abort()
                raise
            return 200, self.service.answer(gen, api, int(time.time()))
        except OpenAIError as e:
            return e.status, e.body()
        except Exception as e:  # a bug: this request fails, the job goes on
            log.exception("batch request %s failed", request_id)
            return 500, OpenAIError(500, f"internal error: {e}", "server_error").body()

    async def _finish(self, doc: dict[str, Any]) -> None:
        """The job ended (done, or cancelled): its result files become its output and error files."""
        cancelled = status_of(doc) is BatchStatus.CANCELLING
        if status_of(doc) is BatchStatus.FAILED:
            return
        if not cancelled:
            set_status(doc, BatchStatus.FINALIZING)
            self.jobs.save(doc)
        batch_id = doc["id"]
        for errors, field in ((False, "output_file_id"), (True, "error_file_id")):
            path = self.jobs.result_path(batch_id, errors)
            data = path.read_bytes() if path.is_file() else b""
            if data or not errors:
                name = f"{batch_id}_{'error' if errors else 'output'}.jsonl"
                doc[field] = (await asyncio.to_thread(self.files.add, name, "batch_output", data))["id"]
        if cancelled:
            ok = self.jobs.read_results(batch_id, errors=False)
            failed = self.jobs.read_results(batch_id, errors=True)
            doc["request_counts"].update(completed=len(ok), failed=len(failed))
        set_status(doc, BatchStatus.CANCELLED if cancelled else BatchStatus.COMPLETED)
        self.jobs.save(doc)
        log.info("batch %s: %s (%s)", batch_id, doc["status"], doc["request_counts"])


def _read_input(path: Path, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    return parse_input(path.read_bytes(), endpoint)
