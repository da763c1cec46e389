"""The Batch API's files (`POST /v1/files`, `GET /v1/files/{id}`, `/content`): a folder of `<id>.jsonl`
(the bytes) and `<id>.json` (OpenAI's file object). Input files are checked when uploaded: purpose
"batch", UTF-8, at most `max_bytes` and `max_requests` lines; each line's form is checked when a batch is
made of it (jobs.py). Output and error files are added by the runner when a job ends.

Called on worker threads (the routes hand file I/O off the loop) and on the loop for metadata reads; the
folder is the only state, so there is nothing to lock beyond the file system's renames.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OpenAIError, bad_request
from .store import make_private_dir, new_id, read_json, valid_id, write_bytes, write_json

PURPOSES_SERVED = ("batch",)


@dataclass(frozen=True, slots=True)
class FileLimits:
    max_bytes: int = 32 << 20    # an uploaded file at most (OpenAI's is 200 MB)
    max_requests: int = 50_000   # lines of one input file at most (OpenAI's limit)


class FileStore:
    def __init__(self, root: Path, limits: FileLimits) -> None:
        self.root = make_private_dir(root / "files")
        self.limits = limits

    def upload(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        """Check and keep an uploaded input file; its file object. OpenAIError 400 saying what to change."""
        if purpose not in PURPOSES_SERVED:
            raise bad_request(f"'{purpose}' is not a supported purpose: this server takes files for "
                              "the Batch API only (purpose 'batch').", "purpose", "invalid_value")
        limits = self.limits
        if len(data) > limits.max_bytes:
            raise bad_request(f"File is too large: {len(data)} bytes; the maximum size of a batch input file "
                              f"is {limits.max_bytes} bytes (--batch-max-file-mb).", "file", "file_too_large")
        if not data.strip():
            raise bad_request("The file is empty: a batch input file has one JSON request per line.", "file",
                              "empty_file")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad_request(f"The file is not UTF-8 text (byte {e.start}).", "file",
                              "invalid_file") from None
        lines = sum(1 for line in data.splitlines() if line.strip())
        if lines > limits.max_requests:
            raise bad_request(f"The file has {lines} requests; a batch input file may hold at most "
                              f"{limits.max_requests} (--batch-max-requests).", "file", "too_many_requests")
        return self.add(filename, purpose, data)

    def add(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        """Keep a file (an upload, or a job's output) and return its file object."""
        file_id = new_id("file-")
        doc = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
               "filename": filename, "purpose": purpose, "status": "processed", "status_details": None}
        write_bytes(self.root / f"{file_id}.jsonl", data)
        write_json(self.root / f"{file_id}.json", doc)
        return doc

    def get(self, file_id: str) -> dict[str, Any]:
        path = self._path(file_id, ".json")
        doc: dict[str, Any] = read_json(path)
        return doc

    def content(self, file_id: str) -> bytes:
        self.get(file_id)  # exists as a whole (its object is written last)
        return self._path(file_id, ".jsonl").read_bytes()

    def content_path(self, file_id: str) -> Path:
        self.get(file_id)
        return self._path(file_id, ".jsonl")

    def _path(self, file_id: str, suffix: str) -> Path:
        path = self.root / f"{file_id}{suffix}"
        if not valid_id(file_id, "file-") or not path.is_file():
            raise not_found("File", file_id)
        return path


def not_found(kind: str, object_id: str) -> OpenAIError:
    """OpenAI's 404 for an unknown id (`No such File object: file-…`)."""
    return OpenAIError(404, f"No such {kind} object: {object_id[:80]}", "invalid_request_error", "id")
