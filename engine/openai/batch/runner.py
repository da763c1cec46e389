"""Batch jobs run: `BatchRunner`, one per server, in the process that holds the engines (with `--workers
N`, the engine process, where /v1 requests are forwarded). Every method but the job tasks is called on the
loop by the routes (engine/frontend/openai/batch_routes.py), with the owner id (owners.py) the request acts
for: a job or file of another owner is 404.

A job is one task: validate the input file (feed.py: read a line at a time on a worker thread, one file at
a time over all jobs) → in_progress → each request through `OpenAIService.start` at `Priority.BATCH`, at
most `requests_in_flight` (`--batch-requests-in-flight`) at once over all jobs, each request read and parsed
only when a worker is free to submit it; the scheduler serves every interactive request first (preempting a
job's request for its seat or blocks), so the job fills what interactive traffic leaves → each result
appended to the job's result files (jobs.py) → the owner's output and error files → completed.

Expiry: a job has until its `expires_at` (created_at + `--batch-completion-window-secs`, OpenAI's 24 h by
default; fixed when the job is made) to finish its requests. Past it, its requests stop (those in the engine
are aborted), the job goes finalizing, every request without a result is appended to its error results as
`batch_expired` (OpenAI's form, counted as failed), and it ends `expired` with `expired_at`, its output
and error files as a completed job's. The window is checked once the input has validated (a bounded scan),
so a job resumed after a restart past its window expires at once; one with nothing left completes.

Tokens: a job's requests draw from the `tokens_per_minute` of the key that owns it, like its interactive
requests, and at the rate that budget refills: a request that does not fit yet waits for it (its worker
sleeps, holding no seat in the engine), since a batch promises a 24 h window rather than an answer now;
one larger than the whole minute fails, as it would interactively.

Bounds (limits.py): jobs validating or in progress per owner and over all owners (429 past either, with a
Retry-After), and jobs kept per owner (the oldest finished ones are forgotten).

Many replicas on one folder (`--batch-shared`, docs/replicas.md): every Batch API call first reads the folder
again (`refresh`), so any replica answers any call; a job runs on the replica that holds its claim
(claims.py: taken when the job is made, released when it ends), and every `--batch-claim-interval-secs` each
replica sweeps the folder (`_sweep`): it claims every unfinished job nobody holds (its replica stopped or
died) and runs it on from its results, and cancels the jobs it runs that a client cancelled through another
replica (a marker: jobs.py). The bounds on jobs in progress count the folder's jobs, whoever runs them.

Restarts: the state and each finished result are on disk as they happen. `resume()` (at start, once the
models loaded) restarts every job left validating or in_progress with the requests that have no result
yet, and finishes a job left cancelling as cancelled; a job whose owner is no configured key any more
fails. A server stopping (`close`) aborts the job's requests in the engine and leaves the job in_progress
on disk, for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from ...access.api_keys import ApiKey
from ...generate.core.request import Priority
from ..errors import RATE_LIMIT, OpenAIError, bad_request
from ..protocol import parse_request
from ..service import OpenAIService
from ..token_quotas import QuotaWait
from .claims import Claims
from .feed import JobFeed
from .files import FileStore, not_found, page, quota_exceeded
from .input import BatchLine
from .jobs import COMPLETION_WINDOWS, ENDPOINTS, TERMINAL, BatchStatus, Job, JobStore, new_batch, set_status
from .limits import BatchLimits
from .owners import Owners
from .store import new_id

log = logging.getLogger("hubserve.batch")

REQUESTS_IN_FLIGHT = 16  # the default: the jobs' requests in the engine at once, over all jobs
SAVE_EVERY_SECS = 1.0    # the job's counts on disk at most this often while it runs (and at every change)
RETRY_AFTER_SECS = 10    # told to a client refused for too many jobs in progress
MAX_QUOTA_WAIT_SECS = 60.0  # a request waiting for its key's tokens looks again at least this often
CLAIM_INTERVAL_SECS = 5.0  # the default: how often a shared replica looks for jobs nobody runs


class BatchRunner:
    def __init__(self, root: Path, service: OpenAIService, limits: BatchLimits,
                 requests_in_flight: int = REQUESTS_IN_FLIGHT, keys: tuple[ApiKey, ...] = (),
                 shared: bool = False, claim_interval_secs: float = CLAIM_INTERVAL_SECS) -> None:
        self.owners = Owners(keys)
        self.shared = shared
        self.files = FileStore(root, limits, shared)
        self.jobs = JobStore(root)
        self.claims = Claims(self.jobs.root, shared)
        self.claim_interval_secs = claim_interval_secs
        self._refreshing = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        self.limits = limits
        self.service = service
        self._live: dict[str, Job] = {}  # the jobs whose task runs, by id
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.requests_in_flight = requests_in_flight
        self._slots = asyncio.Semaphore(requests_in_flight)
        self._scans = asyncio.Semaphore(1)  # input files validated one at a time
        self._saved_at: dict[str, float] = {}
        self._closing = False

    # ------------------------------------------------------------------ the routes' side

    def create(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
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
        try:
            purpose = self.files.get(owner, input_file_id)["purpose"]
        except OpenAIError as e:
            e.param = "input_file_id"
            raise
        if purpose != "batch":
            raise bad_request(f"File {input_file_id} was not uploaded with purpose 'batch'.", "input_file_id")
        self._admit(owner)
        job = Job(owner, new_batch(new_id("batch_"), input_file_id, endpoint, window, metadata,
                                      self.limits.completion_window_secs))
        self.claims.try_claim(job.id)  # before its document exists: no other replica's sweep can take it
        self.jobs.add(job)
        self._start(job)
        return job.doc

    def get(self, owner: str, batch_id: str) -> dict[str, Any]:
        job = self.jobs.get(owner, batch_id)
        if job is None:
            raise not_found("Batch", batch_id)
        return job.doc

    def list(self, owner: str, limit: int, after: str | None) -> dict[str, Any]:
        """The owner's jobs, newest first, from the index in memory."""
        return page([j.doc for j in reversed(self.jobs.of_owner(owner))], limit, after)

    def cancel(self, owner: str, batch_id: str) -> dict[str, Any]:
        job = self.jobs.get(owner, batch_id)
        if job is None:
            raise not_found("Batch", batch_id)
        status = job.status
        if status in TERMINAL or status is BatchStatus.FINALIZING:
            raise OpenAIError(409, f"Cannot cancel a batch with status '{status.value}'.",
                              "invalid_request_error", None, "batch_not_cancellable")
        if self.shared and status is not BatchStatus.CANCELLING and batch_id not in self._live:
            # another replica runs it: it sees the marker at its next sweep
            self.jobs.request_cancel(batch_id)
            return {**job.doc, "status": BatchStatus.CANCELLING.value, "cancelling_at": int(time.time())}
        self._cancel_running(job)
        return job.doc

    def _admit(self, owner: str) -> None:
        """Room for one more job of `owner`: 429 past the jobs in progress allowed; the oldest finished job
        forgotten past the jobs kept."""
        limits = self.limits
        live = ([j for j in self.jobs.all() if j.status not in TERMINAL] if self.shared
                else list(self._live.values()))
        mine = sum(1 for j in live if j.owner == owner)
        total = len(live)
        if mine >= limits.max_live_jobs_per_key:
            raise _too_many(f"This API key has {mine} batches validating or in progress, the most it may "
                            f"have at once (--batch-max-live-jobs-per-key {limits.max_live_jobs_per_key}). "
                            "Try again once one has finished, or cancel one.")
        if total >= limits.max_live_jobs:
            raise _too_many(f"The server has {total} batches validating or in progress, the most "
                            f"it runs at once (--batch-max-live-jobs {limits.max_live_jobs}). Try again once "
                            "some have finished.")
        while len(self.jobs.of_owner(owner)) >= limits.max_jobs_per_key:
            forgotten = self.jobs.forget_oldest_finished(owner)
            if forgotten is not None:
                self.claims.forget(forgotten)
            else:
                raise quota_exceeded(f"This API key has {limits.max_jobs_per_key} batches in progress, the "
                                     "most it may keep (--batch-max-jobs-per-key).")

    # ------------------------------------------------------------------ lifecycle

    def resume(self) -> None:
        """At start: every job the last run left unfinished runs on (or ends, if it was being cancelled);
        one whose owner is no configured key any more fails. Shared: the jobs no other replica holds, and
        from now on every `claim_interval_secs` (`_sweep`)."""
        if self.shared:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            return
        for job in self.jobs.all():
            if job.status not in TERMINAL:
                self._resume(job)

    def _resume(self, job: Job) -> None:
        if not self.owners.known(job.owner):
            log.warning("batch %s: its API key is no longer configured; failed", job.id)
            self._fail(job, "owner_unknown", "The API key that created this batch is no longer "
                                             "configured on the server.")
            self.claims.release(job.id)
            return
        log.info("batch %s: resuming (%s)", job.id, job.doc["status"])
        self._start(job)

    async def refresh(self) -> None:
        """Shared: the files and jobs as the folder holds them now (read on a worker thread), before a Batch
        API call is answered and at every sweep."""
        async with self._refreshing:  # one read at a time, each applied before the next starts
            files = await asyncio.to_thread(self.files.folder.read)
            jobs, cancels = await asyncio.to_thread(self.jobs.folder.read)
            self.files.apply(files[0])
            self.jobs.apply(jobs, cancels, self._live)

    async def _sweep(self) -> None:
        """Shared, for the server's life: claim and run the unfinished jobs no replica holds; cancel the
        jobs running here that a client cancelled through another replica."""
        while True:
            try:
                await self.refresh()
                for job in self.jobs.all():
                    if job.id in self._live:
                        if self.jobs.cancel_requested(job.id):
                            self._cancel_running(job)
                    elif job.status not in TERMINAL and self.claims.try_claim(job.id):
                        self._take_over(self.jobs.reread(job))
            except OSError as e:  # the shared volume failing now and then: try again at the next sweep
                log.warning("batch jobs: sweeping %s failed: %s", self.jobs.root, e)
            except Exception:  # a bug, or a document we cannot read: log it and keep sweeping
                log.exception("batch jobs: sweeping %s failed", self.jobs.root)
            await asyncio.sleep(self.claim_interval_secs)

    def _take_over(self, job: Job) -> None:
        """A job claimed here: run it on from its results (its replica stopped or died), unless it ended
        meanwhile."""
        if job.status in TERMINAL:
            self.claims.release(job.id)
            return
        if self.jobs.cancel_requested(job.id) and job.status is not BatchStatus.FINALIZING:
            set_status(job.doc, BatchStatus.CANCELLING)
            self.jobs.save(job)
        log.info("batch %s: claimed by this replica", job.id)
        self._resume(job)

    def _cancel_running(self, job: Job) -> None:
        """Cancel a job this replica runs (a client's cancel, here or, by its marker, through another)."""
        if job.status in TERMINAL or job.status in (BatchStatus.CANCELLING, BatchStatus.FINALIZING):
            return
        set_status(job.doc, BatchStatus.CANCELLING)
        self.jobs.save(job)
        task = self._tasks.get(job.id)
        if task is not None:
            task.cancel()  # the task sees the status and finishes the job as cancelled

    async def close(self) -> None:
        """The server stops: every job's requests are aborted; their state stays on disk as it is (shared:
        their claims are released, for another replica's next sweep)."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self.claims.release_all()

    def _start(self, job: Job) -> None:
        self._live[job.id] = job
        self._tasks[job.id] = asyncio.get_running_loop().create_task(self._run(job))

    def _fail(self, job: Job, code: str, message: str) -> None:
        job.doc["errors"] = {"object": "list", "data": [{"code": code, "message": message, "param": None,
                                                         "line": None}]}
        set_status(job.doc, BatchStatus.FAILED)
        self.jobs.save(job)

    # ------------------------------------------------------------------ a job

    async def _run(self, job: Job) -> None:
        try:
            expired = False
            if job.status is not BatchStatus.CANCELLING:
                expired = await self._work(job)
            await self._finish(job, expired)
        except asyncio.CancelledError:
            if self._closing:
                return  # stays in_progress on disk: resumed at the next start
            await self._finish(job)  # cancelled by the client
        except Exception as e:
            log.exception("batch %s failed", job.id)
            self._fail(job, "server_error", str(e))
        finally:
            if not self._closing:
                self._live.pop(job.id, None)
                self._tasks.pop(job.id, None)
                self._saved_at.pop(job.id, None)
                self.claims.release(job.id)  # after its last save: a replica that claims it sees it ended

    async def _work(self, job: Job) -> bool:
        """Validate the input and run its requests until they are done or the job's window ends; True if
        it ended first (the requests left are written as expired)."""
        doc = job.doc
        try:
            feed = JobFeed(self.files.path(job.owner, doc["input_file_id"]), doc["endpoint"])
        except (OpenAIError, FileNotFoundError):
            self._fail(job, "invalid_file", f"The input file {doc['input_file_id']} was deleted before the "
                                            "batch could run.")
            return False
        try:
            async with self._scans:
                total, errors = await feed.scan()
            if errors:
                doc["errors"] = {"object": "list", "data": errors}
                set_status(doc, BatchStatus.FAILED)
                self.jobs.save(job)
                return False
            done, ok, failed = await asyncio.to_thread(self.jobs.read_done, job.id)
            doc["request_counts"] = {"total": total, "completed": ok, "failed": failed}
            if job.status is BatchStatus.VALIDATING:
                set_status(doc, BatchStatus.IN_PROGRESS)
            self.jobs.save(job)
            left_secs = doc["expires_at"] - time.time()
            if left_secs > 0:
                ended = await self._requests(job, feed, done, total - len(done), left_secs)
                if not ended:
                    return False
            return await self._expire(job, feed)
        finally:
            await feed.close()

    async def _requests(self, job: Job, feed: JobFeed, done: Sequence[int], todo: int,
                        left_secs: float) -> bool:
        """Run the `todo` requests without a result; True if the window (`left_secs` more) ended first."""
        feed.start(done)
        chat = job.doc["endpoint"] == "/v1/chat/completions"
        with open(self.jobs.result_path(job.id, False), "ab") as out, \
                open(self.jobs.result_path(job.id, True), "ab") as err:

            async def worker() -> None:
                while (line := await feed.next()) is not None:
                    await self._one(job, line, chat, out, err)

            tasks = [asyncio.ensure_future(worker()) for _ in range(min(self.requests_in_flight, todo))]
            if not tasks:
                return False
            try:
                ended, running = await asyncio.wait(tasks, timeout=left_secs,
                                                    return_when=asyncio.FIRST_EXCEPTION)
                for task in ended:
                    if (error := task.exception()) is not None:
                        raise error  # a bug: the job fails
                return bool(running)  # still running: the window ended
            finally:
                for task in tasks:
                    task.cancel()  # the requests in the engine are aborted (_answer)
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _expire(self, job: Job, feed: JobFeed) -> bool:
        """The window ended: finalizing (no cancel now), each request without a result appended to the
        error results as expired, the counts from the files. True if there was any (else it completes)."""
        set_status(job.doc, BatchStatus.FINALIZING)
        self.jobs.save(job)
        done, ok, failed = await asyncio.to_thread(self.jobs.read_done, job.id)
        expired = await feed.write_expired(done, self.jobs.result_path(job.id, True))
        job.doc["request_counts"].update(completed=ok, failed=failed + expired)
        log.info("batch %s: its window ended with %d requests left", job.id, expired)
        return expired > 0

    async def _one(self, job: Job, line: BatchLine, chat: bool, out: IO[bytes],
                   err: IO[bytes]) -> None:
        request_id = f"{job.id}-{line.line}"  # read_done finds the line again in this id
        status, body = await self._answer(job.owner, line, chat, request_id)
        result = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
                  "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}
        target = out if status == 200 else err
        target.write(orjson.dumps(result) + b"\n")
        target.flush()
        counts = job.doc["request_counts"]
        counts["completed" if status == 200 else "failed"] += 1
        now = time.monotonic()
        if now - self._saved_at.get(job.id, 0.0) >= SAVE_EVERY_SECS:
            self._saved_at[job.id] = now
            self.jobs.save(job)

    async def _answer(self, owner: str, line: BatchLine, chat: bool, request_id: str
                      ) -> tuple[int, dict[str, Any]]:
        """One request's (status, body), as the interactive endpoint would answer it. It takes a seat in the
        engine (one of requests_in_flight) only once its key's tokens are there."""
        try:
            api = parse_request(line.body, chat)
            if api.stream:
                raise bad_request("Streaming is not available in a batch: leave 'stream' out.", "stream")
            while True:
                async with self._slots:
                    try:
                        gen = await self.service.start(api, request_id, owner, Priority.BATCH)
                    except QuotaWait as wait:
                        pause = min(max(wait.secs, 0.01), MAX_QUOTA_WAIT_SECS)
                    else:
                        try:
                            await gen.done
                        except asyncio.CancelledError:
                            gen.abort()
                            raise
                        return 200, self.service.answer(gen, api, int(time.time()))
                await asyncio.sleep(pause)  # the key's minute refills at its own rate
        except OpenAIError as e:
            return e.status, e.body()
        except Exception as e:  # a bug: this request fails, the job goes on
            log.exception("batch request %s failed", request_id)
            return 500, OpenAIError(500, f"internal error: {e}", "server_error").body()

    async def _finish(self, job: Job, expired: bool = False) -> None:
        """The job ended (done, expired, or cancelled): its result files become the owner's output and error
        files."""
        if job.status is BatchStatus.FAILED:
            return
        cancelled = job.status is BatchStatus.CANCELLING
        if not cancelled and not expired:
            set_status(job.doc, BatchStatus.FINALIZING)
            self.jobs.save(job)
        for errors, field in ((False, "output_file_id"), (True, "error_file_id")):
            path = self.jobs.result_path(job.id, errors)
            has_lines = path.is_file() and path.stat().st_size > 0
            if has_lines or not errors:  # an output file always; an error file when something failed
                name = f"{job.id}_{'error' if errors else 'output'}.jsonl"
                out = await asyncio.to_thread(self.files.write_output, job.owner, name,
                                              path if has_lines else None)
                self.files.register(job.owner, out, None)
                job.doc[field] = out["id"]
        if cancelled:
            _, ok, failed = await asyncio.to_thread(self.jobs.read_done, job.id)
            job.doc["request_counts"].update(completed=ok, failed=failed)
        set_status(job.doc, BatchStatus.CANCELLED if cancelled else
                   BatchStatus.EXPIRED if expired else BatchStatus.COMPLETED)
        self.jobs.save(job)
        self.jobs.drop_results(job.id)
        log.info("batch %s: %s (%s)", job.id, job.doc["status"], job.doc["request_counts"])


def _too_many(message: str) -> OpenAIError:
    return OpenAIError(429, message, RATE_LIMIT, None, "rate_limit_exceeded",
                       retry_after_secs=RETRY_AFTER_SECS)
