"""One server-side HTTP/2 connection (RFC 9113) on `asyncio.Protocol`: framing, stream states, flow control
both ways, SETTINGS, PING, RST_STREAM, GOAWAY and limits. It knows nothing of gRPC: a `StreamApp` opens a
`StreamHandler` per request stream and answers through `send()`.

Why our own: grpcio's Python layer costs ~150 µs of server CPU per call and the pure-Python `h2` state machine
~100 µs; the HTTP/2 a gRPC server needs is small enough to do directly, to the RFC. The receive loop reads
each frame header with one struct call and hands payloads on as memoryviews of the received bytes (no copy);
`send()` (outbound.py) puts response headers, message and trailers in one buffer when the peer's windows
allow, and otherwise queues DATA until WINDOW_UPDATE (or the transport's resume_writing) lets it go.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

import hpack

from . import frames as f
from .frames import H2ConnectionError, H2Error, H2StreamError
from .guard import ByteBudget, ConnectionClock, FloodGuard
from .headers import FieldBlock, HeaderDecoder
from .lifecycle import SHUTDOWN_PING, Lifecycle
from .outbound import Outbound
from .streams import H2Stream, Limits, StreamApp

log = logging.getLogger("hubserve.h2")

_EMPTY = memoryview(b"")
_WORD = struct.Struct(">L")


class H2Connection(Lifecycle, asyncio.Protocol):
    def __init__(self, app: StreamApp, limits: Limits, on_close: Any = None) -> None:
        self._app = app
        self._limits = limits
        self._on_close = on_close
        self._transport: Any = None
        self._decoder = HeaderDecoder(limits.max_header_list_bytes)
        self._buffer = bytearray()
        self._need = len(f.PREFACE)  # bytes the buffer must hold before parsing is worth trying
        self._preface_done = False
        self._expect_settings = True  # the client preface ends with a SETTINGS frame (§3.4)
        self._streams: dict[int, H2Stream] = {}
        self._last_stream_id = 0
        self._recv_window = limits.connection_window_bytes
        self._block = FieldBlock(4 * limits.max_header_list_bytes, limits.max_header_block_frames)
        self._guard = FloodGuard(limits)
        self.request_bytes = ByteBudget(limits.max_buffered_request_bytes)  # drawn on by the app's handlers
        self._clock: ConnectionClock | None = None
        self._reads = 0  # data_received calls, for the sweeper
        self._opened = False  # a stream opened since the last tick
        self._closed_at: float | None = None  # first tick after we closed, for a close that never completes
        self._shutting_down = False
        self._goaway_last: int | None = None  # last stream id of our final GOAWAY
        self._peer_gone = False  # the client sent GOAWAY
        self._closed = False
        self._handlers = (self._on_data, self._on_headers, self._on_priority, self._on_rst_stream,
                          self._on_settings, self._on_push_promise, self._on_ping, self._on_goaway,
                          self._on_window_update, self._on_continuation)

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._out = Outbound(transport, self._finished)
        now = asyncio.get_running_loop().time()
        self._clock = ConnectionClock(self._limits.client_timeout_secs, self._limits.idle_timeout_secs, now)
        self._guard.tick(now)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames go out as written
        # The server preface is a SETTINGS frame (§3.4); the connection window grows only by WINDOW_UPDATE.
        window = self._limits.connection_window_bytes - f.DEFAULT_WINDOW
        transport.write(f.settings(self._limits.settings()) + f.window_update(0, window))

    def connection_lost(self, exc: Exception | None) -> None:
        self._mark_closed()
        self._reset_all()
        self._handlers = ()  # bound methods: the cycles through them are broken, so memory goes back at once
        self._out.detach()
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        self._out.paused = True

    def resume_writing(self) -> None:
        self._out.paused = False
        self._out.drains += 1
        self._guard.reader_caught_up()
        self._out.flush()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._reads += 1
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return  # a large frame still arriving: don't re-scan it on every read
            data = bytes(self._buffer)
            self._buffer.clear()
        if not self._preface_done and not (data := self._preface(data)):
            return
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
                                            f"frame of {length} bytes exceeds SETTINGS_MAX_FRAME_SIZE {max_frame}")
                end = offset + 9 + length
                if end > size:
                    need = end - offset
                    break
                payload = view[offset + 9:end]
                offset = end
                if self._block.stream_id and kind != f.CONTINUATION:  # §6.10
                    raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "header block interrupted by another frame")
                if self._expect_settings:
                    if kind != f.SETTINGS or flags & f.ACK:  # §3.4
                        raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "the client preface must end in SETTINGS")
                    self._expect_settings = False
                if kind < 10:
                    try:
                        handlers[kind](flags, stream_id & f.STREAM_ID_MASK, payload)
                    except H2StreamError as e:
                        self._answer_unread()
                        self._stream_error(e)
                    if self._closed:
                        return
                else:  # unknown frame types are ignored (§5.5), but count as frames that carry nothing
                    self._guard.empty_frame()
        except H2ConnectionError as e:
            self._fail(e.code, e.message)
            return
        if offset < size:
            self._buffer += view[offset:]
            self._need = need

    def _preface(self, data: bytes) -> bytes:
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

    # ------------------------------------------------------------------ frames in

    def _on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "DATA on stream 0")  # §6.1
        length = len(payload)  # flow control counts the whole payload, padding included (§6.9.1)
        if not length and not flags & f.END_STREAM:
            self._guard.empty_frame()
        self._recv_window -= length
        if self._recv_window < 0:
            raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        if self._recv_window < self._limits.connection_window_bytes // 2:  # we consume DATA as it arrives
            self._out.write(f.window_update(0, self._limits.connection_window_bytes - self._recv_window))
            self._recv_window = self._limits.connection_window_bytes
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")  # §5.1
            return  # a stream we reset or finished: frames in flight are expected (§5.4.2, §6.4)
        if stream.remote_closed:
            raise H2StreamError(stream_id, H2Error.STREAM_CLOSED, "DATA after END_STREAM")  # §5.1
        stream.recv_window -= length
        if stream.recv_window < 0:
            raise H2StreamError(stream_id, H2Error.FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        data = f.strip_padding(payload, flags, stream_id)
        end = bool(flags & f.END_STREAM)
        if end:
            stream.remote_closed = True
        elif stream.recv_window < self._limits.stream_window_bytes // 2:
            self._out.write(f.window_update(stream_id, self._limits.stream_window_bytes - stream.recv_window))
            stream.recv_window = self._limits.stream_window_bytes
        stream.handler.data_received(data, end)

    def _on_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0 or not stream_id & 1:  # clients open odd-numbered streams (§5.1.1)
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
        try:
            head = self._decoder.decode(block)  # always, to keep HPACK state in step (§4.3)
        except hpack.HPACKError as e:
            raise H2ConnectionError(H2Error.COMPRESSION_ERROR, f"undecodable header block: {e}") from None
        end = bool(flags & f.END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers: they must end the stream (§8.1); their fields are not used
            if stream.remote_closed:
                raise H2StreamError(stream_id, H2Error.STREAM_CLOSED, "HEADERS after END_STREAM")
            if not end:
                raise H2StreamError(stream_id, H2Error.PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.remote_closed = True
            stream.handler.data_received(_EMPTY, True)
            return
        if stream_id <= self._last_stream_id:
            # A stream we finished or reset: frames in flight are ignored (§5.4.2, §6.4); the block was decoded
            # above. (Without a record of every closed id, an id reused out of order is ignored the same way.)
            return
        self._last_stream_id = stream_id
        if self._goaway_last is not None and stream_id > self._goaway_last:
            return  # opened after our final GOAWAY: ignored, the client retries elsewhere (§6.8)
        # §5.1.2; and while our answers queue up unread, no new work (the client retries the stream).
        if len(self._streams) >= self._limits.max_concurrent_streams or \
                self._out.queued_bytes > self._limits.max_queued_response_bytes:
            self._answer_unread()
            self._out.write(f.rst_stream(stream_id, H2Error.REFUSED_STREAM))
            return
        if head.malformed:  # §8.1.1
            log.debug("malformed request on stream %d: %s", stream_id, head.malformed)
            self._answer_unread()
            self._out.write(f.rst_stream(stream_id, H2Error.PROTOCOL_ERROR))
            return
        stream = H2Stream(stream_id, self._out.initial_window, self._limits.stream_window_bytes)
        stream.remote_closed = end
        self._streams[stream_id] = stream
        self._opened = True
        handler = self._app.open_stream(self, stream, head)
        if not stream.closed:  # (a call answered at once is forgotten already: no reference back to it)
            stream.handler = handler
            if end:
                handler.data_received(_EMPTY, True)

    def _on_priority(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "PRIORITY on stream 0")  # §6.3
        if len(payload) != 5:
            raise H2StreamError(stream_id, H2Error.FRAME_SIZE_ERROR, "PRIORITY payload is not 5 bytes")
        self._guard.empty_frame()  # deprecated (§5.3.2): it does nothing here

    def _on_rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")  # §6.4
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._guard.stream_reset()
            self._forget(stream).reset()

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
            # HEADER_TABLE_SIZE: our blocks never index; MAX_CONCURRENT_STREAMS: we open no streams.
        self._out.write(f.SETTINGS_ACK)
        self._out.flush()

    def _on_push_promise(self, flags: int, stream_id: int, payload: memoryview) -> None:
        raise H2ConnectionError(H2Error.PROTOCOL_ERROR, "a client cannot push")  # §8.4

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
        code = _WORD.unpack_from(payload, 4)[0]
        if code != H2Error.NO_ERROR:
            log.warning("client sent GOAWAY with error %d: %s", code, bytes(payload[8:]).decode("utf-8", "replace"))
        self._peer_gone = True  # it opens no more streams; those open finish
        self._close_if_idle()

    def _on_window_update(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")  # §6.9
        increment = _WORD.unpack_from(payload)[0] & f.STREAM_ID_MASK
        if stream_id == 0:
            self._out.window_update(increment)
        elif (stream := self._streams.get(stream_id)) is not None:
            self._out.stream_window_update(stream, increment)
        elif stream_id > self._last_stream_id:
            raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")  # §5.1

    # ------------------------------------------------------------------ frames out

    def send(self, stream: H2Stream, head: bytes | None, data: list[bytes], trailers: bytes | None) -> None:
        """Send on `stream`: the field block `head` (response headers) if given, then `data` as DATA, then
        `trailers` if given, which end the stream. One transport write when the windows allow (the common
        case); otherwise DATA waits, in order, for WINDOW_UPDATE, and the trailers wait behind it."""
        self._out.send(stream, head, data, trailers)

    def _finished(self, stream: H2Stream) -> None:
        """Our END_STREAM went out. A client still sending is told to stop without error (§8.1)."""
        self._forget(stream)
        if not stream.remote_closed:
            self._out.write(f.rst_stream(stream.id, H2Error.NO_ERROR))
        self._close_if_idle()

    def _forget(self, stream: H2Stream) -> Any:
        """The stream is closed: the connection and the stream let go of it and of its handler (returned, to
        reset it if need be), so a handler's buffers are freed once the app lets go too."""
        self._out.forget(stream)
        self._streams.pop(stream.id, None)
        handler, stream.handler = stream.handler, None
        return handler

    def _answer_unread(self) -> None:
        """Before queueing an answer to a client's control frame: it counts while the client doesn't read."""
        if self._out.paused:
            self._guard.ack_unread()

    def reset_stream(self, stream: H2Stream, code: H2Error, reason: str) -> None:
        """The app gives up on a stream (say, its client stalled mid-message): RST_STREAM with `code`, and the
        stream's handler is reset."""
        if not stream.closed and not self._closed:
            self._stream_error(H2StreamError(stream.id, code, reason))

    def _stream_error(self, error: H2StreamError) -> None:
        """§5.4.2: RST_STREAM with the error; the app's work on the stream stops."""
        log.debug("stream %d reset: %s", error.stream_id, error.message)
        self._out.write(f.rst_stream(error.stream_id, error.code))
        stream = self._streams.get(error.stream_id)
        if stream is not None:
            self._forget(stream).reset()
            self._close_if_idle()
