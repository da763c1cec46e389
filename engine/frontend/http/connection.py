"""One HTTP/1.1 connection: its two states (states.py), timeouts, flow control and writing answers.

`HttpProtocol` knows no routes: each request its `RequestReader` (reader.py: llhttp, the head and body
limits, the access check) completes goes to its owner's `handle()` (the routes', in routes.py), which answers
at once (an `Answer`) or later (a `Pending`); those types are types.py's. Answers leave in request order,
one request in flight at a time. Two states drive it (states.py): the reader's `ReadState`, and
`AnswerState`, ours: IDLE, WAITING for the one request in flight, STREAMING its answer, then LINGERING,
CLOSING, GONE as the connection ends.
What one client cannot do through it, beyond what the reader refuses (the limits are `HttpLimits`):
- stall: a head must be complete within `client_timeout_secs` of its first byte and a body may pause no longer
  (408); answers left unread that long abort the connection; `idle_timeout_secs` with nothing in flight closes
  it. The owner's one sweeper calls `sweep()`: no timer per request;
- pile up pipelined requests: with one in flight and another complete one waiting, reading pauses (exactly
  while a request waits in the queue);
- buffer a streamed answer it does not read: the route awaits `drain()` after each piece, which waits while
  the transport is paused (and one that stops reading is dropped after `client_timeout_secs`);
- hold what the access policy let a request hold past its answer: an admitted request's admission (a key's
  concurrency slot, its bytes of the in-flight budget) goes back when it is answered or dropped, and a
  refused one is answered in its turn.

A streamed answer (generate_stream, the OpenAI API's server-sent events; types.py `ResponseStream`, the
one way a route streams) goes out as it is produced, through the connection's `start`, `send` and `drain`,
while the request is in flight; it ends when the request's future resolves (`_end_stream`), and only then is
the request's admission released. It is chunked (RFC 9112 §7.1) when the connection stays open; to a client
that asked for `Connection: close`, and to every HTTP/1.0 client (chunks are HTTP/1.1's), it is
close-delimited instead (§6.3), which needs no chunked decoding.

A body lives in its request object only, and the reader's parser (a reference cycle through its callbacks) is
cut loose when the connection ends, so buffers are freed by reference counting, not by the cycle collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from ...access.caller import ends
from ..connections import client_of, close_refused, is_loopback
from .answers import REASONS, connection_refusal, error_answer, refusal_answer
from .reader import DIRECT_BODY_BYTES, RequestReader
from .sse import LAST_CHUNK, chunk
from .states import ANSWER_AFTER, ENDED, AnswerEvent, AnswerState, ReadState, answer_after, answer_refused
from .types import Answer, HttpRequest, Pending

if TYPE_CHECKING:
    from .app import HttpApp  # the owner: limits, closing, connections, handle(), large_body_dropped()

log = logging.getLogger("hubserve.http")

READ_BYTES = DIRECT_BODY_BYTES  # each read's size outside a large body (the owner's shared buffer)
LARGE_BODY_BYTES = 1 << 20  # letting a body this large go asks the owner to hand freed heap back to the OS
LINGER_QUIET_SECS = 1.0  # after our last answer, a client silent this long is closed on
_SMALL_WRITE = 65536  # answers below this go out in one write with their head
_monotonic = time.monotonic  # looked up once: it runs twice per request
_IDLE, _HEAD, _BODY = ReadState.IDLE, ReadState.HEAD, ReadState.BODY
_ANSWER_IDLE, _WAITING = AnswerState.IDLE, AnswerState.WAITING
_STREAMING, _STREAMING_TO_CLOSE = AnswerState.STREAMING, AnswerState.STREAMING_TO_CLOSE
# the two moves of each request answered later, looked up once (states.py: one dict lookup per move)
_DISPATCH, _ANSWERED = AnswerEvent.DISPATCH, AnswerEvent.ANSWERED
_AFTER_DISPATCH, _AFTER_ANSWERED = ANSWER_AFTER[_DISPATCH], ANSWER_AFTER[_ANSWERED]


class HttpProtocol(asyncio.BufferedProtocol):
    """A buffered protocol: the transport reads into the buffer `get_buffer` returns (the owner's shared
    read buffer, or the rest of a large body: reader.py `body_buffer`), then calls `buffer_updated`."""

    def __init__(self, owner: HttpApp) -> None:
        self._owner = owner
        self._read_buffer = owner.read_buffer
        self._limits = owner.limits
        self._access = owner.access
        now = _monotonic()
        # the client's side (its `state` is states.py's ReadState); it hands us each request it completes
        self._reader = RequestReader(self._limits, self._access, self._received, now)
        self._feed = self._reader.feed  # bound once: called per read
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._admitted: str | None = None  # the client address the counter counted this connection under
        self._answer = _ANSWER_IDLE  # our side (states.py): the answer in flight, or how the connection ends
        # Parsed, waiting for the one in flight. Reading is paused exactly while this is not empty.
        self._queue: deque[HttpRequest] = deque()
        self._inflight: Pending | None = None  # set while WAITING or STREAMING
        self._inflight_req: HttpRequest | None = None
        self._final: tuple[int, str] | None = None  # an error to send once the requests before it are out
        self._drained: asyncio.Future[None] | None = None  # a streaming route waiting in drain()
        self._write_paused_at = 0.0  # when the transport stopped taking our writes; 0 while it takes them
        self._linger_at = 0.0  # when LINGERING began
        self._closing_at = 0.0  # when CLOSING began
        self._last_tx = now

    # ------------------------------------------------------------------ transport events

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, base)  # a stream transport: TCP, TLS or Unix
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):  # not a TCP socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._peer = f"{peer[0]}:{peer[1]}"
        loopback_only = self._owner.loopback_only
        if loopback_only is not None and is_loopback(peer):
            loopback_only = None  # a peer on loopback may call every group
        self._reader.connected(transport, ends(transport), loopback_only)
        counter = self._owner.counter
        if counter is not None:
            client = client_of(peer)
            refused = counter.admit(client)
            if refused:  # answered and closed at once: a refused connection holds nothing while it lingers
                log.warning("HTTP %s: refused: %s", self._peer, refused)
                self._lose()
                transport.write(connection_refusal(refused))
                close_refused(transport, counter)
                return
            self._admitted = client
        self._owner.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose()
        self._owner.connections.discard(self)
        if self._admitted is not None and self._owner.counter is not None:
            self._owner.counter.release(self._admitted)
            self._admitted = None
        inflight = self._inflight
        if inflight is not None and not inflight.future.done():
            # the batcher drops it from its queue; a streaming route's task is cancelled (a generation frees
            # its KV blocks, a decoupled request is cancelled, a forwarded stream is cancelled in the engine)
            inflight.future.cancel()
        self._wake_drain()
        held = (self._reader.drop_partial(), self._inflight_req, *self._queue)
        large = sum(len(r.body) for r in held if r is not None and len(r.body) >= LARGE_BODY_BYTES)
        if self._access is not None:
            for r in held:
                self._release(r)
        # Drop every request (the reader's cycle through its parser was cut as it stopped).
        self._queue.clear()
        self._inflight = self._inflight_req = None
        self._transport = None
        if large:
            self._owner.large_body_dropped(large)

    def get_buffer(self, sizehint: int) -> memoryview:
        reader = self._reader
        return reader.body_buffer() if reader.in_place else self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        reader = self._reader
        if reader.in_place:
            reader.body_read(nbytes, _monotonic())
            return
        problem = self._feed(self._read_buffer[:nbytes], _monotonic())
        if problem is not None:
            self._fail(*problem)

    def pause_writing(self) -> None:
        self._write_paused_at = _monotonic()

    def resume_writing(self) -> None:
        self._write_paused_at = 0.0
        self._wake_drain()
        if self._answer is _ANSWER_IDLE:
            self._next()

    # ------------------------------------------------------------------ dispatch and answers

    def _received(self, req: HttpRequest) -> None:
        """The reader completed `req` (called from inside its feed, in order): dispatch it now, or queue
        it behind the one in flight."""
        queue = self._queue
        if not queue and self._answer is _ANSWER_IDLE and not self._write_paused_at:
            self._dispatch(req)  # the usual case: nothing before it, so it goes at once
        else:
            # One request in flight (or its answer unread) and this complete one waiting: read no further
            # until it is answered, so a pipelining client cannot make us buffer body after body.
            if not queue and self._transport is not None:
                self._transport.pause_reading()
            queue.append(req)

    def _next(self) -> None:
        """Dispatch waiting requests in order while none is in flight, then the error that waited for them.
        Called when an answer is written or writing resumed. Stops while the client leaves answers unread.
        Reading resumes as the last waiting request leaves the queue."""
        queue = self._queue
        while queue and self._answer is _ANSWER_IDLE and not self._write_paused_at:
            req = queue.popleft()
            if not queue and self._transport is not None:
                self._transport.resume_reading()
            self._dispatch(req)
        if self._final is not None and not queue and self._answer is _ANSWER_IDLE:
            self._send_error(*self._final)

    def _dispatch(self, req: HttpRequest) -> None:
        """Answer `req` now (a refusal, or a route's answer at once) or put it in flight; called with nothing
        in flight."""
        if req.refusal is not None:
            self._respond(req, refusal_answer(req.refusal))
            return
        req.stream = self
        answer = self._owner.handle(req, self._on_done)
        if isinstance(answer, tuple):
            self._respond(req, answer)
            return
        self._inflight = answer
        self._inflight_req = req
        self._answer = _AFTER_DISPATCH.get(self._answer) or answer_refused(self._answer, _DISPATCH)

    def _on_done(self, fut: asyncio.Future[Any]) -> None:
        """The in-flight request's future is done (called once, after the data plane's accounting)."""
        pending, req = self._inflight, self._inflight_req
        if pending is None or pending.future is not fut or req is None:
            return  # the connection went away (it cancelled the request): nobody to answer
        self._inflight = self._inflight_req = None
        state = self._answer
        if state in ENDED:  # dropped while it ran
            self._release(req)
            return
        self._answer = _AFTER_ANSWERED.get(state) or answer_refused(state, _ANSWERED)
        if state is _WAITING:
            self._respond(req, pending.answer())
        else:
            self._end_stream(req, fut, chunked=state is _STREAMING)
        self._next()

    def _respond(self, req: HttpRequest, answer: Answer) -> None:
        self._write(answer, self._keep(req), head_only=req.method == b"HEAD")
        if req.admission is not None:
            self._release(req)
        if len(req.body) >= LARGE_BODY_BYTES:
            self._owner.large_body_dropped(len(req.body))

    def _keep(self, req: HttpRequest) -> bool:
        """Whether the connection stays open after answering `req`. Draining: close after this answer,
        unless more of this client's requests are already here."""
        return req.keep_alive and not (self._owner.closing and self._quiet())

    def _quiet(self) -> bool:
        """No request of this client's is here beyond the one being answered: none waits, none is being
        read, and no error waits to be sent (one does only after reading STOPPED)."""
        return not self._queue and self._reader.state is _IDLE

    def _release(self, req: HttpRequest | None) -> None:
        """The request was answered or dropped: what the access policy let it hold goes back, once."""
        if req is not None and req.admission is not None and self._access is not None:
            admission, req.admission = req.admission, None
            self._access.release(admission)

    def _write(self, answer: Answer, keep: bool, head_only: bool = False) -> None:
        """`head_only`: the answer to a HEAD request, whose head says what a GET's would (its length
        included) and which has no body (RFC 9110 9.3.2): a client reading the next answer on the connection
        would take the body for it."""
        transport = self._transport
        if transport is None:
            return
        status, body, content_type, extra = answer
        parts = body if isinstance(body, list) else [body]
        size = 0
        for part in parts:  # (every answer: no generator resumed per part)
            size += len(part)
        if head_only:
            parts = []
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status, REASONS.get(status, b"Unknown"), content_type, size, extra,
            b"" if keep else b"Connection: close\r\n")
        if size < _SMALL_WRITE:  # one buffer, one send: cheaper than a gathered write for small answers
            transport.write(b"".join([head, *parts]))
        else:  # no copy of a large body: one gathered write of the head and the parts as they are
            transport.writelines([head, *parts])
        self._last_tx = _monotonic()
        if not keep:
            self._close_gracefully()

    # ------------------------------------------------------------------ streamed answers (ResponseStream)

    def start(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        """The head of the in-flight request's streamed answer, once. Chunked when the connection stays open
        after it; close-delimited (no length, no chunks: the body ends at our FIN) when it does not, and
        for an HTTP/1.0 client, which may not understand chunks."""
        req, transport = self._inflight_req, self._transport
        if req is None or transport is None or self._answer is not _WAITING:
            return
        keep = self._keep(req) and not req.http10  # chunked only when the connection stays open
        self._answer = answer_after(self._answer,
                                    AnswerEvent.STREAM_CHUNKED if keep else AnswerEvent.STREAM_TO_CLOSE)
        framing = b"Transfer-Encoding: chunked\r\n" if keep else b"Connection: close\r\n"
        transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s\r\n" % (
            status, REASONS.get(status, b"Unknown"), content_type, extra, framing))
        self._last_tx = _monotonic()

    def send(self, data: bytes) -> None:
        """One piece of the streamed answer, written now (TCP_NODELAY: it leaves at once)."""
        transport, state = self._transport, self._answer
        if transport is None or not data:
            return
        if state is _STREAMING:
            transport.write(chunk(data))
        elif state is _STREAMING_TO_CLOSE:
            transport.write(data)
        else:
            return
        self._last_tx = _monotonic()

    async def drain(self) -> None:
        """Returns once the transport takes more (at once unless the client leaves what we sent unread)."""
        while self._write_paused_at and self._transport is not None:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)

    def _wake_drain(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end_stream(self, req: HttpRequest, fut: asyncio.Future[Any], chunked: bool) -> None:
        """The streaming route's task is done: end the body (the last chunk, or the close). A chunked body
        is the one that keeps the connection open."""
        keep = chunked
        if not fut.cancelled() and fut.exception() is not None:
            log.error("HTTP %s: streamed answer failed: %r", self._peer, fut.exception())
            keep = False
        transport = self._transport
        if transport is not None and chunked:
            transport.write(LAST_CHUNK)
            self._last_tx = _monotonic()
        if not keep:
            self._close_gracefully()
        self._release(req)
        if len(req.body) >= LARGE_BODY_BYTES:
            self._owner.large_body_dropped(len(req.body))

    def _fail(self, status: int, message: str) -> None:
        """The client broke a rule: parse nothing more, drop the partial request, and answer `status` after
        the requests before it."""
        level = logging.INFO if status == 400 else logging.WARNING
        log.log(level, "HTTP %s: %d %s", self._peer, status, message)
        self._reader.stop()
        dropped = self._reader.drop_partial()
        self._release(dropped)
        if dropped is not None and len(dropped.body) >= LARGE_BODY_BYTES:
            self._owner.large_body_dropped(len(dropped.body))
        if self._answer in ENDED:
            return
        if self._answer is not _ANSWER_IDLE or self._queue:
            self._final = (status, message)
        else:
            self._send_error(status, message)

    def _send_error(self, status: int, message: str) -> None:
        self._final = None
        self._write(error_answer(status, message), keep=False)

    def _close_gracefully(self) -> None:
        """After our last answer: send FIN once it is flushed, then read and discard until the client closes
        or falls silent. Closing at once with unread input would reset the connection, and a reset can destroy
        the answer before the client has read it (a client still uploading a refused body, say). Called with
        nothing in flight, as our answer is written."""
        self._answer = answer_after(self._answer, AnswerEvent.LINGER)
        self._reader.stop()
        queue = self._queue
        reading_paused = bool(queue)
        for req in queue:
            self._release(req)
        queue.clear()
        transport = self._transport
        if transport is None:
            return
        self._linger_at = _monotonic()
        if reading_paused:
            transport.resume_reading()
        if not transport.can_write_eof():
            transport.close()
        else:
            transport.write_eof()

    # ------------------------------------------------------------------ timeouts and draining

    def sweep(self, now: float) -> None:
        """Apply the timeouts. Called by the owner's sweeper every fraction of `client_timeout_secs`."""
        transport, state = self._transport, self._answer
        if transport is None or state is AnswerState.GONE:
            return
        timeout = self._limits.client_timeout_secs
        reader = self._reader
        if state is AnswerState.CLOSING:  # close() waits for our answers to flush; one not read is dropped
            if now - self._closing_at > timeout:
                self.abort()
            return
        if self._write_paused_at and now - self._write_paused_at > timeout:
            log.warning("HTTP %s: answers left unread for over %g s, disconnecting (--client-timeout-secs)",
                        self._peer, timeout)
            self.abort()
        elif state is AnswerState.LINGERING:
            if now - max(reader.last_rx, self._linger_at) > min(LINGER_QUIET_SECS, timeout) \
                    or now - self._linger_at > timeout:
                self._close(now)
        elif self._queue:
            pass  # we stopped reading: the client cannot make progress, and it is not its fault
        elif reader.state is _HEAD and now - reader.head_at > timeout:
            self._fail(408, f"Request head not complete within {timeout:g} s of its first byte "
                            "(--client-timeout-secs)")
        elif reader.state is _BODY and now - reader.last_rx > timeout:
            self._fail(408, f"Request body stalled for over {timeout:g} s (--client-timeout-secs)")
        elif self._idle() and now - max(reader.last_rx, self._last_tx) > self._limits.idle_timeout_secs:
            log.info("HTTP %s: idle for over %g s, closing (--idle-timeout-secs)", self._peer,
                     self._limits.idle_timeout_secs)
            self._close(now)

    def close_if_quiet(self, now: float, quiet_secs: float) -> None:
        """Draining: close a connection with nothing in flight once no bytes have passed for `quiet_secs`, so
        a client that read our last answer a moment ago and is sending its next request is not cut off."""
        if self._transport is not None and self._idle() \
                and now - max(self._reader.last_rx, self._last_tx) >= quiet_secs:
            self._close(now)

    def abort(self) -> None:
        """Drop the connection whatever it is doing: called when the exit deadline has passed, and by the
        sweeper for a client that leaves our answers unread. connection_lost follows."""
        if self._transport is not None:
            self._lose()
            self._transport.abort()

    def _close(self, now: float) -> None:
        """Close once what we wrote is flushed (idle, draining, or a lingering client fell silent)."""
        self._answer = answer_after(self._answer, AnswerEvent.CLOSE)
        self._reader.stop()
        self._closing_at = now
        if self._transport is not None:
            self._transport.close()

    def _lose(self) -> None:
        """No more answers and nothing more read: the connection is gone, or going at once."""
        self._answer = answer_after(self._answer, AnswerEvent.LOSE)
        self._reader.stop()

    def _idle(self) -> bool:
        """Nothing in flight, waiting or being read: the connection may be closed without losing a request."""
        return self._answer is _ANSWER_IDLE and self._quiet()


__all__ = ["LARGE_BODY_BYTES", "HttpProtocol"]
