"""gRPC calls over our HTTP/2 connection (grpc/doc/PROTOCOL-HTTP2.md): `GrpcApp` (app.py) opens a `Call` per
stream; a call reads its request head and messages, honours `grpc-timeout`, and answers with `:status 200` +
`content-type: application/grpc` headers, messages, and `grpc-status` / `grpc-message` trailers (or one
trailers-only HEADERS frame for an early error). The messages themselves (the 5-byte length prefix,
compression, the encoding of a call's responses) are messages.py's.

Every RPC of inference.GRPCInferenceService and grpc.health.v1.Health is answered by the transport-neutral
`GrpcHandlers` (handlers.py), found through the services' descriptors, so none can be missing.
ModelInfer, the hot path, creates no task: `submit_infer_wire` on the message bytes (codec.py's cached
decoding), and a done-callback that serializes the response by hand and hands headers + message + trailers
to the connection for one write (its header blocks are built once, in rpcs.py). Health/Watch creates no task
either: every Watch stream of the process is told by one notifier (`GrpcApp.health`, health_watch.py) when
its status changes; `CallLimits` caps them per connection and server-wide, and, with keys configured, a
Watch needs one (a stream held as long as its client likes; one-shot health checks stay keyless).

What a request holds (a partial message, a unary request awaiting END_STREAM) is drawn from its connection's
ByteBudget and dropped however the call ends; GrpcApp.sweep resets calls whose partial message stalls.

A call's head is checked once, as it arrives, by head.py's `admit_head` (request id, limits, method, the
loopback-only admin groups, the access policy, the Watch caps): a refused call ends at once, trailers only,
before any message is read. An admitted call holds its admission until it ends; the request bytes it holds
(as counted for the connection's budget, and a unary request handed on until it is answered) are drawn from
the server's in-flight budget too.

A ModelStreamInfer stream's reading, its requests and their answers are stream_infer.py's (`StreamInfer`, a
base of `Call`); what the calls of one server share is app.py's `GrpcApp`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf.message import DecodeError

from ...access.caller import Caller
from ...access.policy import GRPC_STATUS, Admission
from ...errors import EngineError, endpoint_message
from ...proto import health_pb2
from ..h2.connection import H2Connection
from ..h2.frames import H2Error
from ..h2.headers import RequestHead, literal
from ..h2.streams import H2Stream
from .handlers import STATUS
from .handlers import GrpcStatus as S
from .head import HeadAdmission, HeadRefusal, admit_head, call_head
from .messages import PREFIX, MessageError, decompress, frame, response_head
from .rpcs import OK_TRAILERS, Kind, Rpc, status_block, with_retry
from .stream_infer import StreamInfer
from .stream_state import StreamState

if TYPE_CHECKING:
    from .app import GrpcApp

log = logging.getLogger("hubserve.h2")
health: Any = health_pb2  # the generated module carries no type information

_EMPTY = memoryview(b"")
# An incomplete unary message at least this large is allocated at its declared length (`Call.whole`).
_WHOLE_BYTES = 64 << 10
_LARGE_BUFFER = 1 << 20  # a request message this large, run or dropped, counts towards trimming the heap


class Call(StreamInfer):
    """One RPC on one stream: collects request messages, runs the handler, sends the answer. `done` turns true
    when the final status has been sent or the stream is gone; nothing is sent after that."""

    __slots__ = ("admission", "app", "buffer", "conn", "done", "encoding", "facts", "fed", "fed_at", "filled",
                 "headers_sent", "need", "remote_done", "request", "request_id", "reserved",
                 "response_encoding", "rpc", "start_ns", "stream", "streaming", "timer", "watch_counted",
                 "watching", "whole", "work")

    def __init__(self, app: GrpcApp, conn: H2Connection, stream: H2Stream, head: RequestHead) -> None:
        self.app = app
        self.conn = conn
        self.stream = stream
        self.start_ns = time.perf_counter_ns()
        self.buffer: bytearray | None = None  # an incomplete message under _WHOLE_BYTES, or its prefix
        self.need = 5  # bytes `buffer` must hold before the next message can be read
        # A large incomplete message (prefix and all), allocated at its declared length when its prefix
        # came, `filled` bytes of it in: each DATA payload is copied once, to where it ends up (a bytearray
        # grown frame by frame copies what it held as it grows).
        self.whole: memoryview | None = None
        self.filled = 0
        self.reserved = 0  # bytes of the connection's request budget this call holds (buffer, request)
        self.fed = False  # DATA arrived since the last sweep (while in app.partial)
        self.fed_at = 0.0
        self.request: memoryview | None = None  # the one request message of a unary call
        self.work: asyncio.Future[Any] | None = None  # the handler's future or task, cancelled on reset
        # a ModelStreamInfer call's reading and requests (stream_state.py); None for any other RPC
        # (StreamInfer types it as set: only a stream call runs its methods)
        self.streaming = None  # type: ignore[assignment]
        self.watching: str | None = None  # Health/Watch: the service it watches, once its request came
        self.remote_done = False
        self.headers_sent = False
        self.done = False
        self.timer: asyncio.TimerHandle | None = None
        facts = self.facts = call_head(head)  # what this connection's earlier calls with this head found
        self.request_id = facts.request_id  # a request without an `id` takes it (ModelInfer)
        self.encoding = facts.encoding  # of compressed messages
        self.response_encoding = facts.response_encoding
        outcome: HeadRefusal | HeadAdmission | None = facts.admitted
        if outcome is None:
            outcome = admit_head(app.head_rules, head, conn.on_loopback, time.monotonic(), self._open_watch)
            facts.remember(outcome)
        if isinstance(outcome, HeadRefusal):
            self.rpc = None  # type: ignore[assignment]  # never read: the call is done
            self.admission = None
            self.watch_counted = False
            if outcome.bad_request_id:  # echoed in every answer's head and in access lines: not echoed
                self.request_id = None
            self.finish(outcome.status, outcome.message, outcome.http_status)
            return
        self.rpc: Rpc = outcome.rpc
        self.admission: Admission | None = outcome.admission  # the access policy's, held till the call ends
        self.watch_counted = outcome.watch_counted  # Health/Watch: counted against the caps (open_watch)
        if outcome.rpc.kind is Kind.STREAM_INFER:
            self.streaming = StreamState()
        if (seconds := outcome.timeout_s) is not None:
            self.timer = asyncio.get_running_loop().call_later(seconds, self._deadline)

    def _open_watch(self) -> str:
        """Count this Health/Watch against the caps (admit_head asks): why not, or "" when counted."""
        return self.app.open_watch(self.conn)

    # ------------------------------------------------------------------ StreamHandler

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        if self.done:
            return
        if data:
            if self.rpc.kind is Kind.STREAM_INFER:
                self._read_stream(data)
            else:
                self._read_messages(data)
            if self.done:
                return
        if end_stream:
            self.remote_done = True
            if self.streaming is None or not self.streaming.paused:
                self._requests_complete()
            elif data:
                self._account()
        elif data:
            self._account()

    def headers_received(self, head: RequestHead, end_stream: bool) -> None:
        """Trailers of the request (the core lets only those through, with END_STREAM): their fields are
        not used."""
        self.data_received(_EMPTY, end_stream)

    def reset(self, code: int = H2Error.CANCEL) -> None:
        if not self.done:
            self.done = True
            self._stop_work()
        self._drop_request()
        if self.admission is not None:
            self._release_access()

    # ------------------------------------------------------------------ requests in

    def _read_messages(self, data: memoryview) -> None:
        whole = self.whole
        if whole is not None:
            self.fed = True
            filled = self.filled
            missing = len(whole) - filled
            if len(data) < missing:
                whole[filled:filled + len(data)] = data
                self.filled = filled + len(data)
                return
            whole[filled:] = data[:missing]
            self.whole = None
            self._read_messages(whole)  # exactly one message
            if len(data) > missing and not self.done:
                self._read_messages(data[missing:])
            return
        buf = self.buffer
        if buf is not None:
            buf += data
            self.fed = True
            if len(buf) < self.need:
                return  # a large message still arriving: don't re-read it on every frame
            data = memoryview(buf)  # `buf` is never resized again: views of it stay valid
            self.buffer = None
        offset, size = 0, len(data)
        while True:
            if size - offset < 5:
                self.need = 5
                break
            flag, length = PREFIX.unpack_from(data, offset)
            if length > self.app.max_message_bytes:  # rejected before it is buffered, as grpc does
                self.finish(S.RESOURCE_EXHAUSTED, f"received message larger than max ({length} vs. "
                                                  f"{self.app.max_message_bytes})")
                return
            if size - offset - 5 < length:
                self.need = 5 + length
                break
            message = data[offset + 5:offset + 5 + length]
            offset += 5 + length
            if flag:
                try:
                    message = decompress(  # type: ignore[assignment]
                        flag, self.encoding, message, self.app.max_message_bytes)
                except MessageError as e:
                    self.finish(e.status, e.message, extra=e.extra)
                    return
            if self.request is not None:
                self.finish(S.INTERNAL, "a unary RPC got more than one request message")
                return
            else:
                self.request = message
        if offset < size:
            if self.need >= _WHOLE_BYTES:  # (the prefix is in: `need` is the message's size)
                whole = np.empty(self.need, np.uint8).data  # not zeroed: every byte is copied in
                part = data[offset:]
                whole[:len(part)] = part
                self.whole = whole
                self.filled = len(part)
            else:
                self.buffer = bytearray(data[offset:])

    def _account(self) -> None:
        """After DATA that did not end the request: what the call holds (a partial message at its declared
        length, a unary request awaiting END_STREAM) is drawn from the connection's budget, or the call ends
        RESOURCE_EXHAUSTED; a call holding a partial message is watched for stalls."""
        buf = self.buffer
        partial = buf is not None or self.whole is not None
        if buf is not None:
            held = max(self.need, len(buf))
        elif self.whole is not None:
            held = len(self.whole)
        else:
            held = 0 if self.streaming is None else self.streaming.held_bytes
        if self.request is not None:
            held += len(self.request)
        # (a stream's messages are reserved in the in-flight budget as their lengths arrive: _reserve)
        if self.rpc.kind is not Kind.STREAM_INFER and not self._held_within_budget(held):
            return
        if held != self.reserved:
            budget = self.conn.request_bytes
            if held > self.reserved and not budget.take(held - self.reserved):
                self.finish(S.RESOURCE_EXHAUSTED,
                            f"request messages buffered on this connection would exceed {budget.limit} "
                            "bytes: send fewer large messages at once")
                return
            if held < self.reserved:
                budget.give(self.reserved - held)
            self.reserved = held
        if not partial:  # (a stream we do not read is not the client stalling: what waits is `held`)
            self.app.partial.discard(self)
        elif self not in self.app.partial:
            self.app.partial.add(self)
            self.fed = True

    def _held_within_budget(self, held: int) -> bool:
        """The server's in-flight budget covers the most this call has held; past it the call ends
        RESOURCE_EXHAUSTED (its admission is released as it ends)."""
        admission = self.admission
        access = self.app.access
        if admission is None or held <= admission.bytes or access is None or access.budget is None:
            return True
        refusal = access.grow(admission, held - admission.bytes)
        if refusal is None:
            return True
        self.finish(GRPC_STATUS[refusal.kind], with_retry(refusal))
        return False

    def _release_access(self) -> None:
        admission = self.admission
        if admission is not None:
            self.admission = None
            freed = admission.bytes
            self.app.access.release(admission)  # type: ignore[union-attr]
            if freed:
                self.app.budget_freed()

    def _drop_request(self) -> None:
        """The request's bytes are handed on or no longer wanted: the budget is given back, a large dropped
        buffer noted for handing memory back to the OS."""
        self.request = None
        partial = self.buffer if self.buffer is not None else self.whole  # at most one holds a message
        if partial is not None:
            self.buffer = self.whole = None
            if len(partial) >= _LARGE_BUFFER:
                self.app.memory.freed(len(partial))
        if self.streaming is not None:
            self.streaming.drop_held()
        if self.reserved:
            self._release_budget()

    def _release_budget(self) -> None:
        self.conn.request_bytes.give(self.reserved)
        self.reserved = 0
        self.app.partial.discard(self)

    def _requests_complete(self) -> None:
        """The client half-closed: run a unary call now; a stream finishes when its last answer went out."""
        rpc = self.rpc
        if self.buffer or self.whole is not None:
            self.finish(S.INTERNAL, "the request ended inside a message")
            return
        if self.reserved:  # what the request held is handed on now
            self._release_budget()
        if rpc.kind is Kind.STREAM_INFER:
            if not self.streaming.pending:
                self.finish(S.OK, "")
            return
        if self.request is None:
            self.finish(S.INTERNAL, "a unary RPC got no request message")
            return
        if self.admission is not None and not self._held_within_budget(len(self.request)):
            return
        try:
            if rpc.kind is Kind.INFER:
                message, self.request = self.request, None
                if len(message) >= _LARGE_BUFFER:  # freed once answered: the heap is trimmed when these stop
                    self.app.memory.freed(len(message))
                # its one done-callback
                admission = self.admission  # the key's owner id: inline, this is every ModelInfer's path
                self.work = rpc.handler(message, self.start_ns, self._infer_done, self.request_id,
                                        "" if admission is None else admission.owner)
                return
            request = rpc.request_type.FromString(self.request)
            self.request = None
            if rpc.kind is Kind.WATCH:  # the status now, then on every change, until the client leaves
                self.watching = request.service
                self.app.health.watch(request.service, self._watch_status)
                return
            result = rpc.handler(request, Caller(self._owner(), *self.conn.ends())) if rpc.caller else \
                rpc.handler(request)
            if inspect.isawaitable(result):
                self.work = asyncio.ensure_future(result)
                self.work.add_done_callback(self._unary_done)
            else:
                self._reply(result.SerializeToString())
        except Exception as e:  # EngineError, DecodeError or a bug: each becomes a status
            self._fail(e)

    def _owner(self) -> str:
        """The owner id of the API key the call presented ("" without keys): engine/access/caller.py."""
        return self.admission.owner if self.admission is not None else ""

    # ------------------------------------------------------------------ answers out

    def _infer_done(self, future: asyncio.Future[Any]) -> None:
        self.work = None
        if self.done:
            return
        if future.cancelled():
            self.finish(S.CANCELLED, "the request was cancelled")
        elif (exc := future.exception()) is not None:
            self._fail(exc)
        else:
            try:
                parts, size = self.app.handlers.wire.encode(future.result())
            except Exception as e:  # a bug in encoding: answer INTERNAL, keep serving
                self._fail(e)
                return
            self._reply_parts(parts, size)

    def _unary_done(self, task: asyncio.Future[Any]) -> None:
        self.work = None
        if self.done or task.cancelled():
            return
        if (exc := task.exception()) is not None:
            self._fail(exc)
        else:
            self._reply(task.result().SerializeToString())

    def _watch_status(self, status: int) -> None:
        """A Health/Watch stream's next message, from the process's HealthWatch."""
        if not self.done:
            self._send_message(health.HealthCheckResponse(status=status).SerializeToString())

    def _reply(self, body: bytes) -> None:
        self._reply_parts([body], len(body))

    def _reply_parts(self, parts: list[Any], size: int) -> None:
        """The one response of a unary call, a message of `size` bytes in `parts`: headers, message and
        trailers in one write."""
        if size > self.app.max_message_bytes:
            self.finish(S.RESOURCE_EXHAUSTED, f"response message larger than max ({size} vs. "
                                              f"{self.app.max_message_bytes})")
            return
        self.done = True
        if self.timer is not None:
            self._stop_timer()
        if self.admission is not None:
            self._release_access()
        encoding = self.response_encoding
        head = self.facts.answer_head  # (every unary answer: the head's, built once per head and connection)
        if head is None:
            head = self.facts.answer_head = self._head()
        message = [PREFIX.pack(0, size), *parts] if encoding is None else frame(parts, size, encoding)
        self.conn.send(self.stream, head, message, OK_TRAILERS)

    def _head(self) -> bytes:
        """The response headers: cached, plus the client's x-request-id echoed when it sent one."""
        head = response_head(self.response_encoding)
        if self.request_id is not None:
            head += literal(b"x-request-id", self.request_id)
        return head

    def _send_message(self, body: bytes) -> None:
        self._send_message_parts([body], len(body))

    def _send_message_parts(self, parts: list[Any], size: int) -> None:
        """One message of a streaming response, `size` bytes in `parts`; the response headers go first."""
        if size > self.app.max_message_bytes:
            self.finish(S.RESOURCE_EXHAUSTED, f"response message larger than max ({size} vs. "
                                              f"{self.app.max_message_bytes})")
            return
        head = None if self.headers_sent else self._head()
        self.headers_sent = True
        self.conn.send(self.stream, head, frame(parts, size, self.response_encoding), None)

    def finish(self, status: int, message: str, http_status: int = 200, extra: bytes = b"") -> None:
        """End the call with `status`: trailers, or a trailers-only response if no headers went out yet;
        `extra`, an encoded header field, goes with them."""
        if self.done:
            return
        self.done = True
        self._stop_work()
        self._drop_request()
        if self.admission is not None:
            self._release_access()
        if status == S.OK and self.headers_sent:
            block = OK_TRAILERS
        else:
            block = status_block(status, message, not self.headers_sent, http_status)
        self.conn.send(self.stream, None, [], block + extra)

    def _fail(self, error: BaseException) -> None:
        if isinstance(error, EngineError):
            self.finish(STATUS[error.code], endpoint_message(error, "ModelInfer RPC"))
        elif isinstance(error, DecodeError):
            self.finish(S.INTERNAL, f"could not parse the request message: {error}")
        else:
            log.error("gRPC handler failed", exc_info=error)
            self.finish(S.INTERNAL, f"internal error: {error!r}")

    def _deadline(self) -> None:
        self.timer = None
        self.finish(S.DEADLINE_EXCEEDED, "deadline exceeded")  # cancels the work: the batcher drops it

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _stop_work(self) -> None:
        self._stop_timer()
        if self.watching is not None:
            self.app.health.unwatch(self.watching, self._watch_status)
            self.watching = None
        if self.watch_counted:
            self.watch_counted = False
            self.app.close_watch(self.conn)
        if self.work is not None:
            self.work.cancel()
            self.work = None
        if self.streaming is not None:
            self._stop_stream()
