"""The Batch API's files (`/v1/files`): a folder of `<id>.jsonl` (the bytes) and `<id>.json` (the owner and
OpenAI's file object, written last, so a file exists once its object does), and an index of the objects in
memory, read once at start, so that nothing but an upload, a download or a job reads the folder.

Every file belongs to an owner (owners.py): another owner's file is "No such File object" (404) on every
endpoint. Each owner's files are bounded in count and bytes (limits.py), inputs and the outputs its jobs
write alike; an upload past either is refused (400, as OpenAI refuses a full storage) until files are deleted.
A job's output always lands, even past the bound: the results were worked for; the next upload is refused.

Threads: the index is touched on the loop only (`reserve`, `register`, `get`, `list`, `delete`, `apply`);
the disk work of an upload or an output (`write_upload`, `write_output`) runs on a worker thread between a
`reserve` (or nothing, for outputs) and a `register`.

Shared between replicas (`--batch-shared`, docs/replicas.md): the folder is read again before every Batch API
call (`SharedFolder.read` on a worker thread, then `apply` on the loop), so a file another replica wrote or
deleted is seen, and a key's bounds count the files in the folder, whoever wrote them, plus this replica's
uploads under way. Uploads under way on other replicas are not seen: two replicas may each let one upload pass
a bound at once (by one upload each). A file's bytes are written before its object, so a replica that sees
the object can read the bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import OpenAIError, bad_request
from .input import check_upload
from .limits import BatchLimits
from .store import SharedFolder, make_private_dir, new_id, read_json, valid_id, write_bytes, write_json

ORPHAN_SECS = 3600  # shared: an upload's bytes without an object this old are a crash's, not an upload's

log = logging.getLogger("hubserve.batch")

PURPOSES_SERVED = ("batch",)


@dataclass(slots=True)
class _Usage:
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # id → file object, oldest first
    stored_bytes: int = 0    # the files' bytes
    reserved_count: int = 0  # uploads under way here
    reserved_bytes: int = 0

    @property
    def count(self) -> int:
        """Files held or reserved."""
        return len(self.files) + self.reserved_count

    @property
    def nbytes(self) -> int:
        return self.stored_bytes + self.reserved_bytes


@dataclass(frozen=True, slots=True)
class Reservation:
    """An upload's place in its owner's quota, from `reserve` until `register` or `release`."""

    owner: str
    nbytes: int


class FileStore:
    def __init__(self, root: Path, limits: BatchLimits, shared: bool = False) -> None:
        self.root = make_private_dir(root / "files")
        self.limits = limits
        self.shared = shared
        self._owners: dict[str, _Usage] = {}
        self._index: dict[str, str] = {}  # file id → owner
        self._load()
        self.folder = SharedFolder(self.root, "file-")

    # ------------------------------------------------------------------ the index (the loop's)

    def get(self, owner: str, file_id: str) -> dict[str, Any]:
        """The owner's file object, or 404 (also for another owner's file)."""
        if self._index.get(file_id) != owner:
            raise not_found("File", file_id)
        return self._owners[owner].files[file_id]

    def path(self, owner: str, file_id: str) -> Path:
        """The owner's file's bytes, or 404."""
        self.get(owner, file_id)
        return self.root / f"{file_id}.jsonl"

    def list(self, owner: str, purpose: str | None, limit: int, after: str | None,
             newest_first: bool) -> dict[str, Any]:
        usage = self._owners.get(owner)
        # by creation (uploads finish in any order; ids made later sort later: store.new_id)
        docs = sorted(usage.files.values(), key=_created) if usage is not None else []
        if newest_first:
            docs.reverse()
        if purpose is not None:
            docs = [d for d in docs if d["purpose"] == purpose]
        return page(docs, limit, after)

    def reserve(self, owner: str, nbytes: int) -> Reservation:
        """Hold room for an upload of `nbytes`, or OpenAIError 400 when it is larger than a file may be, or
        the owner's files would pass their count or bytes bound."""
        limits = self.limits
        _check_size(nbytes, limits)
        usage = self._owners.setdefault(owner, _Usage())
        if usage.count + 1 > limits.max_files_per_key:
            raise quota_exceeded(f"This API key holds {usage.count} files, the most it may "
                                 f"(--batch-max-files-per-key {limits.max_files_per_key}). Delete files "
                                 "(DELETE /v1/files/{id}) before uploading more.")
        if usage.nbytes + nbytes > limits.max_storage_bytes_per_key:
            raise quota_exceeded(f"This API key's files take {usage.nbytes} bytes; {nbytes} more would pass "
                                 f"its storage quota of {limits.max_storage_bytes_per_key} bytes "
                                 "(--batch-max-storage-mb-per-key). Delete files (DELETE /v1/files/{id}) "
                                 "or upload a smaller file.")
        usage.reserved_count += 1
        usage.reserved_bytes += nbytes
        return Reservation(owner, nbytes)

    def release(self, reservation: Reservation) -> None:
        """The upload failed: its room goes back."""
        usage = self._owners.setdefault(reservation.owner, _Usage())
        usage.reserved_count -= 1
        usage.reserved_bytes -= reservation.nbytes

    def register(self, owner: str, doc: dict[str, Any], reservation: Reservation | None) -> None:
        """A file written (`write_upload` under `reservation`, or a job's output with None: counted now)."""
        if reservation is not None:
            self.release(reservation)
        self._add(owner, doc)

    def apply(self, stored: dict[str, Any]) -> None:
        """Shared: the folder as `SharedFolder.read` found it (file id → stored object) becomes the index;
        the uploads under way here keep their reservations."""
        for usage in self._owners.values():
            usage.files.clear()
            usage.stored_bytes = 0
        self._index.clear()
        for owner, doc in sorted(map(_owned, stored.values()), key=lambda x: _created(x[1])):
            self._add(owner, doc)

    def _add(self, owner: str, doc: dict[str, Any]) -> None:
        usage = self._owners.setdefault(owner, _Usage())
        if doc["id"] not in usage.files:
            usage.files[doc["id"]] = doc
            usage.stored_bytes += doc["bytes"]
        self._index[doc["id"]] = owner

    def delete(self, owner: str, file_id: str) -> dict[str, Any]:
        """Forget and remove the owner's file (404 if it has none so named). A job reading it keeps its open
        file until it ends."""
        doc = self.get(owner, file_id)
        del self._index[file_id]
        usage = self._owners[owner]
        del usage.files[file_id]
        usage.stored_bytes -= doc["bytes"]
        for suffix in (".json", ".jsonl"):  # the object first: a half-deleted file is no file
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{file_id}{suffix}").unlink()
        return {"id": file_id, "object": "file", "deleted": True}

    # ------------------------------------------------------------------ the disk (worker threads)

    def write_upload(self, owner: str, filename: str, purpose: str, data: bytes | memoryview
                     ) -> dict[str, Any]:
        """Check an uploaded input file and keep it; its file object. OpenAIError 400 saying what to
        change."""
        if purpose not in PURPOSES_SERVED:
            raise bad_request(f"'{purpose}' is not a supported purpose: this server takes files for "
                              "the Batch API only (purpose 'batch').", "purpose", "invalid_value")
        _check_size(len(data), self.limits)
        check_upload(data, self.limits.max_requests)
        file_id = new_id("file-")
        write_bytes(self.root / f"{file_id}.jsonl", data)
        return self._write_object(owner, file_id, filename, purpose, len(data))

    def write_output(self, owner: str, filename: str, source: Path | None) -> dict[str, Any]:
        """Keep a job's result file (`source`; None: an empty one) as a file of the owner, without reading
        it: a hard link (a copy where links fail). The job's own copy is removed once the job has ended."""
        file_id = new_id("file-")
        path = self.root / f"{file_id}.jsonl"
        if source is None:
            path.write_bytes(b"")
        else:
            try:
                os.link(source, path)
            except OSError:
                shutil.copyfile(source, path)
        return self._write_object(owner, file_id, filename, "batch_output", path.stat().st_size)

    def _write_object(self, owner: str, file_id: str, filename: str, purpose: str, nbytes: int
                      ) -> dict[str, Any]:
        doc = {"id": file_id, "object": "file", "bytes": nbytes, "created_at": int(time.time()),
               "filename": filename, "purpose": purpose, "status": "processed", "status_details": None}
        write_json(self.root / f"{file_id}.json", {"owner": owner, "file": doc})
        return doc

    def _load(self) -> None:
        """The index from the folder, once, at start (before any frontend listens). A file whose object
        was never written (a crash mid-upload) and temporary files are removed (shared: only those older
        than ORPHAN_SECS, since another replica may be writing one now). Objects from before owners were
        kept belong to the keyless owner."""
        found = []
        now = time.time()
        for path in self.root.iterdir():
            name = path.name
            if name.endswith(".tmp") or name.endswith(".jsonl") and not path.with_suffix(".json").exists():
                with contextlib.suppress(OSError):
                    if not self.shared or now - path.stat().st_mtime > ORPHAN_SECS:
                        path.unlink()
                continue
            if not name.endswith(".json") or not valid_id(name[:-5], "file-"):
                continue
            try:
                stored = read_json(path)
            except (OSError, orjson.JSONDecodeError):
                log.warning("batch files: %s is unreadable; skipped", name)
                continue
            found.append(_owned(stored))
        for owner, doc in sorted(found, key=lambda x: _created(x[1])):
            self._add(owner, doc)


