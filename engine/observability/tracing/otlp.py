"""OpenTelemetry spans of traced requests, sent to a collector over OTLP/HTTP with JSON encoding
(`POST <url>`, by default `http://localhost:4318/v1/traces`; opentelemetry-proto's JSON mapping:
resourceSpans → scopeSpans → spans, ids in hex, times as decimal strings of Unix nanoseconds).

Written here rather than taken from the OpenTelemetry SDK: three spans per traced request and one POST per
batch need a deque and a task, not a dependency. As the SDK's BatchSpanProcessor (whose `bsp_*` settings
Triton passes through), spans wait in a bounded queue (`max_queue_size`) and leave in batches of at most
`max_export_batch_size`, at the latest `schedule_delay_ms` after the first; the request path only appends to
the queue. When the collector is slow or down, spans beyond the queue are dropped and counted (`dropped`),
so memory stays bounded and no request ever waits on the collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # imported when the first batch is posted: aiohttp's client costs ~0.1 s of every start-up
    import aiohttp

from .settings import ExporterConfig

log = logging.getLogger("hubserve.trace")

# perf_counter_ns (what the request path stamps) → Unix ns (what OTLP wants), fixed at start.
_WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()
SPAN_KIND_INTERNAL = 1
SPAN_KIND_SERVER = 2
STATUS_OK = 1
STATUS_ERROR = 2
_FAILURE_LOG_EVERY_S = 10.0


def _attr(key: str, value: str | int) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _span(trace_id: str, span_id: str, parent: str, name: str, kind: int, start_ns: int, end_ns: int,
          attributes: list[dict[str, Any]], status: dict[str, Any]) -> dict[str, Any]:
    span: dict[str, Any] = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": kind,
                            "startTimeUnixNano": str(start_ns + _WALL_OFFSET_NS),
                            "endTimeUnixNano": str(end_ns + _WALL_OFFSET_NS),
                            "attributes": attributes, "status": status}
    if parent:
        span["parentSpanId"] = parent
    return span


def request_spans(model: str, version: str, request_id: str, error: str, received_ns: int, queued_ns: int,
                  dispatched_ns: int, computed_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """One request's spans: `frontend` (received → answered, the root), `queue` (entered the queue → its batch
    left it) and `compute` (→ the batch's outputs split), each carrying the request id. A request that never
    reached a stage (cancelled in the queue, refused) has only the spans it lived through. `error` is the
    failure's text, "" on success. Times are perf_counter ns. Built by the exporter when it sends a batch,
    not on the request path (which only queues the request's `SpanRecord`)."""
    ids = os.urandom(40).hex()  # one call: the trace id and three span ids
    trace_id, root = ids[:32], ids[32:48]
    attributes = [_attr("request_id", request_id), _attr("model_name", model),
                  _attr("model_version", version)]
    status = {"code": STATUS_ERROR, "message": error} if error else _OK
    spans = [_span(trace_id, root, "", "frontend", SPAN_KIND_SERVER, received_ns, end_ns, attributes, status)]
    if queued_ns and dispatched_ns:
        spans.append(_span(trace_id, ids[48:64], root, "queue", SPAN_KIND_INTERNAL, queued_ns, dispatched_ns,
                           attributes, _OK))
        if computed_ns:
            spans.append(_span(trace_id, ids[64:80], root, "compute", SPAN_KIND_INTERNAL, dispatched_ns,
                               computed_ns, attributes, status))
    return spans


_OK = {"code": STATUS_OK}
# What the request path queues per traced request: request_spans' arguments, as they are.
SpanRecord = tuple[str, str, str, str, int, int, int, int, int]


class OtlpExporter:
    """Owned by the engine process; `add` is called on the loop, `run` is its one task."""

    def __init__(self, config: ExporterConfig) -> None:
        self.config = config
        self._queue: deque[SpanRecord] = deque()  # one entry per traced request (up to three spans)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False
        self.exported = 0  # spans the collector accepted
        self.dropped = 0  # spans dropped: queue full, or the collector refused or was unreachable
        self._last_failure_log = 0.0
        self._resource = {"attributes": [_attr(k, v) for k, v in config.resource.items()]}

    def add(self, record: SpanRecord) -> None:
        """Queue one traced request (its spans are built when sent), or drop it when the queue holds
        `max_queue_size` spans' worth (three a request)."""
        queue = self._queue
        if (len(queue) + 1) * 3 > self.config.max_queue_size:
            self.dropped += 3
            return
        queue.append(record)
        if len(queue) * 3 >= self.config.max_export_batch_size and self._wake is not None:
            self._wake.set()

    @property
    def queued(self) -> int:
        """Spans waiting to be sent (at most `max_queue_size`; three a request counted)."""
        return len(self._queue) * 3

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        delay_s = self.config.schedule_delay_ms / 1000
        # The flag, not only the cancel, ends the loop: Python 3.11's wait_for can swallow a cancel that
        # arrives as the event is set (seen in tests/.../test_tracing.py), and the task would then never end.
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay_s)
            self._wake.clear()
            if not self._closing:
                await self._flush()

    async def _flush(self) -> None:
        queue = self._queue
        requests = max(self.config.max_export_batch_size // 3, 1)
        while queue:
            batch = [span for _ in range(min(requests, len(queue)))
                     for span in request_spans(*queue.popleft())]
            await self._post(batch)

    async def _post(self, spans: list[dict[str, Any]]) -> None:
        body = orjson.dumps({"resourceSpans": [{
            "resource": self._resource,
            "scopeSpans": [{"scope": {"name": "hubserve"}, "spans": spans}],
        }]})
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._session.post(self.config.url, data=body,
                                          headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                if resp.status // 100 == 2:
                    self.exported += len(spans)
                    return
                reason = f"HTTP {resp.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            reason = f"{type(e).__name__}: {e}"
        self.dropped += len(spans)
        now = time.monotonic()
        if now - self._last_failure_log >= _FAILURE_LOG_EVERY_S:
            self._last_failure_log = now
            log.warning("trace collector %s did not take %d spans (%s); %d dropped so far", self.config.url,
                        len(spans), reason, self.dropped)

    async def close(self) -> None:
        """Stop the task, send what is queued (for at most 5 s), close the session."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=5)
            self._task = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._flush(), 5)
        if self._session is not None:
            await self._session.close()
            self._session = None
