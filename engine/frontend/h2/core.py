"""The HTTP/2 connection as a sans-I/O state machine (RFC 9113), for the server and for the load tester's
client: bytes in (`receive`) → calls up to the stream handlers and `CoreEvents`; commands (`send`,
`reset_stream`, `shutdown`, `tick`) → bytes out (`data_to_send`). No sockets, no event loop, no clock: time
comes in as an argument (`tick(now)`), and the adapter writes what `data_to_send` returns.

One core for both roles, so framing, stream states (states.py), flow-control windows (windows.py) and the
connection-level rules (SETTINGS, PING, RST_STREAM, GOAWAY, limits) exist once. What differs by role is small:
the server reads the client preface and validates request heads (headers.py), opens a stream when a client's
HEADERS arrive and refuses it past its limits; the client sends the preface and opens streams itself
(`open_stream`). The frames that carry no request (SETTINGS, PING, RST_STREAM, GOAWAY, WINDOW_UPDATE,
PRIORITY, PUSH_PROMISE) are control.py; sending, with DATA queued for window, outbound.py; ending the
connection, lifecycle.py.

Why calls up rather than a list of event objects: the server's hot path is a HEADERS and a DATA frame per
request, and an event object per frame (built, returned, dispatched by type) costs more than the rest of the
frame handling. The receive loop reads each 9-byte frame header with one struct call and hands payloads up as
memoryviews of the received bytes (no copy).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence

import hpack

from ..in_place import IN_PLACE_BYTES, in_place_size, unfilled
from . import frames as f
from .control import Control
from .frames import H2ConnectionError, H2Error, H2StreamError
from .guard import ConnectionClock, FloodGuard
from .headers import FieldBlock, HeaderDecoder, ResponseDecoder
from .outbound import Outbound
from .states import AFTER, TRANSITIONS, transition
from .states import StreamEvent as E
from .states import StreamState as S
from .streams import CoreEvents, H2Stream, Limits, Role, StreamHandler

log = logging.getLogger("hubserve.h2")

_EMPTY = memoryview(b"")
_WORD = struct.Struct(">L")

# The request path looks the state table up by event, `_AFTER_X(state) or transition(state, X, id)`: the
# table decides; `transition` is reached only to raise for a move the table lacks.
_AFTER_RECV_DATA = AFTER[E.RECV_DATA].get
_AFTER_RECV_END = AFTER[E.RECV_END_STREAM].get
_AFTER_RECV_HEADERS = AFTER[E.RECV_HEADERS].get
_AFTER_SEND_DATA = AFTER[E.SEND_DATA].get
_AFTER_SEND_HEADERS = AFTER[E.SEND_HEADERS].get
_AFTER_SEND_END = AFTER[E.SEND_END_STREAM].get
_CLOSED, _HALF_CLOSED_LOCAL = S.CLOSED, S.HALF_CLOSED_LOCAL
_OPENED = TRANSITIONS[(S.IDLE, E.RECV_HEADERS)]
_OPENED_ENDED = TRANSITIONS[(_OPENED, E.RECV_END_STREAM)]


class H2Core(Control):  # and Lifecycle, Control's base
    data_to_send: Callable[[], list[bytes | memoryview]]
    """The bytes to write, in order (for `transport.writelines`); empties the outbox."""

    def __init__(self, role: Role, limits: Limits, events: CoreEvents, now: float = 0.0) -> None:
        self._role = role
        self._limits = limits
        self._events = events
        self._stream_opened = events.stream_opened
        self._server = server = role is Role.SERVER
        self._peer = "client" if server else "server"  # for error messages
        self._decoder: HeaderDecoder | ResponseDecoder = (HeaderDecoder if server else ResponseDecoder)(
            limits.max_header_list_bytes)
        self._out = Outbound(self._end_sent, events.output_ready, limits.connection_window_bytes)
        self.data_to_send = self._out.take  # bound here: the adapter calls it once per loop round
        self._conn = self._out.windows  # the connection's windows, both directions
        self._buffer = bytearray()
        # bytes the buffer must hold before parsing is worth trying
        self._need = len(f.PREFACE) if server else 9
        # A large DATA frame read in place (frame_buffer, frame_read): its buffer, its length (header
        # included) and how much of it arrived; `in_place` while the reads go straight into it.
        self._frame: memoryview | None = None
        self._frame_length = 0
        self._filled = 0
        self.in_place = False
        self._preface_done = not server  # the server reads the client's magic first (§3.4)
        self._expect_settings = True  # either preface ends with a SETTINGS frame (§3.4)
        self._streams: dict[int, H2Stream] = {}
        self._peer_parity = 1 if server else 0  # only clients open streams: odd ids (§5.1.1), no push
        self._last_peer_id = 0  # the largest stream id the peer opened
        self._next_own_id = 2 if server else 1  # the next stream id we would open
        self.peer_max_streams = f.MAX_WINDOW  # the peer's SETTINGS_MAX_CONCURRENT_STREAMS
        self._block = FieldBlock(4 * limits.max_header_list_bytes, limits.max_header_block_frames)
        self._guard = FloodGuard(limits, now)
        self._clock = ConnectionClock(limits.client_timeout_secs, limits.idle_timeout_secs, now)
        self._reads = 0  # receive calls, for the timeouts
        self._heads = 0  # header blocks completed, for the timeouts
        self._opened = False  # a stream opened since the last tick
        self._closed_at: float | None = None  # first tick after we closed, for a close that never completes
        self._shutting_down = False
        self._goaway_last: int | None = None  # last stream id of our final GOAWAY
        self._peer_gone = False  # the peer sent GOAWAY
        self._closed = False
        self._handlers = (self._on_data, self._on_headers, self._on_priority, self._on_rst_stream,
                          self._on_settings, self._on_push_promise, self._on_ping, self._on_goaway,
                          self._on_window_update, self._on_continuation)

    # ------------------------------------------------------------------ the adapter's side

    def initiate(self) -> None:
        """Our connection preface (§3.4): the client's magic, then SETTINGS either way; the connection
        receive window grows only by WINDOW_UPDATE (§6.9.2), so one follows at once."""
        window = self._limits.connection_window_bytes - f.DEFAULT_WINDOW
        magic = f.PREFACE if self._role is Role.CLIENT else b""
        self._out.write(magic + f.settings(self._limits.settings(self._role))
                        + (f.window_update(0, window) if window > 0 else b""))

    def writing_paused(self) -> None:
        self._out.paused = True

    def writing_resumed(self) -> None:
        out = self._out
        out.paused = False
        out.drains += 1
        self._guard.reader_caught_up()
        out.flush()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def next_stream_id(self) -> int:
        return self._next_own_id

    def open_stream(self, handler: StreamHandler) -> H2Stream:
        """Client role: a new stream (idle until `send` puts its headers out), run by `handler`."""
        if self._role is not Role.CLIENT:
            raise RuntimeError("only a client opens streams (no server push)")
        stream_id = self._next_own_id
        if stream_id > f.STREAM_ID_MASK:
            raise RuntimeError("stream ids are used up: open a new connection")
        self._next_own_id += 2
        stream = H2Stream(stream_id, self._out.initial_window, self._limits.stream_window_bytes)
        stream.handler = handler
        self._streams[stream_id] = stream
        self._opened = True
        return stream

    def send(self, stream: H2Stream, head: bytes | None, data: Sequence[bytes | memoryview],
             trailers: bytes | None, end_stream: bool = False) -> bool:
        """Send on `stream`: the field block `head` (headers) if given, then `data` as DATA, then the stream's
        end: `trailers` if given, else END_STREAM on the last DATA if `end_stream`. One buffer when the
        windows allow (the common case); otherwise DATA waits, in order, for WINDOW_UPDATE, and the end
        behind it. Returns whether the end went out now. On a closed stream (reset, say) nothing is sent."""
        state = stream.state
        if state is _CLOSED or self._closed:
            return False
        if head is None:
            stream.state = _AFTER_SEND_DATA(state) or transition(state, E.SEND_DATA, stream.id)
        else:
            stream.state = _AFTER_SEND_HEADERS(state) or transition(state, E.SEND_HEADERS, stream.id)
        return self._out.send(stream, head, data, trailers, end_stream)

    def open_window(self, stream: H2Stream) -> None:
        """The handler reads `stream` again after holding it (`H2Stream.held`): the window it let run down
        is granted back (WINDOW_UPDATE), unless the stream takes no more DATA."""
        stream.held = False
        if self._closed or stream.state not in (S.OPEN, _HALF_CLOSED_LOCAL):
            return
        if stream.recv_window < stream.recv_size >> 1:
            increment = stream.recv_size - stream.recv_window
            stream.recv_window = stream.recv_size
            self._out.write(f.window_update(stream.id, increment))

    def reset_stream(self, stream: H2Stream, code: H2Error, reason: str) -> None:
        """Give up on a stream (say, its peer stalled mid-message): RST_STREAM with `code`, and the stream's
        handler is reset."""
        if stream.state is not S.CLOSED and not self._closed:
            self._stream_error(H2StreamError(stream.id, code, reason))

    # ------------------------------------------------------------------ bytes in

    def receive(self, data: bytes | memoryview) -> None:
        """Bytes from the peer, as they arrived (any split). The core may keep views of them: they must not
        change afterwards."""
        if self._closed:
            return
        self._reads += 1
        if self.in_place:  # a caller that does not read in place (a client, a test)
            data = self._fill(memoryview(data))
            if not data:
                return
        if not self._preface_done:
            if self._buffer:
                self._buffer += data
                if len(self._buffer) < self._need:
                    return
                data = bytes(self._buffer)
                self._buffer.clear()
            if data := self._preface(data):
                self._scan(data)
            return
        if not self._buffer:
            self._scan(data)
            return
        # A frame the last read left partial: only its missing bytes join it, and the rest of this read is
        # scanned where it lies. (Joining the whole read to it copied every read that ended inside a frame
        # twice more: with 600 KB requests, most of the loop thread's memcpy.)
        view = memoryview(data)
        while self._buffer:
            missing = self._need - len(self._buffer)
            if len(view) < missing:
                self._buffer += view
                return  # a large frame still arriving: don't re-scan it on every read
            self._buffer += view[:missing]
            view = view[missing:]
            pending, self._buffer = self._buffer, bytearray()  # never resized again: views of it stay valid
            self._scan(pending)  # that frame (or its header, which may leave the frame pending again)
            if self.in_place:
                view = self._fill(view)
            if self._closed:
                return
        if view:
            self._scan(view)

    def frame_buffer(self) -> memoryview:
        """Where the next read goes while `in_place`: the unfilled part of the frame's buffer, grown first if
        it is full (never past the frame's length)."""
        frame, filled = self._frame, self._filled
        assert frame is not None
        if len(frame) == filled:
            frame = self._frame = self._grown(frame, filled + 1)
        return frame[filled:]

    def _fill(self, view: memoryview) -> memoryview:
        """Copy what arrived into the frame read in place; the bytes after it, if it is now complete."""
        while self.in_place and view:
            target = self.frame_buffer()
            taken = min(len(target), len(view))
            target[:taken] = view[:taken]
            view = view[taken:]
            self._frame_filled(taken)
        return view[:0] if self._closed else view

    def frame_read(self, n: int) -> None:
        """`n` more bytes were read into `frame_buffer()`."""
        if self._closed:
            return
        self._reads += 1
        self._frame_filled(n)

    def _frame_filled(self, n: int) -> None:
        """When the frame read in place is complete, it is handled like any other (its buffer is never
        written again: views of its payload stay valid)."""
        self._filled += n
        if self._filled < self._frame_length:
            return
        frame = self._frame
        assert frame is not None
        self._frame = None
        self.in_place = False
        self._need = 9
        self._scan(frame)

    def _grown(self, frame: memoryview, need: int) -> memoryview:
        """A larger buffer for the frame being read in place, holding what arrived of it."""
        filled = self._filled
        grown = unfilled(in_place_size(self._frame_length, need, filled))
        grown[:filled] = frame[:filled]
        return grown

    def _scan(self, data: bytes | bytearray | memoryview) -> None:
        """The frames in `data`, which starts at a frame's first byte; a partial frame at its end is kept in
        `_buffer`, with `_need` the bytes it takes."""
        view = memoryview(data)
        size = len(data)
        offset = 0
        max_frame = self._limits.max_frame_bytes
        unpack = f.FRAME_HEADER.unpack_from
        handlers = self._handlers
        need = 0
        try:
            while True:
                if size - offset < 9:
                    need = 9
                    break
                hi, lo, kind, flags, stream_id = unpack(data, offset)
                length = hi << 8 | lo
                if length > max_frame:  # checked before waiting for the payload (§4.2)
                    raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR,
                                            f"frame of {length} bytes exceeds SETTINGS_MAX_FRAME_SIZE "
                                            f"{max_frame}")
                end = offset + 9 + length
                if end > size:
                    need = end - offset
                    break
                payload = view[offset + 9:end]
                offset = end
                if self._block.stream_id and kind != f.CONTINUATION:  # §6.10
                    raise H2ConnectionError(H2Error.PROTOCOL_ERROR,
                                            "header block interrupted by another frame")
                if self._expect_settings:
                    if kind != f.SETTINGS or flags & f.ACK:  # §3.4
                        raise H2ConnectionError(H2Error.PROTOCOL_ERROR,
                                                f"the {self._peer} preface must end in SETTINGS")
                    self._expect_settings = False
                if kind < 10:
                    try:
                        handlers[kind](flags, stream_id & f.STREAM_ID_MASK, payload)
                    except H2StreamError as stream_error:  # not `e`: mypyc types a name once per function
                        self._answer_unread()
                        self._stream_error(stream_error)
                    if self._closed:
                        return
                else:  # unknown frame types are ignored (§5.5), but count as frames that carry nothing
                    self._guard.empty_frame()
        except H2ConnectionError as e:
            self._fail(e.code, e.message)
            return
        if offset < size:
            if need >= IN_PLACE_BYTES and view[offset + 3] == f.DATA:  # the rest is read in place
                part = view[offset:]
                self._frame = frame = unfilled(in_place_size(need, len(part), len(part)))
                frame[:len(part)] = part
                self._frame_length, self._filled = need, len(part)
                self.in_place = True
            else:
                self._buffer += view[offset:]
                self._need = need

    def _preface(self, data: bytes | memoryview) -> bytes:
        """Consume the client connection preface (§3.4); returns the bytes after it, b"" while incomplete."""
        self._buffer += data
        got = bytes(self._buffer[:len(f.PREFACE)])
        if not f.PREFACE.startswith(got):
            self._fail(H2Error.PROTOCOL_ERROR, "invalid connection preface: this port speaks HTTP/2 (gRPC)")
            return b""
        if len(got) < len(f.PREFACE):
            self._need = len(f.PREFACE)
            return b""
        rest = bytes(self._buffer[len(f.PREFACE):])
        self._buffer.clear()
        self._preface_done = True
        if not rest:
            self._need = 9
        return rest

    def _is_idle(self, stream_id: int) -> bool:
        """Whether `stream_id` was never opened (§5.1): by the peer, or by us."""
        if stream_id & 1 == self._peer_parity:
            return stream_id > self._last_peer_id
        return stream_id >= self._next_own_id

    # ------------------------------------------------------------------ frames in

    def _on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "DATA on stream 0")  # §6.1
        length = len(payload)  # flow control counts the whole payload, padding included (§6.9.1)
        end = flags & f.END_STREAM
        if not length and not end:
            self._guard.empty_frame()
        # Flow control: the common case (no WINDOW_UPDATE due, no error) inline;
        # FlowWindows.received the rest.
        conn = self._conn
        left = conn.recv_window - length
        if left >= conn.recv_size >> 1:
            conn.recv_window = left
        elif increment := conn.received(length):  # we consume DATA as it arrives
            self._out.write(f.window_update(0, increment))
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")  # §5.1
            return  # a stream we reset or finished: frames in flight are expected (§5.4.2, §6.4)
        if end:
            state = _AFTER_RECV_END(stream.state) or transition(stream.state, E.RECV_END_STREAM, stream_id)
        else:
            state = _AFTER_RECV_DATA(stream.state) or transition(stream.state, E.RECV_DATA, stream_id)
        stream.state = state
        left = stream.recv_window - length
        if left >= 0 and (end or left >= stream.recv_size >> 1 or stream.held):
            stream.recv_window = left
        elif increment := stream.received(length, bool(end)):
            self._out.write(f.window_update(stream_id, increment))
        data = f.strip_padding(payload, flags, stream_id) if flags & f.PADDED else payload
        handler = stream.handler
        if state is _CLOSED:  # the last frame of a stream we had half-closed
            self._forget(stream)
            handler.data_received(data, True)
            self._close_if_idle()
        else:
            handler.data_received(data, bool(end))

    def _on_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or not stream_id & 1:  # only clients open streams: odd ids (§5.1.1), and no push
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = f.strip_padding(payload, flags, stream_id)
        if flags & f.PRIORITY_FLAG:  # deprecated priority fields (§6.2): skipped
            if len(block) < 5:
                raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            block = block[5:]
        if flags & f.END_HEADERS:
            self._field_block(stream_id, flags, bytes(block))
        else:
            if not block:
                self._guard.empty_frame()
            self._block.start(stream_id, flags, bytes(block))

    def _on_continuation(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if not payload and not flags & f.END_HEADERS:
            self._guard.empty_frame()
        head_flags = self._block.flags
        block = self._block.add(stream_id, bytes(payload), bool(flags & f.END_HEADERS))
        if block is not None:
            self._field_block(stream_id, head_flags, block)

    def _field_block(self, stream_id: int, flags: int, block: bytes) -> None:
        self._heads += 1
        try:
            head = self._decoder.decode(block)  # always, to keep HPACK state in step (§4.3)
        except hpack.HPACKError as e:
            raise H2ConnectionError(H2Error.COMPRESSION_ERROR, f"undecodable header block: {e}") from None
        end = bool(flags & f.END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # a response's headers, or trailers, which must end the stream (§8.1)
            state = _AFTER_RECV_HEADERS(stream.state) or transition(stream.state, E.RECV_HEADERS, stream_id)
            if stream.head_seen and not end:
                raise H2StreamError(stream_id, H2Error.PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.head_seen = True
            handler = stream.handler
            if end:
                stream.state = state = (_AFTER_RECV_END(state)
                                        or transition(state, E.RECV_END_STREAM, stream_id))
                if state is _CLOSED:
                    self._forget(stream)
                    handler.headers_received(head, True)
                    self._close_if_idle()
                    return
            stream.state = state
            handler.headers_received(head, end)
            return
        if not self._server:  # a server opens no streams
            if self._is_idle(stream_id):
                raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"HEADERS on idle stream {stream_id}")
            return  # a stream we gave up on: its late answer is dropped (the block was decoded above)
        # Server role: a client's HEADERS on a stream not open now.
        if stream_id <= self._last_peer_id:
            # A stream we finished or reset: frames in flight are ignored (§5.4.2, §6.4); the block was
            # decoded. (Without a record of every closed id, an id reused out of order is ignored the same
            # way.)
            return
        self._last_peer_id = stream_id
        if self._goaway_last is not None and stream_id > self._goaway_last:
            return  # opened after our final GOAWAY: ignored, the client retries elsewhere (§6.8)
        # §5.1.2; and while our answers queue up unread, no new work (the client retries the stream).
        if len(self._streams) >= self._limits.max_concurrent_streams or \
                self._out.queued_bytes > self._limits.max_queued_response_bytes:
            self._answer_unread()
            self._out.write(f.rst_stream(stream_id, H2Error.REFUSED_STREAM))
            return
        malformed = head.malformed  # type: ignore[union-attr]  # a RequestHead: the server's decoder
        if malformed:  # §8.1.1
            log.debug("malformed request on stream %d: %s", stream_id, malformed)
            self._answer_unread()
            self._out.write(f.rst_stream(stream_id, H2Error.PROTOCOL_ERROR))
            return
        stream = H2Stream(stream_id, self._out.initial_window, self._limits.stream_window_bytes)
        stream.state = _OPENED_ENDED if end else _OPENED  # idle → open (→ half-closed remote), §5.1
        stream.head_seen = True
        self._streams[stream_id] = stream
        self._opened = True
        handler = self._stream_opened(stream, head)
        if stream.state is not _CLOSED:  # (a call answered at once is forgotten already: no reference back)
            stream.handler = handler
            if end:
                handler.data_received(_EMPTY, True)

    # ------------------------------------------------------------------ stream ends

    def _end_sent(self, stream: H2Stream, queued: bool) -> None:
        """Our END_STREAM went out (outbound.py). A server whose client is still sending tells it to stop
        without error (§8.1)."""
        state = _AFTER_SEND_END(stream.state) or transition(stream.state, E.SEND_END_STREAM, stream.id)
        if state is _HALF_CLOSED_LOCAL and self._server:
            self._out.write(f.rst_stream(stream.id, H2Error.NO_ERROR))
            state = transition(state, E.SEND_RST, stream.id)
        stream.state = state
        if state is _CLOSED:
            self._forget(stream)
        if queued:
            self._events.stream_sent(stream)
        if not self._streams:  # (a busy connection skips the call)
            self._close_if_idle()

    def _forget(self, stream: H2Stream) -> StreamHandler:
        """The stream is closed: the core lets go of it and of its handler (returned, to reset it if need
        be), so a handler's buffers are freed once the app lets go too."""
        stream.state = _CLOSED
        self._out.forget(stream)
        self._streams.pop(stream.id, None)
        handler, stream.handler = stream.handler, None
        return handler  # type: ignore[no-any-return]