def _owned(stored: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(owner, file object) of a stored object; one from before owners were kept is the keyless owner's."""
    return (stored["owner"], stored["file"]) if "file" in stored else ("", stored)


def _created(doc: dict[str, Any]) -> tuple[int, str]:
    return doc["created_at"], doc["id"]


def _check_size(nbytes: int, limits: BatchLimits) -> None:
    if nbytes > limits.max_file_bytes:
        raise bad_request(f"File is too large: {nbytes} bytes; the maximum size of a batch input file is "
                          f"{limits.max_file_bytes} bytes (--batch-max-file-mb).", "file", "file_too_large")


def page(docs: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """OpenAI's list object: up to `limit` of `docs` (in the order given) after the one with id `after`."""
    if after is not None:
        ids = [d["id"] for d in docs]
        docs = docs[ids.index(after) + 1:] if after in ids else []
    chunk = docs[:limit]
    return {"object": "list", "data": chunk, "first_id": chunk[0]["id"] if chunk else None,
            "last_id": chunk[-1]["id"] if chunk else None, "has_more": len(docs) > limit}


def not_found(kind: str, object_id: str) -> OpenAIError:
    """OpenAI's 404 for an unknown id (`No such File object: file-…`)."""
    return OpenAIError(404, f"No such {kind} object: {object_id[:80]}", "invalid_request_error", "id")


def quota_exceeded(message: str) -> OpenAIError:
    """OpenAI answers a full file storage with 400 (invalid_request_error, "Please delete old files")."""
    return OpenAIError(400, message, "invalid_request_error", None, "quota_exceeded")
