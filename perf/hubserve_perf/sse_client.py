"""The generative mode's hot path: one streamed OpenAI request over a raw HTTP/1.1 keep-alive connection.

`StreamConnection.generate` writes one `POST /v1/chat/completions` (or `/v1/completions`) with `stream: true`,
reads the chunked answer's server-sent events as they arrive and stamps, with `time.perf_counter_ns`, the
request leaving, the first event carrying text (TTFT) and `data: [DONE]`. Output tokens are the usage
chunk's `completion_tokens` (the request asks for `stream_options.include_usage`), else the events that
carried text. A raw socket rather than aiohttp: no per-chunk framework work between the bytes arriving and
their timestamp, and no package beyond the standard library and orjson. Used by generative.py only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import orjson

from .types import PerfError

MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BYTES = 64 * 1024


@dataclass(slots=True)
class StreamRecord:
    """One request as the client saw it; times in perf_counter nanoseconds."""

    sent_ns: int
    first_ns: int = 0        # the first event with text (0: none came)
    done_ns: int = 0         # `data: [DONE]` read
    output_tokens: int = 0
    prompt_tokens: int = 0
    events: int = 0          # events that carried text


class StreamConnection:
    """One keep-alive connection; one request at a time. Owned by one coroutine of generative.py."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader, self._writer, self._host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> StreamConnection:
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
        except OSError as e:
            raise PerfError(f"cannot connect to {host}:{port}: {e}") from e
        return cls(reader, writer, f"{host}:{port}")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def generate(self, path: str, body: dict[str, Any]) -> StreamRecord:
        """Send one streamed request and read it to `[DONE]`. PerfError when the server refuses it (its
        status and OpenAI error message) or the stream breaks off or carries an error event."""
        payload = orjson.dumps(body)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
        record = StreamRecord(sent_ns=time.perf_counter_ns())
        self._writer.write(head + payload)
        status, headers = await self._read_head()
        if status != 200:
            raise PerfError(f"{path} answered {status}: {await self._error_body(headers)}")
        if headers.get("transfer-encoding", "").lower() != "chunked":
            raise PerfError(f"{path} answered 200 without a chunked event stream")
        pending = b""
        while True:
            data = await self._read_chunk()
            if not data:
                raise PerfError(f"{path}: the stream ended without data: [DONE]")
            pending += data
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                if self._on_event(event, record):
                    await self._read_chunk_end()
                    return record

    def _on_event(self, event: bytes, record: StreamRecord) -> bool:
        """Account one event; True at `[DONE]`."""
        if not event.startswith(b"data: "):
            return False
        data = event[6:]
        if data == b"[DONE]":
            record.done_ns = time.perf_counter_ns()
            if not record.output_tokens:
                record.output_tokens = record.events
            return True
        doc = orjson.loads(data)
        if "error" in doc:
            raise PerfError(f"the stream carried an error: {doc['error'].get('message', doc['error'])}")
        for choice in doc.get("choices") or ():
            text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
            if text:
                record.events += 1
                if not record.first_ns:
                    record.first_ns = time.perf_counter_ns()
        usage = doc.get("usage")
        if usage:
            record.output_tokens = int(usage.get("completion_tokens", 0))
            record.prompt_tokens = int(usage.get("prompt_tokens", 0))
        return False

    async def _read_head(self) -> tuple[int, dict[str, str]]:
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
            raise PerfError(f"the server closed the connection or sent a bad head: {e}") from e
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as e:
            raise PerfError(f"bad status line {lines[0]!r}") from e
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _read_chunk(self) -> bytes:
        """One chunk of a chunked body; b"" for the last (its trailer is left to `_read_chunk_end`)."""
        try:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                return b""
            data = await self._reader.readexactly(size + 2)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError) as e:
            raise PerfError(f"the event stream broke off: {e}") from e
        return data[:-2]

    async def _read_chunk_end(self) -> None:
        """After `[DONE]`: read to the last chunk, so the connection is ready for the next request."""
        while await self._read_chunk():
            pass

    async def _error_body(self, headers: dict[str, str]) -> str:
        length = int(headers.get("content-length", "0") or 0)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while chunk := await self._read_chunk():
                body += chunk
        else:
            body = await self._reader.readexactly(min(length, MAX_ERROR_BYTES))
        try:
            return str(orjson.loads(body)["error"]["message"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return body[:200].decode("utf-8", "replace")
