"""A batch job's state, on disk (`<batch-dir>/batches/`), and its input checked line by line.

Per job: `<id>.json`, OpenAI's batch object as the client sees it (the state: replaced whole, atomically,
at every status change and at most once a second while results come in), and two append-only result files,
`<id>.output.jsonl` and `<id>.errors.jsonl`, one line per finished request, in OpenAI's batch output form.
The result files are the truth about which requests are done: on resume (`read_results`), a torn last line
(a crash mid-write) is cut off and that request runs again, and the counts are recomputed from the lines.
When the job ends they become the job's output and error files (files.py).

Pure apart from the file reads and writes; the runner (runner.py) calls it on the loop.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .store import make_private_dir, read_json, valid_id, write_json

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
COMPLETION_WINDOWS = ("24h",)
WINDOW_SECS = 24 * 3600


class BatchStatus(enum.Enum):
    VALIDATING = "validating"
    FAILED = "failed"            # the input file did not validate: `errors` says where
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"          # never set here: jobs are not expired (README)
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of the input: its line (1-based), `custom_id` and body."""

    line: int
    custom_id: str
    body: dict[str, Any]


def new_batch(batch_id: str, input_file_id: str, endpoint: str, window: str,
              metadata: dict[str, str] | None) -> dict[str, Any]:
    now = int(time.time())
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": window,
            "status": BatchStatus.VALIDATING.value, "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + WINDOW_SECS, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata}


def set_status(doc: dict[str, Any], status: BatchStatus) -> None:
    doc["status"] = status.value
    stamp = {BatchStatus.IN_PROGRESS: "in_progress_at", BatchStatus.FINALIZING: "finalizing_at",
             BatchStatus.COMPLETED: "completed_at", BatchStatus.FAILED: "failed_at",
             BatchStatus.CANCELLING: "cancelling_at", BatchStatus.CANCELLED: "cancelled_at"}.get(status)
    if stamp is not None:
        doc[stamp] = int(time.time())


def status_of(doc: dict[str, Any]) -> BatchStatus:
    return BatchStatus(doc["status"])


def parse_input(data: bytes, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The input file's requests, or the errors that fail the batch (OpenAI's codes, with their lines).
    Each line: {"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def fail(code: str, message: str, line: int, param: str | None = None) -> None:
        if len(errors) < 100:  # enough to fix a file by; a whole file of errors helps nobody
            errors.append({"code": code, "message": message, "param": param, "line": line})

    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
            continue
        if not isinstance(doc, dict):
            fail("invalid_json_line", "Each line must be a JSON object.", number)
            continue
        custom_id = doc.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            fail("missing_required_parameter", "Missing required parameter: 'custom_id'.", number,
                 "custom_id")
            continue
        if custom_id in seen:
            fail("duplicate_custom_id", f"The custom_id '{custom_id[:64]}' appears more than once; each "
                                        "request of a batch needs its own.", number, "custom_id")
            continue
        seen.add(custom_id)
        if doc.get("method") != "POST":
            fail("invalid_method", "The method of every request must be 'POST'.", number, "method")
            continue
        if doc.get("url") != endpoint:
            fail("mismatched_endpoint", f"The url of every request must be the batch's endpoint "
                                        f"'{endpoint}'.", number, "url")
            continue
        body = doc.get("body")
        if not isinstance(body, dict):
            fail("invalid_request", "Each request needs a 'body': a JSON object.", number, "body")
            continue
        lines.append(BatchLine(number, custom_id, body))
    if not lines and not errors:
        fail("empty_file", "The input file has no requests.", 0)
    return lines, errors


class JobStore:
    """The folder of jobs. Result files are opened for appending by the runner (`result_path`)."""

    def __init__(self, root: Path) -> None:
        self.root = make_private_dir(root / "batches")

    def save(self, doc: dict[str, Any]) -> None:
        write_json(self.root / f"{doc['id']}.json", doc)

    def load(self, batch_id: str) -> dict[str, Any] | None:
        path = self.root / f"{batch_id}.json"
        if not valid_id(batch_id, "batch_") or not path.is_file():
            return None
        doc: dict[str, Any] = read_json(path)
        return doc

    def all(self) -> list[dict[str, Any]]:
        """Every job, newest first."""
        docs = []
        for path in self.root.glob("batch_*.json"):
            try:
                docs.append(read_json(path))
            except (OSError, orjson.JSONDecodeError):
                continue
        return sorted(docs, key=lambda d: (d["created_at"], d["id"]), reverse=True)

    def result_path(self, batch_id: str, errors: bool) -> Path:
        return self.root / f"{batch_id}.{'errors' if errors else 'output'}.jsonl"

    def read_results(self, batch_id: str, errors: bool) -> set[str]:
        """The custom_ids with a whole line in the result file; a torn last line is cut off."""
        path = self.result_path(batch_id, errors)
        if not path.is_file():
            return set()
        data = path.read_bytes()
        whole = data[:data.rfind(b"\n") + 1]
        if len(whole) != len(data):
            with open(path, "r+b") as f:
                f.truncate(len(whole))
        done = set()
        for raw in whole.splitlines():
            try:
                done.add(orjson.loads(raw)["custom_id"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
        return done
