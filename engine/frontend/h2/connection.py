"""One server-side HTTP/2 connection: the `asyncio.Protocol` adapter over the sans-I/O core (core.py). It
knows nothing of gRPC: a `StreamApp` opens a handler per request stream and answers through `send()`.

What the adapter adds to the core is I/O only: bytes read go to `H2Core.receive` (read into the server's
one read buffer, then copied out: the core keeps views of what it was given), or, while the core reads a
large DATA frame in place, straight into that frame's own buffer (`frame_buffer`, `frame_read`: one copy
from the kernel, no bytes object per read and no join; engine/frontend/in_place.py); what the core has to send
is written at the end of the event loop's round (`output_ready` → one `call_soon` → one `writelines`), so the
answers of one batch leave in one syscall — measured ~10 % less server CPU per inference than a write per
answer; the transport's back-pressure goes to the core as `writing_paused`/`writing_resumed`; the sweeper's
`tick` brings the clock; and connection errors are logged here, rate-limited.

Why our own HTTP/2: grpcio's Python layer costs ~150 µs of server CPU per call and the pure-Python `h2` state
machine ~100 µs; the HTTP/2 a gRPC server needs is small enough to do directly, to the RFC.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...access.caller import Address, ends
from ...access.quotas import ByteBudget
from ..connections import ConnectionCounter, client_of, close_refused, is_loopback
from .core import H2Core
from .frames import H2Error
from .headers import RequestHead
from .streams import H2Stream, Limits, Role, StreamHandler

log = logging.getLogger("hubserve.h2")

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


class StreamApp(Protocol):
    def open_stream(self, conn: H2Connection, stream: H2Stream, head: RequestHead) -> StreamHandler:
        """A client opened a stream with a well-formed request head. May answer at once through conn.send."""


READ_BYTES = 1 << 16  # each read's size outside a frame read in place (the server's one read buffer)


class H2Connection(asyncio.BufferedProtocol):
    """The app's handle on its connection: `send`, `reset_stream`, `open_window` (the core's own, bound here,
    so an answer costs no extra call) and `request_bytes`; the server's: `shutdown`, `abort`, `tick`."""

    send: Callable[[H2Stream, bytes | None, list[Any], bytes | None], bool]
    reset_stream: Callable[[H2Stream, H2Error, str], None]
    open_window: Callable[[H2Stream], None]
    output_ready: Callable[[], None]

    def __init__(self, app: StreamApp, limits: Limits, read_buffer: memoryview, on_close: Any = None,
                 on_open: Any = None, counter: ConnectionCounter | None = None) -> None:
        """`read_buffer` is where reads go (one per server: what a read brings is copied out before the
        next). `on_open(self)` is called when the transport connects (after the TLS handshake, if any);
        `on_close(self)` when it is lost. A connection whose handshake fails sees neither. `counter`
        counts the process's connections against its limits (frontend/connections.py)."""
        self._app = app
        self._on_open = on_open
        self._on_close = on_close
        self._counter = counter
        self._admitted: str | None = None  # the client address the counter counted this connection under
        self.on_loopback = False  # the peer is on this machine's loopback (access/policy.py LoopbackOnly)
        self._refused = False
        self._transport: Any = None
        self._loop = asyncio.get_running_loop()
        # The calls made per request, per read and per loop round go straight to their target, with no frame
        # of the adapter's in between: CoreEvents.stream_opened (the app's, this connection bound) and
        # output_ready (a flush at the end of the round).
        self.stream_opened = functools.partial(app.open_stream, self)
        self.output_ready = functools.partial(self._loop.call_soon, self._flush)  # type: ignore[assignment]
        self._core = core = H2Core(Role.SERVER, limits, self, self._loop.time())
        self._receive = core.receive
        self._read_buffer = read_buffer
        self.send = core.send  # type: ignore[assignment]
        self.reset_stream = core.reset_stream
        self.open_window = core.open_window
        self.shutdown = core.shutdown
        self.abort = core.abort
        self.request_bytes = ByteBudget(limits.max_buffered_request_bytes)  # drawn on by the app's handlers

    # ------------------------------------------------------------------ asyncio.Protocol

    def ends(self) -> tuple[Address | None, Address | None]:
        """The connection's (peer, local) addresses (engine/access/caller.py)."""
        return ends(self._transport)

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self.on_loopback = is_loopback(transport.get_extra_info("peername"))
        if self._on_open is not None:
            self._on_open(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames go out as written
        self._core.initiate()
        if self._counter is not None:
            client = client_of(transport.get_extra_info("peername"))
            refused = self._counter.admit(client)
            if refused:  # the preface, then GOAWAY ENHANCE_YOUR_CALM with the reason, and the close
                log.warning("gRPC connection refused: %s", refused)
                self._refused = True
                self._core.refuse(refused)
                self._flush()
                return
            self._admitted = client
        self._flush()  # the server preface goes at once

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted is not None and self._counter is not None:
            self._counter.release(self._admitted)
            self._admitted = None
        self._core.connection_lost()
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._core.writing_paused()

    def resume_writing(self) -> None:
        self._core.writing_resumed()

    def get_buffer(self, sizehint: int) -> memoryview:
        core = self._core
        return core.frame_buffer() if core.in_place else self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        core = self._core
        if core.in_place:
            core.frame_read(nbytes)
        else:
            self._receive(self._read_buffer[:nbytes].tobytes())

    def tick(self, now: float) -> None:
        """Called by the server's sweeper about once a second."""
        if self._transport is not None:
            self._core.tick(now, self._transport.get_write_buffer_size())

    def _flush(self) -> None:
        parts = self._core.data_to_send()
        if parts and not self._transport.is_closing():
            self._transport.writelines(parts)  # one writev on uvloop; no copy of large messages

    # ------------------------------------------------------------------ CoreEvents

    def settings_received(self) -> None:
        pass

    def goaway_received(self, last_stream_id: int, code: H2Error | int, debug: bytes) -> None:
        if code != H2Error.NO_ERROR:
            log.warning("client sent GOAWAY with error %s: %s", getattr(code, "name", code),
                        debug.decode("utf-8", "replace"))

    def stream_sent(self, stream: H2Stream) -> None:
        pass

    def close_transport(self, abort: bool, code: H2Error | None, message: str) -> None:
        if code is not None:
            _log_error(code, message)
        if self._transport is None:
            return
        self._flush()
        if abort:
            self._transport.abort()
        elif self._refused and self._counter is not None:
            close_refused(self._transport, self._counter)
        else:
            self._transport.close()  # after what is buffered has been written
