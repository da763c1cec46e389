"""How an HTTP/2 connection ends (RFC 9113 §6.8, §5.4.1): graceful shutdown with the two-step GOAWAY, connection
errors, and the timeouts the server's sweeper checks through `tick` (guard.ConnectionClock).

Why apart from connection.py: the receive loop and the stream states are one concept, ending a connection
(and letting go of everything it holds) another. `Lifecycle` is a base of H2Connection and works on its
state, named below.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import frames as f
from .frames import H2Error
from .guard import ConnectionClock, Expiry, FloodGuard
from .headers import FieldBlock
from .outbound import Outbound
from .streams import H2Stream, Limits

log = logging.getLogger("hubserve.h2")

SHUTDOWN_PING = b"hubserve"  # opaque data of the PING that times the final GOAWAY (§6.8)
_REPEAT_SECS = 10.0  # the same connection error is logged as a warning at most this often
_last_logged: dict[str, float] = {}


def _log_error(code: H2Error, message: str) -> None:
    """A flood reconnecting in a loop fails thousands of connections a second: each distinct error is a
    warning once per _REPEAT_SECS, and at debug level in between, so the log cannot be flooded instead."""
    now = time.monotonic()
    if now - _last_logged.get(message, float("-inf")) >= _REPEAT_SECS:
        if len(_last_logged) > 256:  # messages naming stream ids vary: keep the table small
            _last_logged.clear()
        _last_logged[message] = now
        log.warning("HTTP/2 connection error %s: %s (repeats within %g s are logged at debug level)",
                    code.name, message, _REPEAT_SECS)
    else:
        log.debug("HTTP/2 connection error %s: %s", code.name, message)


class Lifecycle:
    """The ending half of H2Connection. Its state lives in H2Connection.__init__ and connection_made."""

    _limits: Limits
    _transport: Any
    _out: Outbound
    _streams: dict[int, H2Stream]
    _buffer: bytearray
    _block: FieldBlock
    _guard: FloodGuard
    _clock: ConnectionClock | None
    _last_stream_id: int
    _shutting_down: bool
    _goaway_last: int | None
    _peer_gone: bool
    _closed: bool
    _closed_at: float | None
    _preface_done: bool
    _expect_settings: bool
    _reads: int
    _opened: bool

    def _forget(self, stream: H2Stream) -> Any:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Graceful close (§6.8): GOAWAY with the largest id (streams in flight still count), then a PING
        whose ACK times the final GOAWAY with the last stream id we saw; close once those streams finish."""
        if self._shutting_down or self._closed:
            return
        self._shutting_down = True
        self._out.write(f.goaway(f.MAX_WINDOW, H2Error.NO_ERROR) + f.ping(SHUTDOWN_PING))

    def abort(self) -> None:
        """The drain deadline passed: tell the client which streams were done and close."""
        self._fail(H2Error.NO_ERROR, "server shutting down")

    def _final_goaway(self) -> None:
        self._goaway_last = self._last_stream_id
        self._out.write(f.goaway(self._last_stream_id, H2Error.NO_ERROR))
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self._streams and (self._goaway_last is not None or self._peer_gone) and not self._closed:
            self._mark_closed()
            self._out.flush_writes()
            self._transport.close()  # after what is buffered has been written

    def tick(self, now: float) -> None:
        """Called by the server's sweeper about once a second: a new flood window, and the timeouts."""
        if self._closed:  # a close still flushing to a peer that doesn't read: dropped after the client timeout
            if self._closed_at is None:
                self._closed_at = now
            elif now - self._closed_at >= self._limits.client_timeout_secs > 0:
                self._transport.abort()
            return
        if self._clock is None:
            return
        self._guard.tick(now)
        out = self._out
        expiry = self._clock.check(
            now, handshaken=self._preface_done and not self._expect_settings,
            busy=self._opened or bool(self._streams), reads=self._reads, partial_frame=bool(self._buffer),
            waiting=out.paused or bool(out.blocked), drains=out.drains,
            buffered=self._transport.get_write_buffer_size())
        self._opened = False
        if expiry is Expiry.PREFACE:  # nothing of HTTP/2 spoken yet: no GOAWAY (§3.4)
            self._mark_closed()
            self._transport.abort()
        elif expiry is Expiry.IDLE:  # §6.8: clients reconnect when they next need to
            log.debug("closing idle HTTP/2 connection")
            self._final_goaway()
        elif expiry is not None:
            self._fail(H2Error.ENHANCE_YOUR_CALM if expiry is Expiry.UNREAD else H2Error.NO_ERROR, expiry.value)

    def _fail(self, code: H2Error, message: str) -> None:
        """A connection error (§5.4.1): GOAWAY with the code, then close; every open stream stops. A peer
        that doesn't read (the transport is paused) is dropped at once: a close would wait on it."""
        if self._closed:
            return
        if code != H2Error.NO_ERROR:
            _log_error(code, message)
        self._out.write(f.goaway(self._last_stream_id, code, message))
        self._mark_closed()
        self._out.flush_writes()
        if self._out.paused:
            self._transport.abort()
        else:
            self._transport.close()
        self._reset_all()

    def _mark_closed(self) -> None:
        self._closed = True
        self._out.closed = True  # nothing more is written; late answers are dropped
        self._buffer = bytearray()  # a partial frame (up to max_frame_bytes) is not kept while closing
        self._block.clear()

    def _reset_all(self) -> None:
        handlers = [self._forget(stream) for stream in list(self._streams.values())]
        for handler in handlers:
            handler.reset()
