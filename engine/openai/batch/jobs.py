"""Batch jobs' state: on disk (`<batch-dir>/batches/`) and in an index in memory, read once at start, that
every retrieve and listing answers from (nothing reads the folder on the loop after that).

Per job: `<id>.json`, its owner and OpenAI's batch object as the client sees it (the state: replaced whole,
atomically, at every status change and at most once a second while results come in), and, while it runs,
two append-only result files, `<id>.output.jsonl` and `<id>.errors.jsonl`, one line per finished request in
OpenAI's batch output form. The result files are the truth about which requests are done: on resume
(`read_done`), a torn last line (a crash mid-write) is cut off and that request runs again, and the counts
are recomputed from the lines. When the job ends they become the owner's output and error files (files.py)
and the job's own copies are removed. A job that expires (runner.py) appends an expired result for each
request left, all at once after its requests have stopped; a resume finds such lines only if that append
was interrupted, cuts them off and expires the job again.

Each owner's jobs are bounded in number (limits.py `max_jobs_per_key`): past it, the oldest finished job is
forgotten (`forget_oldest_finished`), as a bounded history; its output files stay files.

The index and the documents are the loop's; `read_done` and `count_lines` read result files and run on a
worker thread.

Shared between replicas (`--batch-shared`, docs/replicas.md): one replica runs a job, the one holding its
claim (claims.py), and only it writes the job's document and result files. The others see the job by reading
the folder again (`SharedFolder.read`, then `apply`, keeping the jobs they run themselves as they are in
memory). A client's cancel reaching a replica that does not run the job leaves a `<id>.cancel` marker
(`request_cancel`) instead of writing the document: the replica running it (or the next to claim it) sees the
marker and cancels it, and until then every replica answers the job as `cancelling`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
import uuid
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .store import SharedFolder, make_private_dir, read_json, valid_id, write_json

CANCEL_MARKER = ".cancel"

log = logging.getLogger("hubserve.batch")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = ("24h",)
EXPIRED_CODE = "batch_expired"
_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class BatchStatus(enum.Enum):
    VALIDATING = "validating"
    FAILED = "failed"            # the input file did not validate: `errors` says where
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"          # its window ended first: results so far kept, the rest batch_expired
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})


@dataclass(slots=True)
class Job:
    """A job in the index: its owner (owners.py) and its batch object, which the runner updates in place."""

    owner: str
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    @property
    def status(self) -> BatchStatus:
        return BatchStatus(self.doc["status"])


def new_batch(batch_id: str, input_file_id: str, endpoint: str, window: str,
              metadata: dict[str, str] | None, window_secs: int) -> dict[str, Any]:
    """A new job's batch object; it expires `window_secs` after it was made."""
    now = int(time.time())
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": window,
            "status": BatchStatus.VALIDATING.value, "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + window_secs, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata}


def set_status(doc: dict[str, Any], status: BatchStatus) -> None:
    doc["status"] = status.value
    stamp = {BatchStatus.IN_PROGRESS: "in_progress_at", BatchStatus.FINALIZING: "finalizing_at",
             BatchStatus.COMPLETED: "completed_at", BatchStatus.FAILED: "failed_at",
             BatchStatus.CANCELLING: "cancelling_at", BatchStatus.CANCELLED: "cancelled_at",
             BatchStatus.EXPIRED: "expired_at"}.get(status)
    if stamp is not None:
        doc[stamp] = int(time.time())


def status_of(doc: dict[str, Any]) -> BatchStatus:
    return BatchStatus(doc["status"])


def expired_result(custom_id: str) -> bytes:
    """A request the job's window ended before, as a line of its error file (OpenAI's form: no response)."""
    return orjson.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": None,
                         "error": {"code": EXPIRED_CODE, "message": _EXPIRED_MESSAGE}}) + b"\n"


