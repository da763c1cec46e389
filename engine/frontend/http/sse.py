"""Server-sent events (the WHATWG HTML standard's `text/event-stream`) and HTTP/1.1 chunked framing, pure:
what the generate extension's `generate_stream` writes (generate.py) and what a client reads back.

Triton writes each response as one event holding one `data:` line and a blank line (`data: <json>\\n\\n`),
an error as `data: {"error": "..."}\\n\\n`, and nothing for a response that only carries the final flag.
A payload with line breaks (never one of ours: JSON from orjson escapes them) becomes one `data:` line per
line, as the standard joins them back with `\\n`. `EventReader` is the client's side, sans I/O: bytes in,
the events' data out; the tests read streams with it.
"""

from __future__ import annotations

import re

import orjson

CONTENT_TYPE = b"text/event-stream; charset=utf-8"  # Triton's, charset included
LAST_CHUNK = b"0\r\n\r\n"  # the end of a chunked body (no trailers)
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def data_event(payload: bytes) -> bytes:
    """One event whose data is `payload`: `data: <payload>\\n\\n`."""
    if b"\n" not in payload and b"\r" not in payload:
        return b"data: " + payload + b"\n\n"
    return b"".join(b"data: " + line + b"\n" for line in _LINE_BREAK.split(payload)) + b"\n"


def error_event(message: str) -> bytes:
    """An error as Triton streams it: an event whose data is `{"error": message}`."""
    return data_event(orjson.dumps({"error": message}))


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (RFC 9112 §7.1); an empty chunk would end the body, so none."""
    if not data:
        return b""
    return b"%x\r\n%s\r\n" % (len(data), data)


class EventReader:
    """Bytes of an event stream in, the data of each complete event out (a client's side). Comments (lines
    starting with `:`) and fields other than `data` are skipped; an event with no data line is not one."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events = []
        while True:
            match = _LINE_BREAK.search(self._buffer)
            if match is None or match.end() == len(self._buffer) and self._buffer.endswith(b"\r"):
                break  # no whole line yet (a trailing CR may be half of CRLF)
            line, self._buffer = self._buffer[:match.start()], self._buffer[match.end():]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events


__all__ = ["CONTENT_TYPE", "LAST_CHUNK", "EventReader", "chunk", "data_event", "error_event"]
