"""The engine's end of one frontend's channel: requests in, answers out, a frame per loop round each way.

A frame of requests is submitted to the one DataPlane as it arrives (so requests of every frontend meet in
the same batchers); each request's answer waits in this session's outbox, and one frame at the end of the
round carries every answer of that round. Inputs are numpy views over the frontend's request arena (or the
frame); outputs are copied once into this frontend's response arena, which the engine alone writes
(engine/ipc/tensors.py `place`), and freed when the frontend says it is done with them.

When the frontend's process dies, its channel closes: every request it still had in flight is cancelled
(out of the queues, or its result dropped), and the session lets go of both arenas (their memory goes back to
the OS once the last array over it is gone; the kernel frees a memfd with its last mapping).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Callable
from typing import Any

from ..dataplane import DataPlane
from ..errors import EngineError
from ..frontend.http.types import Pending
from ..frontend.wire import array_to_bytes
from ..ipc.frames import FrameError, FrameReader, encode_frame
from ..ipc.tensors import Inline, Reads, place, read_arrays
from ..shm.regions import Arena, Region
from ..streaming.window import StreamWindow
from ..types import EMPTY_FINAL, InferenceRequest, InferenceResponse, RequestPlan, Tensor, in_shared_memory
from .control import ControlRunner
from .credit import SendWindow
from .messages import (
    CANCELLED,
    FAILED,
    OK,
    STREAMED,
    STREAMED_ERROR,
    Answer,
    ControlAnswer,
    EngineFrame,
    FrontendFrame,
    Header,
    HttpCall,
    OutputSpec,
    Response,
    Submit,
    control_result,
    datatype,
    decode_frontend_frame,
    encode_message,
    failure,
    outputs_from_header,
)
from .streams import StreamHead, cancellable

log = logging.getLogger("hubserve.workers")

# Answers smaller than this travel in the frame: measured in-process, 2 × 4 KiB cost 9.2 µs through a block
# (alloc, write, the reader's views and owner, free) and 5.4 inline; 2 × 64 KiB 12.4 and 12.2, before the
# socket's two copies of the inline bytes.
INLINE_BELOW_BYTES = 32768
MAX_PLANS = 4096  # a frontend numbers at most this many plans before it resets (remote.py MAX_PLANS)

# A plan as the engine keeps it: what to read (name, DataType, shape of the bytes sent, worked out once:
# `Reads`), the tensors to make (name, DataType, declared shape, parameters), requested outputs, request
# parameters, and the RequestPlan that holds the model's validation verdict.
_Plan = tuple[Reads, list[Any], Any, dict[str, Any], RequestPlan | None]


class FrontendSession(asyncio.Protocol):
    """One per live frontend process. Created by the supervisor, which passes the regions it made for this
    frontend and is told through `on_lost` when the channel closes."""

    def __init__(self, index: int, dataplane: DataPlane, control: ControlRunner, requests: Region,
                 responses: Region, handoff: socket.socket,
                 on_lost: Callable[[FrontendSession], None]) -> None:
        self.index = index
        # New connections go to the frontend through it (listen.py).
        self.handoff: socket.socket | None = handoff
        self._reported_connections = 0  # what the frontend last said it has open
        self._handed_since = 0  # connections handed to it since
        self._dp = dataplane
        self._control = control
        self._requests: Region | None = requests  # the frontend writes it; we read the blocks it names
        self._responses: Region | None = responses
        self._arena: Arena | None = Arena(responses)
        self._on_lost = on_lost
        self._reader = FrameReader(decode_frontend_frame)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[InferenceResponse]] = {}
        self._plans: dict[int, _Plan] = {}
        self._answers: list[Answer] = []
        self._control_answers: list[ControlAnswer] = []
        # forwarded generations being answered, by cid, streaming ones (streams.py) until their end, and
        # the pieces of each the frontend has not yet given back (credit.py)
        self._control_pending: dict[int, Pending] = {}
        self._windows: dict[int, SendWindow] = {}
        # streaming requests, by rid: the credit their frontend's client gives a decoupled model's sends
        self._stream_windows: dict[int, StreamWindow] = {}
        self._inline = Inline()
        self._flush_scheduled = False
        self.closed = False

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def open_connections(self) -> int:
        """About how many client connections this frontend has open: its last report, plus those handed
        since (the dispatcher gives the next one to the frontend with the fewest)."""
        return self._reported_connections + self._handed_since

    def handed(self) -> None:
        self._handed_since += 1

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._transport = None
        if self.handoff is not None:
            self.handoff.close()  # connections handed over but not yet taken are closed with it
            self.handoff = None
        for future in list(self._pending.values()):
            future.cancel()  # out of the queue, or its result dropped: nobody is left to answer
        self._pending.clear()
        for pending in list(self._control_pending.values()):
            pending.future.cancel()  # a generation stops (streaming or not) and frees its KV blocks
        self._control_pending.clear()
        self._windows.clear()
        self._stream_windows.clear()
        self._plans.clear()
        self._answers.clear()
        self._inline.take()
        self._arena = None
        for region in (self._requests, self._responses):
            if region is not None:
                region.close()  # the unmap waits for arrays still in use (a batch running on a thread)
        self._requests = self._responses = None
        self._on_lost(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as e:
            log.error("frontend %d sent a broken frame (%s): closing its channel", self.index, e)
            self.abort()
            return
        for meta, inline in frames:
            try:
                self._frame(meta, inline)
            except Exception:
                log.exception("frontend %d: a frame could not be handled: closing its channel", self.index)
                self.abort()
                return

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------------ requests in

    def _frame(self, frame: FrontendFrame, inline: memoryview) -> None:
        if frame.connections >= 0:
            self._reported_connections, self._handed_since = frame.connections, 0
        arena = self._arena
        if arena is not None:
            for offset in frame.freed:
                arena.free(offset)
        if frame.plans_reset:
            self._plans.clear()
        streams = set(frame.streaming)
        for request in frame.requests:
            self._submit(request, inline, request.rid in streams)
        for rid in frame.cancels:
            future = self._pending.get(rid)
            if future is not None:
                future.cancel()  # its done-callback answers CANCELLED
            else:
                self._cancel_control(rid)
        for credit in frame.credits:
            cid, pieces = credit.id, credit.count
            window = self._windows.get(cid)
            if window is not None:
                window.grant(pieces)
            elif (stream_window := self._stream_windows.get(cid)) is not None:
                stream_window.taken(pieces)  # the frontend batched them already
        for sent in frame.controls:
            cid, call = sent.cid, sent.call
            # a request to a cancellable endpoint (by its parsed target) is held, so the session can stop it
            if not isinstance(call, HttpCall) or not cancellable(call.target[0]):
                self._control.run(sent, self._control_answered, self._stream_piece)
                continue
            window = SendWindow()
            pending = self._control.run(sent, self._control_answered, self._stream_piece, window)
            if pending is not None:
                self._control_pending[cid] = pending
                self._windows[cid] = window

    def _cancel_control(self, cid: int) -> None:
        """The frontend's client left a forwarded request (streams.py): stop it, and answer nothing more."""
        self._windows.pop(cid, None)
        pending = self._control_pending.pop(cid, None)
        if pending is not None:
            pending.future.cancel()  # the route's task is cancelled: a streaming generation stops too

    def _submit(self, desc: Submit, inline: memoryview, streamed: bool = False) -> None:
        rid, plan_no, placement = desc.rid, desc.plan_no, desc.placement
        try:
            if desc.header is not None:
                plan = _plan(desc.header, plan_no)
                if plan_no:
                    self._plans[plan_no] = plan
            else:
                plan = self._plans[plan_no]
            reads, tensors, outputs, params, request_plan = plan
            arrays = read_arrays(reads, placement, self._requests, inline)
            inputs = [Tensor(name, dt, shape, array, p)
                      for (name, dt, shape, p), array in zip(tensors, arrays, strict=True)]
            request = InferenceRequest(desc.model, desc.version, inputs, desc.request_id, outputs, params,
                                       request_plan)
            if desc.owner is not None:
                request.owner = desc.owner
            if streamed:
                request.stream = functools.partial(self._streamed, rid)
                # the frontend's client's credit, as it comes (its own window batched it)
                request.stream_window = self._stream_windows[rid] = StreamWindow(batch=1)
            future = self._dp.submit(request, desc.start_ns, functools.partial(self._answered, rid))
        except Exception as e:  # refused before queueing (EngineError), or a bug: answered this round
            self._stream_windows.pop(rid, None)
            if not isinstance(e, EngineError):
                log.exception("frontend %d: request could not be submitted", self.index)
            self._queue_answer(Answer(rid, FAILED, failure(e)))
            return
        self._pending[rid] = future

    # ------------------------------------------------------------------ answers out

    def _answered(self, rid: int, future: asyncio.Future[InferenceResponse]) -> None:
        """The request's one done-callback (after the batcher's accounting)."""
        self._stream_windows.pop(rid, None)
        if self._pending.pop(rid, None) is None or self.closed:
            return
        if future.cancelled():
            self._queue_answer(Answer(rid, CANCELLED, None))
            return
        exc = future.exception()
        if exc is not None:
            self._queue_answer(Answer(rid, FAILED, failure(exc)))
            return
        response = future.result()
        if response is EMPTY_FINAL:
            self._queue_answer(Answer(rid, OK, None))
            return
        try:
            answer = Answer(rid, OK, self._payload(response))
        except Exception as e:  # a bug in copying out: the request fails, the session goes on
            log.exception("frontend %d: answer could not be placed", self.index)
            answer = Answer(rid, FAILED, failure(e))
        self._queue_answer(answer)

    def _streamed(self, rid: int, response: InferenceResponse | EngineError) -> None:
        """A decoupled model's response before its last, for a streaming request."""
        if self.closed or rid not in self._pending:
            return
        if isinstance(response, EngineError):
            self._queue_answer(Answer(rid, STREAMED_ERROR, failure(response)))
            return
        try:
            self._queue_answer(Answer(rid, STREAMED, self._payload(response)))
        except Exception as e:
            log.exception("frontend %d: a streamed response could not be placed", self.index)
            self._queue_answer(Answer(rid, STREAMED_ERROR, failure(e)))

    def _payload(self, response: InferenceResponse) -> Response:
        chunks = []
        specs = []
        for t in response.outputs:  # one pass: each output's bytes in wire form and its header
            chunks.append(array_to_bytes(t.data, t.datatype))
            # an output written to a client's shared-memory region has no bytes: its parameters say where
            specs.append(OutputSpec(t.name, t.datatype.value, t.shape, t.parameters or None))
        placement = place(chunks, self._arena, self._responses, self._inline, INLINE_BELOW_BYTES)
        return Response(response.model_name, response.model_version, response.id, response.parameters,
                        tuple(specs), placement)

    def _control_answered(self, cid: int, ok: bool, result: Any) -> None:
        """A control's answer, or a streamed answer's end (`result` None, streams.py), once."""
        self._control_pending.pop(cid, None)
        self._windows.pop(cid, None)
        if self.closed:
            return
        self._control_answers.append(ControlAnswer(cid, ok, control_result(ok, result)))
        self._schedule()

    def _stream_piece(self, cid: int, item: StreamHead | bytes) -> None:
        """A streaming answer's head or next piece (its end is `_control_answered`'s), out with this round's
        frame; nothing once the frontend cancelled it."""
        if self.closed or cid not in self._control_pending:
            return
        self._control_answers.append(ControlAnswer(cid, True, control_result(True, item)))
        self._schedule()

    def _queue_answer(self, answer: Answer) -> None:
        self._answers.append(answer)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """End of the round: every answer of this round in one frame, one gathered write."""
        self._flush_scheduled = False
        transport = self._transport
        if transport is None or (not self._answers and not self._control_answers):
            return
        frame = EngineFrame(self._answers, self._control_answers)
        self._answers, self._control_answers = [], []
        transport.writelines(encode_frame(frame, self._inline.take(), encode_message))


def _plan(header: Header, plan_no: int) -> _Plan:
    tensors = [(i.name, datatype(i.datatype), i.shape, i.parameters) for i in header.inputs]
    # An input placed in a client's shared-memory region has no bytes here (the codecs give it none): the
    # DataPlane reads it from the region, as in a single process.
    reads = Reads([(name, dt, (0,) if in_shared_memory(p) else shape) for name, dt, shape, p in tensors])
    return reads, tensors, outputs_from_header(header.outputs), header.parameters, \
        RequestPlan() if plan_no else None