class JobStore:
    """The folder of jobs and its index. Result files are opened for appending by the runner
    (`result_path`)."""

    def __init__(self, root: Path) -> None:
        self.root = make_private_dir(root / "batches")
        self._jobs: dict[str, Job] = {}
        self._owners: dict[str, dict[str, Job]] = {}  # owner → its jobs by id, oldest first
        self._cancels: frozenset[str] = frozenset()  # shared: the ids with a cancel marker, as last read
        self._load()
        self.folder = SharedFolder(self.root, "batch_", CANCEL_MARKER)

    def apply(self, stored: dict[str, Any], cancels: frozenset[str], running: dict[str, Job]) -> None:
        """Shared: the folder as `SharedFolder.read` found it (batch id → stored document) and the ids with a
        cancel marker become the index; the jobs `running` here stay the objects the runner updates."""
        self._jobs.clear()
        self._owners.clear()
        self._cancels = cancels
        jobs = [running.get(batch_id) or _job(doc) for batch_id, doc in stored.items()]
        jobs.extend(job for batch_id, job in running.items() if batch_id not in stored)
        for job in sorted(jobs, key=lambda j: (j.doc["created_at"], j.id)):
            self._jobs[job.id] = job
            self._owners.setdefault(job.owner, {})[job.id] = job
        for job in self._jobs.values():
            if job.id not in running and job.id in cancels and job.status not in TERMINAL \
                    and job.status is not BatchStatus.FINALIZING:
                job.doc = {**job.doc, "status": BatchStatus.CANCELLING.value}  # as it will be

    def cancel_requested(self, batch_id: str) -> bool:
        """Whether a cancel marker was seen for the job at the last read."""
        return batch_id in self._cancels

    def request_cancel(self, batch_id: str) -> None:
        """Shared: ask the replica running the job to cancel it."""
        with open(self.root / f"{batch_id}{CANCEL_MARKER}", "ab"):
            pass
        self._cancels = self._cancels | {batch_id}

    def reread(self, job: Job) -> Job:
        """The job as its document on disk says now (a claim just taken: another replica may have finished
        it since the last read)."""
        try:
            return _job(read_json(self.root / f"{job.id}.json"))
        except (OSError, orjson.JSONDecodeError):
            return job

    def add(self, job: Job) -> None:
        self._jobs[job.id] = job
        self._owners.setdefault(job.owner, {})[job.id] = job
        self.save(job)

    def save(self, job: Job) -> None:
        write_json(self.root / f"{job.id}.json", {"owner": job.owner, "batch": job.doc})

    def get(self, owner: str, batch_id: str) -> Job | None:
        job = self._jobs.get(batch_id)
        return job if job is not None and job.owner == owner else None

    def of_owner(self, owner: str) -> list[Job]:
        """The owner's jobs, oldest first."""
        return list(self._owners.get(owner, {}).values())

    def all(self) -> list[Job]:
        return list(self._jobs.values())

    def forget_oldest_finished(self, owner: str) -> str | None:
        """Drop the owner's oldest job that has ended (its document and result files): its id, or None if
        none has."""
        job = next((j for j in self._owners.get(owner, {}).values() if j.status in TERMINAL), None)
        if job is None:
            return None
        del self._jobs[job.id]
        del self._owners[owner][job.id]
        for suffix in (".json", CANCEL_MARKER):
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{job.id}{suffix}").unlink()
        self.drop_results(job.id)
        return job.id

    def result_path(self, batch_id: str, errors: bool) -> Path:
        return self.root / f"{batch_id}.{'errors' if errors else 'output'}.jsonl"

    def drop_results(self, batch_id: str) -> None:
        """The job ended and its results are the owner's files now: its own copies go."""
        for errors in (False, True):
            with contextlib.suppress(FileNotFoundError):
                self.result_path(batch_id, errors).unlink()

    def read_done(self, batch_id: str) -> tuple[array[int], int, int]:
        """(the sorted input line numbers that have a result, results that succeeded, results that failed),
        from both result files, a line at a time; a torn last line is cut off, and so are expired results
        (an expiry that was interrupted: it runs again). A result names its line in its request id
        (`<batch id>-<line>`)."""
        done = array("q")
        counts = []
        for errors in (False, True):
            count = 0
            path = self.result_path(batch_id, errors)
            if path.is_file():
                for raw in _whole_lines(path, cut_expired=errors):
                    try:
                        request_id = orjson.loads(raw)["response"]["request_id"]
                        done.append(int(request_id.rpartition("-")[2]))
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                        continue
                    count += 1
            counts.append(count)
        return array("q", sorted(done)), counts[0], counts[1]

    def _load(self) -> None:
        """Every job document, once, at start (before any frontend listens); documents from before owners
        were kept belong to the keyless owner."""
        found = []
        for path in self.root.glob("batch_*.json"):
            if not valid_id(path.name[:-5], "batch_"):
                continue
            try:
                stored = read_json(path)
            except (OSError, orjson.JSONDecodeError):
                log.warning("batch jobs: %s is unreadable; skipped", path.name)
                continue
            found.append(_job(stored))
        for job in sorted(found, key=lambda j: (j.doc["created_at"], j.id)):
            self._jobs[job.id] = job
            self._owners.setdefault(job.owner, {})[job.id] = job


def _job(stored: dict[str, Any]) -> Job:
    """A stored document's job; one from before owners were kept is the keyless owner's."""
    return Job(stored["owner"], stored["batch"]) if "batch" in stored else Job("", stored)


def _whole_lines(path: Path, cut_expired: bool = False) -> Iterator[bytes]:
    """The file's complete lines, one at a time; a last line without its newline (torn by a crash) is cut
    off the file, and with `cut_expired` so is everything from the first expired result on."""
    with open(path, "r+b") as f:
        end = 0
        for raw in f:
            if not raw.endswith(b"\n") or cut_expired and _is_expired(raw):
                f.truncate(end)
                return
            end += len(raw)
            yield raw


def _is_expired(raw: bytes) -> bool:
    if EXPIRED_CODE.encode() not in raw:
        return False
    try:
        doc = orjson.loads(raw)
        return doc["response"] is None and doc["error"]["code"] == EXPIRED_CODE
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False
