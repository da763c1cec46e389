"""ModelStreamInfer's side of a gRPC `Call` (call.py): a stream's messages read as they come, each request
admitted and submitted on its own, its answers and a decoupled model's responses sent as they come, and the
stream not read while it must wait.

A ModelStreamInfer stream is admitted without quotas (who may call only); each of its requests is admitted as
a unary request is (`AccessPolicy.admit_part`: its key's concurrency slot and rate token), and holds its
message's bytes of the in-flight budget, reserved as the message's length prefix arrives, until it is answered
(a decoupled model's final response). A request its key's quotas refuse is answered on the stream with an
error (`error_message`, its id), and the stream goes on, as for any failed request. Where a stream must wait,
it is not read (its window is held: HTTP/2 flow control, so the client's messages wait in the client, in
order, and none is lost or failed): while `CallLimits.max_stream_requests` of its requests are in flight (not
counting a sequence's requests, `capped`: those wait for their sequence's slot, which may free only when a
later message of the stream arrives, so a stream interleaving many sequences would wait on itself; the
sequence batcher bounds them, engine/scheduling/sequence/policy.py BacklogLimits), while answers wait on it
for the client's window, and while its next message does not fit the budget (retried as bytes come back). What
arrives meanwhile is at most the window the client had left.
A decoupled model's responses are counted against their request's `StreamWindow` (engine/streaming/window.py)
as they leave for the client, so a client that does not read stops the model's sends.

`StreamInfer` is a base of `Call`, not an object of its own: these methods read and write the call's fields
(declared in `Call.__slots__`) and its `StreamState` (`Call.streaming`, stream_state.py: what only a stream
holds, so a unary call allocates none of it), on the hot path of every streamed request, so they stay plain
methods of the one object.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

from ...access.policy import GRPC_STATUS, Admission, Refusal
from ...errors import EngineError, ErrorCode
from ...streaming.window import StreamWindow
from .handlers import GrpcStatus as S
from .handlers import StreamAnswer
from .messages import PREFIX, MessageError, decompress
from .rpcs import with_retry

if TYPE_CHECKING:
    from ..h2.connection import H2Connection
    from ..h2.streams import H2Stream
    from .app import GrpcApp
    from .rpcs import Rpc
    from .stream_state import StreamState


class StreamInfer:
    """The methods of a `Call` that only a ModelStreamInfer stream runs."""

    if TYPE_CHECKING:  # what these methods use of the Call they are part of (call.py declares the slots)
        app: GrpcApp
        conn: H2Connection
        stream: H2Stream
        rpc: Rpc
        admission: Admission | None
        encoding: str
        request_id: bytes | None
        buffer: bytearray | None
        need: int
        fed: bool
        done: bool
        remote_done: bool
        streaming: StreamState  # (None on a Call of any other RPC, which never runs these)

        def finish(self, status: int, message: str, http_status: int = 200, extra: bytes = b"") -> None: ...
        def _fail(self, error: BaseException) -> None: ...
        def _account(self) -> None: ...
        def _requests_complete(self) -> None: ...
        def _send_message_parts(self, parts: list[Any], size: int) -> None: ...
    else:
        __slots__ = ()  # no fields of its own: Call's __slots__ hold them all

    # ------------------------------------------------------------------ requests in

    def _read_stream(self, data: memoryview) -> None:
        """A ModelStreamInfer call's DATA: each message submitted as it completes, its bytes reserved in the
        in-flight budget as soon as its length prefix is in. Reading stops (`_pause`: the stream's window is
        held) while `_must_wait` says so or the next message does not fit the budget; what was not read, and
        what arrives meanwhile, waits as it came (`held`, `held_more`: views, not copies) until `read_on`."""
        if self.streaming.paused:
            self.streaming.held_more.append(data)  # valid as long as we keep it (StreamHandler.data_received)
            self.streaming.held_bytes += len(data)
            return
        buf = self.buffer
        if buf is not None:
            buf += data
            self.fed = True
            if len(buf) < self.need:
                return
            data = memoryview(buf)  # `buf` is never resized again: views of it stay valid
            self.buffer = None
        offset, size = 0, len(data)
        max_bytes = self.app.max_message_bytes
        while True:
            if self.streaming.next_bytes < 0 and self._must_wait():  # between two messages
                self._pause()
                break
            if size - offset < 5:
                self.need = 5
                break
            flag, length = PREFIX.unpack_from(data, offset)
            if self.streaming.next_bytes < 0:
                if length > max_bytes:  # rejected before it is buffered, as grpc does
                    self.finish(S.RESOURCE_EXHAUSTED, f"received message larger than max ({length} vs. "
                                                      f"{max_bytes})")
                    return
                if not self._reserve(length):
                    if self.done:
                        return
                    break
                self.streaming.next_bytes = length
            if size - offset - 5 < length:
                self.need = 5 + length
                break
            message = data[offset + 5:offset + 5 + length]
            offset += 5 + length
            self.streaming.next_bytes = -1
            if flag:
                try:
                    message = decompress(flag, self.encoding, message, max_bytes)  # type: ignore[assignment]
                except MessageError as e:
                    self.finish(e.status, e.message, extra=e.extra)
                    return
            self._stream_request(message, length)
            if self.done:
                return
        if offset < size:
            if self.streaming.paused:  # unread until read_on: kept as it is, however many messages it holds
                self.streaming.held = data[offset:]
                self.streaming.held_bytes = size - offset
            else:  # part of one message: copied, so what it came in is not kept
                self.buffer = bytearray(data[offset:])

    def _must_wait(self) -> bool:
        """Whether the stream's next message must wait: its requests in flight are at the cap, or answers
        wait on it for the client's window (the drain then reads on)."""
        if len(self.streaming.capped) >= self.app.call_limits.max_stream_requests:
            return True  # an answer reads on
        if self.stream.pending:
            self.stream.on_drained = self._drained
            return True
        return False

    def _pause(self) -> None:
        self.streaming.paused = True
        self.stream.held = True  # no WINDOW_UPDATE: the client's messages wait in the client
        self.need = 5
        self.app.partial.discard(self)

    def _reserve(self, length: int) -> bool:
        """The next message's bytes drawn from the in-flight budget into the call's admission, before it is
        read. False when they do not fit: the stream waits for room (`GrpcApp.budget_freed`), or, for a
        message larger than the whole budget, the call ends RESOURCE_EXHAUSTED."""
        admission, access = self.admission, self.app.access
        if admission is None or access is None or access.budget is None or not length:
            return True
        refusal = access.grow(admission, length)
        if refusal is None:
            self.app.budget_waiting.pop(self, None)
            return True
        if length > access.budget.limit:  # never fits
            self.finish(GRPC_STATUS[refusal.kind], with_retry(refusal))
            return False
        self._pause()
        self.streaming.waiting_bytes = length
        self.app.budget_waiting[self] = None
        return False

    def read_on(self) -> None:
        """Called when what held the stream may be gone (an answer, a drained stream, budget come back):
        read what waited and take DATA again, unless something still holds it; then finish a stream whose
        client half-closed once nothing is left."""
        if self.done:
            return
        if self.streaming.paused:
            if self._must_wait():
                return
            self.streaming.paused = False
            self.app.budget_waiting.pop(self, None)
            held = self.streaming.take_held()
            if held:
                self._read_stream(held)
                if self.done:
                    return
            if self.streaming.paused:  # held again by what waited: its window stays held
                self._account()
                return
            self.conn.open_window(self.stream)
            if not self.remote_done:
                self._account()
                return
        if self.remote_done:
            self._requests_complete()

    def _stream_request(self, message: memoryview, length: int) -> None:
        """One request of the stream, admitted as a unary request of its key would be (its message's `length`
        bytes move from the call's admission to its own), then submitted; refused, it is answered with an
        error on the stream, which goes on."""
        admission: Admission | None = None
        access = self.app.access
        if self.admission is not None and access is not None:
            verdict = access.admit_part(self.admission, length, time.monotonic())
            if isinstance(verdict, Refusal):
                self._refuse_request(message, verdict)
                return
            admission = verdict
        window = StreamWindow()  # a decoupled model's responses, counted as they leave for the client
        try:
            # its one done-callback, where a decoupled model's responses before its last go, the call's
            # x-request-id, its API key's owner id, and where its responses are counted
            partial = functools.partial(self._stream_partial, window)
            call = self.admission
            future, sequenced = self.rpc.handler(message, self._stream_answered, partial, self.request_id,
                                                 "" if call is None else call.owner, window)
        except Exception as e:  # an unparsable message ends the stream, as grpc does
            if admission is not None and access is not None:
                access.release(admission)
            self._fail(e)
            return
        self.streaming.pending[future] = admission
        if not sequenced:
            self.streaming.capped.add(future)

    def _refuse_request(self, message: memoryview, refusal: Refusal) -> None:
        try:
            parts, size = self.app.handlers.stream_refusal(
                message, EngineError(ErrorCode.RESOURCE_EXHAUSTED, with_retry(refusal)))
        except Exception as e:  # an unparsable message ends the stream, as grpc does
            self._fail(e)
            return
        self._send_message_parts(parts, size)

    # ------------------------------------------------------------------ answers out

    def _stream_answered(self, future: asyncio.Future[Any], answer: StreamAnswer) -> None:
        admission = self.streaming.pending.pop(future, None)
        self.streaming.capped.discard(future)
        freed = 0
        if admission is not None:  # what the request held goes back as it is answered
            freed = admission.bytes
            self.app.access.release(admission)  # type: ignore[union-attr]
        if not self.done:
            if isinstance(answer, BaseException):
                self._fail(answer)
            else:
                if answer is not None:
                    self._send_message_parts(*answer)
                if (self.streaming.paused or self.remote_done) and not self.done:
                    self.read_on()
        if freed and self.app.budget_waiting:
            self.app.budget_freed()

    def _stream_partial(self, window: StreamWindow, answer: tuple[list[Any], int]) -> None:
        """A decoupled model's response before its last: out at once; it counts as taken by the client
        (credit for the model's next send) once it has left, at once or when what waits on the stream
        drains."""
        if self.done:
            return
        self._send_message_parts(*answer)
        if self.stream.pending:
            self.streaming.unsent.append(window)
            self.stream.on_drained = self._drained
        else:
            window.taken()

    def _drained(self) -> None:
        """From the sending half, as what waited on the stream went out: the rest runs in its own callback."""
        if not self.streaming.drain_due and not self.done:
            self.streaming.drain_due = True
            asyncio.get_running_loop().call_soon(self._after_drain)

    def _after_drain(self) -> None:
        self.streaming.drain_due = False
        if self.done:
            return
        if self.stream.pending:  # more was queued since: wait for that too
            self.stream.on_drained = self._drained
            return
        unsent, self.streaming.unsent = self.streaming.unsent, []
        for window in unsent:
            window.taken()
        self.read_on()

    def _stop_stream(self) -> None:
        """The call ended (Call._stop_work): its requests in flight are cancelled and what their admissions
        held goes back; nothing more is sent or read."""
        streaming = self.streaming
        streaming.unsent.clear()
        self.app.budget_waiting.pop(self, None)
        streaming.capped.clear()
        if streaming.pending:
            pending, streaming.pending = streaming.pending, {}
            freed = 0
            for future, admission in pending.items():
                future.cancel()
                if admission is not None:
                    freed += admission.bytes
                    self.app.access.release(admission)  # type: ignore[union-attr]
            if freed:
                self.app.budget_freed()
