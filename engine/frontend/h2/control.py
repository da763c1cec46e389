"""The HTTP/2 frames that carry no request (RFC 9113 §6.3-§6.9): PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE,
PING, GOAWAY and WINDOW_UPDATE, for either role; and stream errors, answered with RST_STREAM (§5.4.2). Pure,
like the rest of the core.

Why apart from core.py: the receive loop, stream opening and DATA are the request path; these handlers are
the connection's upkeep, each a few lines of the RFC's rules plus a count for the flood guard. `Control` is
H2Core's base and works on its state, named below. Its own base is `Lifecycle` (lifecycle.py), whose methods
it calls: compiled with mypyc, a method named here only as a `Callable` attribute reads an attribute slot that
is never set. The order of lookup is H2Core, Control, Lifecycle, as when both were H2Core's bases.
"""

from __future__ import annotations

import logging
import struct

from mypy_extensions import trait

from . import frames as f
from .frames import H2ConnectionError, H2Error, H2StreamError, error_code
from .headers import HeaderDecoder, ResponseDecoder
from .lifecycle import SHUTDOWN_PING, Lifecycle
from .states import StreamEvent as E
from .states import StreamState as S
from .states import transition
from .windows import FlowWindows

log = logging.getLogger("hubserve.h2")

_WORD = struct.Struct(">L")
_TWO_WORDS = struct.Struct(">LL")


@trait  # mypyc: it names attributes that only its subclass H2Core holds
class Control(Lifecycle):
    """The control-frame half of H2Core. Its state lives in H2Core.__init__ (Lifecycle names the rest)."""

    _conn: FlowWindows
    _decoder: HeaderDecoder | ResponseDecoder
    _peer_parity: int
    peer_max_streams: int
    _peer: str

    def _is_idle(self, stream_id: int) -> bool:
        raise NotImplementedError  # H2Core's, first in the order of lookup

    def _on_priority(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "PRIORITY on stream 0")  # §6.3
        if len(payload) != 5:
            raise H2StreamError(stream_id, H2Error.FRAME_SIZE_ERROR, "PRIORITY payload is not 5 bytes")
        self._guard.empty_frame()  # deprecated (§5.3.2): it does nothing here

    def _on_rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")  # §6.4
        if stream_id == 0 or self._is_idle(stream_id):
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._guard.stream_reset()
            stream.state = transition(stream.state, E.RECV_RST, stream_id)
            self._forget(stream).reset(error_code(_WORD.unpack_from(payload)[0]))
            self._close_if_idle()

    def _on_settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "SETTINGS on a stream")  # §6.5
        if flags & f.ACK:
            if payload:
                raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self._decoder.table_size_acknowledged()  # we send SETTINGS once: this acknowledges them
            return
        self._guard.settings_frame()
        self._answer_unread()
        for key, value in f.parse_settings(payload):  # in order (§6.5.3)
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                self._out.initial_window_changed(value, self._streams.values())
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self._out.max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            # HEADER_TABLE_SIZE: our blocks never index.
        self._out.write(f.SETTINGS_ACK)
        self._out.flush()
        self._events.settings_received()

    def _on_push_promise(self, flags: int, stream_id: int, payload: memoryview) -> None:
        # A client cannot push (§8.4); a server may not once the client said SETTINGS_ENABLE_PUSH 0 (§6.6).
        raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"PUSH_PROMISE from the {self._peer}: push is off")

    def _on_ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 8:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")  # §6.7
        if stream_id != 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "PING on a stream")
        if not flags & f.ACK:
            self._guard.ping()
            self._answer_unread()
            self._out.write(f.ping(bytes(payload), ack=True))
        elif payload == SHUTDOWN_PING and self._shutting_down and self._goaway_last is None:
            self._final_goaway()

    def _on_goaway(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0 or len(payload) < 8:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "malformed GOAWAY")  # §6.8
        last, code = _TWO_WORDS.unpack_from(payload)
        last &= f.STREAM_ID_MASK
        self._peer_gone = True  # it opens no more streams; those open finish
        # Streams we opened above its last id were not processed: safe to retry elsewhere (§6.8, §8.7).
        for stream in [s for s in self._streams.values() if s.id & 1 != self._peer_parity and s.id > last]:
            self._forget(stream).reset(H2Error.REFUSED_STREAM)
        self._events.goaway_received(last, error_code(code), bytes(payload[8:]))
        self._close_if_idle()

    def _on_window_update(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")  # §6.9
        increment = _WORD.unpack_from(payload)[0] & f.STREAM_ID_MASK
        # A gRPC client returns window after every answer, so this runs about twice a request: a grant that
        # is in range is added here; `granted` (windows.py) adds it and raises the error otherwise.
        if stream_id == 0:
            conn = self._conn
            if increment and conn.send_window + increment <= f.MAX_WINDOW:
                conn.send_window += increment
            else:
                conn.granted(increment)
            if self._out.blocked:
                self._out.flush()
        elif (stream := self._streams.get(stream_id)) is not None:
            if increment and stream.send_window + increment <= f.MAX_WINDOW:
                stream.send_window += increment
            else:
                stream.granted(increment)
            if stream_id in self._out.blocked:
                self._out.drain(stream)
        elif self._is_idle(stream_id):
            # §5.1
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")

    # ------------------------------------------------------------------ errors and answers

    def _answer_unread(self) -> None:
        """Before queueing an answer to a peer's control frame: it counts while the peer doesn't read."""
        if self._out.paused:
            self._guard.ack_unread()

    def _stream_error(self, error: H2StreamError) -> None:
        """§5.4.2: RST_STREAM with the error; the handler's work on the stream stops."""
        log.debug("stream %d reset: %s", error.stream_id, error.message)
        self._out.write(f.rst_stream(error.stream_id, error.code))
        stream = self._streams.get(error.stream_id)
        if stream is not None:
            if stream.state is not S.CLOSED:
                stream.state = transition(stream.state, E.SEND_RST, stream.id)
            self._forget(stream).reset(error.code)
            self._close_if_idle()
