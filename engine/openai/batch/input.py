"""A batch's input file, checked and read without holding it: what a job costs in memory is its open file
and the few requests in flight, never the parsed file (a parsed JSONL costs ~20× its size in Python
objects).

- `check_upload`: at upload, the bytes as they are (a view of the request body): UTF-8, checked a chunk at a
  time, and the requests (non-blank lines) counted by a scan that copies nothing.
- `scan_input`: when a job starts (validating), every line parsed and checked one at a time and dropped; the
  errors that fail the job are kept (at most MAX_ERRORS), the custom_ids only as 16-byte digests.
- `InputReader`: while the job runs, the next few requests read and parsed from the open file, each when a
  worker is free to submit it; the lines with a result already (a resumed job) are skipped.

Lines are split at "\\n" (JSONL); a line of only whitespace is skipped but keeps its number, so errors and
request ids name the file's own line numbers. Called on worker threads (the runner and the routes hand them
off the loop); each reader belongs to one job.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

from ..errors import bad_request

MAX_ERRORS = 100  # enough to fix a file by; a whole file of errors helps nobody
_CHUNK = 1 << 20
_REQUEST_LINE = re.compile(rb"^[ \t\r\x0b\x0c]*[^ \t\r\n\x0b\x0c]", re.MULTILINE)  # a line that is not blank


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of the input: its line (1-based), `custom_id` and body."""

    line: int
    custom_id: str
    body: dict[str, Any]


def check_upload(data: bytes | bytearray | memoryview, max_requests: int) -> int:
    """The number of requests in an uploaded input file, or OpenAIError 400: not UTF-8, empty, or more than
    `max_requests` lines. Costs at most one chunk's decoding beside the bytes themselves."""
    view = memoryview(data)
    size, pos = len(view), 0
    while pos < size:
        chunk = view[pos:pos + _CHUNK]
        try:
            _, used = codecs.utf_8_decode(chunk, "strict", pos + len(chunk) >= size)
        except UnicodeDecodeError as e:
            raise bad_request(f"The file is not UTF-8 text (byte {pos + e.start}).", "file",
                              "invalid_file") from None
        pos += used
    count = 0
    for _ in _REQUEST_LINE.finditer(view):
        count += 1
        if count > max_requests:
            raise bad_request(f"The file has more than {max_requests} requests; a batch input file may hold "
                              f"at most {max_requests} (--batch-max-requests).", "file", "too_many_requests")
    if not count:
        raise bad_request("The file is empty: a batch input file has one JSON request per line.", "file",
                          "empty_file")
    return count


def check_line(raw: bytes, number: int, endpoint: str) -> BatchLine | dict[str, Any]:
    """A non-blank line as a request, or its error in OpenAI's form (code, message, param, line). Each line:
    {"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}."""
    def fail(code: str, message: str, param: str | None = None) -> dict[str, Any]:
        return {"code": code, "message": message, "param": param, "line": number}

    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return fail("invalid_json_line", "This line is not parseable as valid JSON.")
    if not isinstance(doc, dict):
        return fail("invalid_json_line", "Each line must be a JSON object.")
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return fail("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id")
    if doc.get("method") != "POST":
        return fail("invalid_method", "The method of every request must be 'POST'.", "method")
    if doc.get("url") != endpoint:
        return fail("mismatched_endpoint", f"The url of every request must be the batch's endpoint "
                                           f"'{endpoint}'.", "url")
    body = doc.get("body")
    if not isinstance(body, dict):
        return fail("invalid_request", "Each request needs a 'body': a JSON object.", "body")
    return BatchLine(number, custom_id, body)


def _checked(f: IO[bytes], endpoint: str) -> Iterator[BatchLine | dict[str, Any]]:
    """Every non-blank line of `f` from its start, checked, duplicates of a custom_id included."""
    seen: set[bytes] = set()
    f.seek(0)
    for number, raw in enumerate(f, 1):
        if not raw.strip():
            continue
        item = check_line(raw, number, endpoint)
        if isinstance(item, BatchLine):
            key = hashlib.blake2b(item.custom_id.encode(), digest_size=16).digest()
            if key in seen:
                item = {"code": "duplicate_custom_id", "message": f"The custom_id '{item.custom_id[:64]}' "
                        "appears more than once; each request of a batch needs its own.",
                        "param": "custom_id", "line": number}
            else:
                seen.add(key)
        yield item


def scan_input(f: IO[bytes], endpoint: str) -> tuple[int, list[dict[str, Any]]]:
    """(the number of requests, the errors that fail the batch: at most MAX_ERRORS, in line order)."""
    count = 0
    errors: list[dict[str, Any]] = []
    for item in _checked(f, endpoint):
        if isinstance(item, BatchLine):
            count += 1
        elif len(errors) < MAX_ERRORS:
            errors.append(item)
    if not count and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": 0})
    return count, errors


def parse_input(data: bytes, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The requests of a whole file in memory and its errors, as `scan_input` finds them (for tests and
    small files; jobs read theirs with InputReader)."""
    import io

    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    for item in _checked(io.BytesIO(data), endpoint):
        if isinstance(item, BatchLine):
            lines.append(item)
        elif len(errors) < MAX_ERRORS:
            errors.append(item)
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": 0})
    return lines, errors


class InputReader:
    """A job's requests in file order, a few at a time (`read`, on a worker thread, one call at a time).
    `done`: the sorted line numbers that already have a result (skipped). Only a file that `scan_input`
    passed is read, and files never change, so every line checks; one that did not would be skipped."""

    def __init__(self, f: IO[bytes], endpoint: str, done: Sequence[int]) -> None:
        self._f = f
        self._endpoint = endpoint
        self._done = done
        self._number = 0
        f.seek(0)

    def read(self, most: int) -> list[BatchLine]:
        """Up to `most` requests; an empty list at the end of the file."""
        out: list[BatchLine] = []
        done = self._done
        while len(out) < most:
            raw = self._f.readline()
            if not raw:
                break
            self._number += 1
            number = self._number
            if not raw.strip():
                continue
            i = bisect_left(done, number)
            if i < len(done) and done[i] == number:
                continue
            item = check_line(raw, number, self._endpoint)
            if isinstance(item, BatchLine):
                out.append(item)
        return out
