"""How an HTTP/2 connection ends (RFC 9113 §6.8, §5.4.1): graceful shutdown with the two-step GOAWAY,
connection errors, the peer's going away, and the timeouts `tick` checks (guard.ConnectionClock). Pure, like
the rest of the core: closing the transport is asked of the adapter (`CoreEvents.close_transport`).

Why apart from core.py: the receive loop and the stream states are one concept, ending a connection (and
letting go of everything it holds) another. `Lifecycle` is the base of `Control` (control.py), H2Core's base,
and works on H2Core's state, named below.
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import trait

from . import frames as f
from .frames import H2Error
from .guard import ConnectionClock, Expiry, FloodGuard
from .headers import FieldBlock
from .outbound import Outbound
from .streams import CoreEvents, H2Stream, Limits, StreamHandler

SHUTDOWN_PING = b"hubserve"  # opaque data of the PING that times the final GOAWAY (§6.8)


@trait  # the base of a trait (Control): mypyc requires it to be one too
class Lifecycle:
    """The ending half of H2Core. Its state lives in H2Core.__init__."""

    _limits: Limits
    _events: CoreEvents
    _out: Outbound
    _streams: dict[int, H2Stream]
    _buffer: bytearray
    _frame: memoryview | None
    in_place: bool
    _block: FieldBlock
    _guard: FloodGuard
    _clock: ConnectionClock
    _last_peer_id: int
    _shutting_down: bool
    _goaway_last: int | None
    _peer_gone: bool
    _closed: bool
    _closed_at: float | None
    _preface_done: bool
    _expect_settings: bool
    _reads: int
    _heads: int
    _opened: bool
    _handlers: tuple[Any, ...]

    def _forget(self, stream: H2Stream) -> StreamHandler:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Graceful close (§6.8): GOAWAY with the largest id (streams in flight still count), then a PING
        whose ACK times the final GOAWAY with the last stream id we saw; close once those streams finish."""
        if self._shutting_down or self._closed:
            return
        self._shutting_down = True
        self._out.write(f.goaway(f.MAX_WINDOW, H2Error.NO_ERROR) + f.ping(SHUTDOWN_PING))

    def refuse(self, message: str) -> None:
        """A connection over the server's connection limits (frontend/connections.py): GOAWAY with
        ENHANCE_YOUR_CALM and why, then close."""
        self._fail(H2Error.ENHANCE_YOUR_CALM, message)

    def abort(self) -> None:
        """The drain deadline passed: tell the peer which streams were done and close."""
        self._fail(H2Error.NO_ERROR, "shutting down")

    def _final_goaway(self) -> None:
        self._goaway_last = self._last_peer_id
        self._out.write(f.goaway(self._last_peer_id, H2Error.NO_ERROR))
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self._streams and (self._goaway_last is not None or self._peer_gone) and not self._closed:
            self._mark_closed()
            self._events.close_transport(False, None, "")  # after what is buffered has been written

    def tick(self, now: float, buffered: int = 0) -> None:
        """About once a second (the server's sweeper): a new flood window, and the timeouts. `buffered`: bytes
        in the adapter's transport write buffer."""
        # A close still flushing to a peer that doesn't read: dropped after the client timeout.
        if self._closed:
            if self._closed_at is None:
                self._closed_at = now
            elif now - self._closed_at >= self._limits.client_timeout_secs > 0:
                self._events.close_transport(True, None, "")
            return
        self._guard.tick(now)
        out = self._out
        expiry = self._clock.check(
            now, handshaken=self._preface_done and not self._expect_settings,
            busy=self._opened or bool(self._streams), reads=self._reads,
            partial_frame=bool(self._buffer) or self.in_place,
            waiting=out.paused or bool(out.blocked), drains=out.drains, buffered=buffered,
            heading=bool(self._block.stream_id) or (len(self._buffer) > 3
                                                    and self._buffer[3] in (f.HEADERS, f.CONTINUATION)),
            heads=self._heads)
        self._opened = False
        if expiry is Expiry.PREFACE:  # nothing of HTTP/2 spoken yet: no GOAWAY (§3.4)
            self._mark_closed()
            self._events.close_transport(True, None, "")
        elif expiry is Expiry.IDLE:  # §6.8: clients reconnect when they next need to
            self._final_goaway()
        elif expiry is not None:
            self._fail(H2Error.ENHANCE_YOUR_CALM if expiry is Expiry.UNREAD else H2Error.NO_ERROR,
                       expiry.value)

    def _fail(self, code: H2Error, message: str) -> None:
        """A connection error (§5.4.1): GOAWAY with the code, then close; every open stream stops. A peer
        that doesn't read (the transport is paused) is dropped at once: a close would wait on it."""
        if self._closed:
            return
        self._out.write(f.goaway(self._last_peer_id, code, message))
        self._mark_closed()
        self._events.close_transport(self._out.paused, None if code == H2Error.NO_ERROR else code, message)
        self._reset_all(code)

    def connection_lost(self) -> None:
        """The adapter's transport is gone: every stream stops, and the references between the core, its
        sending half, its frame handlers and the adapter are dropped, so all is freed at once by reference
        counting rather than by a later cyclic collection."""
        self._mark_closed()
        self._reset_all(H2Error.CANCEL)
        self._handlers = ()
        self._out.detach()
        self._events = DETACHED

    def _mark_closed(self) -> None:
        self._closed = True
        self._out.closed = True  # nothing more is written; late answers are dropped
        self._buffer = bytearray()  # a partial frame (up to max_frame_bytes) is not kept while closing
        self._frame = None
        self.in_place = False
        self._block.clear()

    def _reset_all(self, code: H2Error) -> None:
        handlers = [self._forget(stream) for stream in list(self._streams.values())]
        for handler in handlers:
            if handler is not None:
                handler.reset(code)


class _Detached:
    """The CoreEvents of a core whose connection is gone: nothing more reaches the adapter."""

    def stream_opened(self, stream: H2Stream, head: Any) -> StreamHandler:
        raise RuntimeError("the connection is gone")

    def settings_received(self) -> None:
        pass

    def goaway_received(self, last_stream_id: int, code: H2Error | int, debug: bytes) -> None:
        pass

    def stream_sent(self, stream: H2Stream) -> None:
        pass

    def output_ready(self) -> None:
        pass

    def close_transport(self, abort: bool, code: H2Error | None, message: str) -> None:
        pass


DETACHED: CoreEvents = _Detached()
