"""A frontend's stand-in for the DataPlane: `submit(request, start_ns, on_done) -> Future`, the same shape,
so the codecs, the HTTP connection and the gRPC Call work unchanged; and `forward(kind, args) -> Future`
for everything that is not inference (engine/workers/control.py answers it).

`submit` copies the request's input bytes once, into this frontend's request arena (or inline, when small or
when the arena is full), and adds a descriptor to the frame of this loop round; one `call_soon` per round
sends the frame, so everything the frontend's connections submitted in one round reaches the engine as one
message, and no task is made per request. The engine answers each request once (cancelled ones too); only
then is its input block freed, so no block is reused while a batch might still read it. An answer's outputs
are views of the response arena (engine/ipc/tensors.py PeerBlocks): the block goes back to the engine, with
the next frame, once the last view is gone.

Errors keep their code and message (messages.error_payload), so both protocols answer exactly as a single
process does. If the engine goes away, everything in flight fails UNAVAILABLE and `on_lost` is called: the
frontend process then exits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import EngineError, ErrorCode
from ..frontend.http.types import ResponseStream
from ..ipc.frames import FrameReader, encode_frame
from ..ipc.tensors import Inline, PeerBlocks, Reads, place, wire_chunks
from ..shm.regions import Arena, Region
from ..streaming.responses import StreamedResponse, infer_stream
from ..types import (
    EMPTY_FINAL,
    Completion,
    InferenceRequest,
    InferenceResponse,
    RequestPlan,
    StreamSink,
    Tensor,
)
from .credit import CreditReturns
from .messages import (
    CANCELLED,
    OK,
    STREAMED,
    Control,
    EngineFrame,
    FrontendFrame,
    GrpcCall,
    Header,
    HealthCall,
    HttpCall,
    InputSpec,
    OutputSpec,
    Response,
    Submit,
    control_value,
    datatype,
    decode_engine_frame,
    encode_message,
    error_from_payload,
    outputs_header,
)
from .streams import is_stream_head

log = logging.getLogger("hubserve.workers")

INLINE_BELOW_BYTES = 32768  # inputs smaller than this travel in the frame (session.INLINE_BELOW_BYTES: why)
MAX_PLANS = 4096  # plan numbers kept; past it the table restarts and the engine is told (session.MAX_PLANS)
MAX_ANSWER_HEADERS = 1024  # answers' output headers kept worked out (`Reads`); past it the table restarts
FREE_FLUSH_SECS = 0.05  # blocks freed while no request is going out are sent after at most this long
REPORT_SECS = 1.0  # an idle frontend tells the engine about connections closed at most this late


def _engine_gone() -> EngineError:
    return EngineError(ErrorCode.UNAVAILABLE, "the server's engine process is gone; the server is restarting "
                                              "or stopping: retry")


class EngineClient(asyncio.Protocol):
    """One per frontend process: its end of the channel to the engine."""

    def __init__(self, requests: Region, responses: Region, on_lost: Callable[[], None]) -> None:
        self._region = requests
        self._arena = Arena(requests)
        self._responses = PeerBlocks(responses, read_only=True)  # answers only: never written here
        self._on_lost = on_lost
        self._reader = FrameReader(decode_engine_frame)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_event_loop()
        self._next_id = 1
        # rid → (future, input block or -1)
        self._pending: dict[int, tuple[asyncio.Future[Any], int]] = {}
        self._controls: dict[int, asyncio.Future[Any]] = {}
        self._control_streams: dict[int, ResponseStream] = {}  # where forwarded answers in pieces go
        self._credit = CreditReturns(self._schedule)  # what those connections took, for the engine
        self._plans: dict[RequestPlan, int] = {}
        # an answer's output header (OutputSpec, ...) → how to read it: the same few repeat
        self._answer_reads: dict[tuple[OutputSpec, ...], Reads] = {}
        self._next_plan = 1
        self._plans_reset = False
        self._requests: list[Submit] = []
        self._streams: dict[int, StreamSink] = {}  # rid → where its streamed responses go
        self._streaming: list[int] = []  # this round's rids that stream
        self._cancels: list[int] = []
        self._control_out: list[Control] = []
        self._inline = Inline()
        self._flush_scheduled = False
        self._free_timer: asyncio.TimerHandle | None = None
        self._count_connections: Callable[[], int] = lambda: -1
        self._reported = -1
        self._report_timer: asyncio.TimerHandle | None = None
        self.lost = False

    def count_connections_with(self, count: Callable[[], int]) -> None:
        """How to count this frontend's open client connections, reported in every frame (and once a
        second while idle) so the engine can hand the next one to the least busy frontend."""
        self._count_connections = count
        self._report_timer = self._loop.call_later(REPORT_SECS, self._report)

    def _report(self) -> None:
        self._report_timer = None if self.lost else self._loop.call_later(REPORT_SECS, self._report)
        if self._flush_scheduled or self._transport is None or self.lost:
            return  # the frame of this round carries the count
        if self._count_connections() != self._reported:
            self._send([], [], [], False)

    # ------------------------------------------------------------------ the DataPlane's shape

    def submit(self, request: InferenceRequest, start_ns: int = 0, on_done: Completion | None = None
               ) -> asyncio.Future[InferenceResponse]:
        """Send one request to the engine with this round's frame; the future resolves with its answer (or
        its error), and `on_done` is its done-callback. Cancelling the future cancels the request there."""
        if self.lost:
            raise _engine_gone()
        future: asyncio.Future[InferenceResponse] = self._loop.create_future()
        rid = self._next_id
        self._next_id = rid + 1
        placement = place(wire_chunks(request.inputs), self._arena, self._region, self._inline,
                          INLINE_BELOW_BYTES)
        plan = request.plan
        plan_no = 0 if plan is None else self._plans.get(plan)
        header: Header | None = None  # only with a new plan, or with no plan: the engine keeps the rest
        if plan_no is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
                self._plans_reset = True
            plan_no = self._plans[plan] = self._next_plan  # type: ignore[index]
            self._next_plan += 1
            header = _header(request)
        elif not plan_no:
            header = _header(request)
        self._requests.append(Submit(rid, plan_no, start_ns, request.id, placement, request.model_name,
                                     request.model_version, header, request.owner or None))
        self._pending[rid] = (future, placement[0])
        if request.stream is not None:
            self._streams[rid] = request.stream
            self._streaming.append(rid)
            window = request.stream_window
            if window is not None:  # what its client takes goes back to the engine as credit
                window.bind(functools.partial(self._credit.give, rid))
        # one done-callback, not two: each is a handle on the loop's ready queue when the future is done
        future.add_done_callback(functools.partial(self._settled, rid, on_done))
        self._schedule()
        return future

    def infer_stream(self, request: InferenceRequest, start_ns: int = 0) -> AsyncIterator[StreamedResponse]:
        """DataPlane.infer_stream's shape: the responses cross the channel as they come."""
        return infer_stream(self.submit, request, start_ns)

    def forward(self, call: HttpCall | GrpcCall | HealthCall, cancellable: bool = False,
                stream: ResponseStream | None = None) -> asyncio.Future[Any]:
        """A non-inference request for the engine's own handlers (messages.py `Control`). Its
        future resolves with the answer; an HTTP answer that streams (streams.py) is written to `stream` as
        its head and pieces come, and resolves the future with None at its end. `cancellable`: cancelling
        the future cancels the request in the engine too (a generation)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        if self.lost:
            future.set_exception(_engine_gone())
            return future
        cid = self._next_id
        self._next_id = cid + 1
        self._controls[cid] = future
        self._control_out.append(Control(cid, call))
        if stream is not None:
            self._control_streams[cid] = stream
        if cancellable:
            future.add_done_callback(functools.partial(self._control_settled, cid))
        self._schedule()
        return future

    def _control_settled(self, cid: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled() and self._controls.pop(cid, None) is not None:
            self._cancel_control(cid)

    def _cancel_control(self, cid: int) -> None:
        """Tell the engine that nobody waits for this control's answer (or the rest of its stream)."""
        self._control_streams.pop(cid, None)
        self._credit.forget(cid)
        if not self.lost:
            self._cancels.append(cid)
            self._schedule()

    def _settled(self, rid: int, on_done: Completion | None, future: asyncio.Future[Any]) -> None:
        """The request's done-callback: the caller's `on_done` first, then, if the future was cancelled here,
        the cancel for the engine."""
        try:
            if on_done is not None:
                on_done(future)
        finally:
            if future.cancelled() and rid in self._pending and not self.lost:
                self._cancels.append(rid)  # the client left: the engine drops it, then answers CANCELLED
                self._schedule()

    # ------------------------------------------------------------------ frames out

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is None or self.lost:
            return
        if not (self._requests or self._cancels or self._control_out or self._credit.pending):
            if self._responses.has_freed and self._free_timer is None:
                self._free_timer = self._loop.call_later(FREE_FLUSH_SECS, self._flush_freed)
            return
        requests, cancels, controls = self._requests, self._cancels, self._control_out
        reset, streaming = self._plans_reset, self._streaming
        self._requests, self._cancels, self._control_out, self._plans_reset = [], [], [], False
        self._streaming = []
        self._send(requests, cancels, controls, reset, streaming)

    def _send(self, requests: list[Submit], cancels: list[int], controls: list[Control], reset: bool,
              streaming: list[int] | None = None) -> None:
        """One frame: these, the blocks freed so far, the streams' credit and the connection count; the
        inline bytes are those of `requests` (submit() adds them and schedules the round's flush, so without
        one there are none)."""
        blocks = self._responses.take_freed()
        self._reported = connections = self._count_connections()
        frame = FrontendFrame(requests, cancels, blocks, controls, reset, connections, streaming or [],
                              self._credit.take())
        self._transport.writelines(  # type: ignore[union-attr]
            encode_frame(frame, self._inline.take(), encode_message))

    def _flush_freed(self) -> None:
        """Blocks freed while nothing else went out, sent on their own, so the engine's arena cannot fill."""
        self._free_timer = None
        if self._flush_scheduled or self._transport is None or self.lost:
            return  # the frame of this round carries them
        if self._responses.has_freed:
            self._send([], [], [], False)

    # ------------------------------------------------------------------ frames in

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
            for meta, inline in frames:
                self._frame(meta, inline)
        except Exception as e:  # a broken frame, or a block the arena never gave out: out of step
            log.error("the engine's frame could not be handled (%r): closing the channel", e)
            if self._transport is not None:
                self._transport.abort()
            return
        self._schedule()  # the blocks this round's answers free once written go out with the next frame

    def _frame(self, frame: EngineFrame, inline: memoryview) -> None:
        pending = self._pending
        for answer in frame.answers:
            rid, status, payload = answer.rid, answer.status, answer.payload
            if status >= STREAMED:  # a decoupled model's response before its last
                sink = self._streams.get(rid)
                entry = pending.get(rid)
                if sink is not None and entry is not None and not entry[0].done():
                    sink(self._response(payload, inline) if isinstance(payload, Response)
                         else _stream_error(payload))
                continue
            entry = pending.pop(rid, None)
            if entry is None:
                continue
            self._streams.pop(rid, None)
            future, block = entry
            if block >= 0:
                self._arena.free(block)  # the engine is done with the inputs
            if future.done():
                continue  # cancelled here: the answer confirms the engine let go
            if status == OK:
                response = self._response(payload, inline) if isinstance(payload, Response) else EMPTY_FINAL
                future.set_result(response)
            elif status == CANCELLED:
                future.cancel()
            else:
                future.set_exception(error_from_payload(payload))
        for control_answer in frame.control_answers:
            cid, ok, result = control_answer.cid, control_answer.ok, control_value(control_answer.result)
            control = self._controls.get(cid)
            if control is None or control.done():
                self._controls.pop(cid, None)
                self._control_streams.pop(cid, None)
                self._credit.forget(cid)
                continue  # cancelled here: the engine stops it and sends nothing more
            stream = self._control_streams.get(cid)
            if ok and stream is not None and result is not None and \
                    (type(result) is bytes or is_stream_head(result)):
                if type(result) is bytes:  # the next piece of a streamed answer
                    stream.send(result)
                    self._credit.written(cid, stream, len(result))
                else:  # its head
                    status, _, content_type, extra = result
                    stream.start(status, content_type, extra)
                continue
            del self._controls[cid]  # the answer, or a streamed answer's end (None)
            if self._control_streams.pop(cid, None) is not None:
                self._credit.forget(cid)
            if not ok:
                control.set_exception(error_from_payload(result))
            else:
                control.set_result(result)

    def _response(self, payload: Response, inline: memoryview) -> InferenceResponse:
        specs = payload.outputs
        try:
            reads = self._answer_reads[specs]
        except KeyError:
            if any(spec.parameters is not None for spec in specs):
                return self._placed_response(payload, inline)
            reads = self._answer_reads_for(specs)
        except TypeError:  # an output in a client's shared-memory region: its parameters (a dict) are in it
            return self._placed_response(payload, inline)
        arrays = self._responses.read(reads, payload.placement, inline)
        outputs = [Tensor(name, dt, shape, array)
                   for (name, dt, shape), array in zip(reads.specs, arrays, strict=True)]
        return InferenceResponse(payload.model_name, payload.model_version, outputs, payload.response_id,
                                 payload.parameters)

    def _answer_reads_for(self, specs: tuple[OutputSpec, ...]) -> Reads:
        if len(self._answer_reads) >= MAX_ANSWER_HEADERS:
            self._answer_reads.clear()
        reads = self._answer_reads[specs] = Reads([(s.name, datatype(s.datatype), s.shape) for s in specs])
        return reads

    def _placed_response(self, payload: Response, inline: memoryview) -> InferenceResponse:
        """An answer with outputs written to a client's shared-memory region, which crossed with no bytes."""
        specs = payload.outputs
        typed = [(spec.name, datatype(spec.datatype), spec.shape) for spec in specs]
        reads = [t if spec.parameters is None else (t[0], t[1], (0,))
                 for t, spec in zip(typed, specs, strict=True)]
        arrays = self._responses.read(reads, payload.placement, inline)
        outputs = [Tensor(name, dt, shape, array) if spec.parameters is None else
                   Tensor(name, dt, shape, array, spec.parameters)
                   for (name, dt, shape), spec, array in zip(typed, specs, arrays, strict=True)]
        return InferenceResponse(payload.model_name, payload.model_version, outputs, payload.response_id,
                                 payload.parameters)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._transport = None
        for timer in (self._free_timer, self._report_timer):
            if timer is not None:
                timer.cancel()
        for future, _ in list(self._pending.values()):
            if not future.done():
                future.set_exception(_engine_gone())
        for future in list(self._controls.values()):
            if not future.done():
                future.set_exception(_engine_gone())
        self._pending.clear()
        self._streams.clear()
        self._controls.clear()
        self._control_streams.clear()  # a stream cut short: its connection ends it, and closes
        self._credit.close()
        self._on_lost()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _stream_error(payload: Any) -> EngineError:
    error = error_from_payload(payload)
    return error if isinstance(error, EngineError) else EngineError(ErrorCode.INTERNAL, str(error))


def _header(request: InferenceRequest) -> Header:
    inputs = tuple(InputSpec(t.name, t.datatype.value, t.shape, t.parameters) for t in request.inputs)
    return Header(inputs, outputs_header(request.outputs), request.parameters)
