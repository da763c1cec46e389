"""What happens when an inference is answered, beyond statistics: its access line (logs.py) and, when
sampled, its spans (engine/observability/tracing/). Called from request_life.py, the one end of every
request that reached a model (a batcher's, an ensemble's, a generation's), after the request is counted and
before the frontend answers; and, for a
request refused before it reached a model (malformed, an unknown model, a wrong shape, a full queue),
`refused` by whoever refused it (the data plane, or a frontend's decoding), only while access lines are on:
its line, with its status and zero queue and compute time. Such a request has no spans.

`STATE.active` is the hot path's one check: False while access lines are off and nothing traces, so a
request then pays one attribute read here and none of the stamping in the batchers. Only the engine process
observes (with --workers N the batchers live there), so one process writes every access line and exports
every span.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import EngineError
from ..types import InferenceRequest
from . import logs
from .request_ids import request_id_problem
from .tracing.otlp import OtlpExporter
from .tracing.settings import TraceSettings, TraceValues


@dataclass(slots=True)
class ObserveState:
    active: bool = False  # access lines on, or some trace setting traces
    trace: TraceSettings | None = None
    exporter: OtlpExporter | None = None


STATE = ObserveState()


def install_tracing(settings: TraceSettings) -> OtlpExporter:
    """The engine's trace settings and their exporter (Server.start); the exporter's task is the caller's to
    start and close."""
    STATE.trace = settings
    STATE.exporter = OtlpExporter(settings.exporter)
    refresh()
    return STATE.exporter


def default_tracing() -> TraceSettings:
    return TraceSettings(TraceValues())


def refresh() -> None:
    """Called whenever the log or trace settings change."""
    trace = STATE.trace
    STATE.active = logs.SETTINGS.access or (trace is not None and trace.active)


def status_of(error: BaseException | None, cancelled: bool) -> str:
    if cancelled:
        return "CANCELLED"
    if error is None:
        return "OK"
    return error.code.name if isinstance(error, EngineError) else "INTERNAL"


def refused(model: str, version: str, request_id: str, error: BaseException, received_ns: int) -> None:
    """The access line of a request refused before it reached a model: the model and version as it named
    them (or as routed), its status, its total time from `received_ns` (perf_counter ns), batch size 0. Call
    only while `logs.SETTINGS.access`: the caller tests it, so a refusal costs nothing more when lines are
    off."""
    if request_id and request_id_problem(request_id) is not None:  # maybe refused for that very id
        request_id = ""
    logs.access_line(model, version, request_id or logs.new_request_id(), status_of(error, False), 0, 0,
                     max(time.perf_counter_ns() - received_ns, 0) if received_ns else 0, 0)


def finished(model: str, version: str, request: InferenceRequest, error: BaseException | None,
             cancelled: bool, received_ns: int, end_ns: int) -> None:
    """One answered request (`error` None on success): its spans if sampled, its access line if on. A request
    without an id gets one here only if a line or a span will carry it."""
    request_id = request.id
    trace = STATE.trace
    if trace is not None and trace.active and trace.sample(model) and STATE.exporter is not None:
        if not request_id:
            request_id = request.id = logs.new_request_id()
        message = "" if error is None and not cancelled else ("cancelled" if cancelled else str(error))
        STATE.exporter.add((model, version, request_id, message, received_ns, request.queued_ns,
                            request.dispatched_ns, request.computed_ns, end_ns))
    if logs.SETTINGS.access:
        if not request_id:
            request_id = request.id = logs.new_request_id()
        dispatched = request.dispatched_ns
        queue_ns = dispatched - request.queued_ns if dispatched else 0
        compute_ns = request.computed_ns - dispatched if request.computed_ns else 0
        logs.access_line(model, version, request_id, status_of(error, cancelled), queue_ns, compute_ns,
                         end_ns - received_ns, request.executed_batch)
