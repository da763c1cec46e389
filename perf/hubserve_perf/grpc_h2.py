"""A lean gRPC client for the load hot path: unary ModelInfer calls over HTTP/2 connections of our own, on
`asyncio.Protocol`, with HPACK from the `hpack` package.

Why not grpcio: its Python layer costs 300–400 µs of client CPU per unary call on a 2-core machine — about
twice perf_analyzer's C++ client. On cores shared with the server that CPU is taken from the server, and the
tool measured 30 % less throughput than perf_analyzer at the same settings (perf/README.md). This client
costs a few tens of µs per call. `--grpc-client grpcio` still selects grpc.aio, to cross-check.

The client side of RFC 9113 that unary gRPC needs, and no more:
  - connection preface, SETTINGS both ways (acknowledged), no server push;
  - flow control both ways: our sends respect the server's connection and stream windows and
    SETTINGS_MAX_FRAME_SIZE; we advertise a large receive window and replenish it as DATA arrives;
  - HEADERS with CONTINUATION and padding, DATA with padding, PING answered, RST_STREAM fails its call,
    GOAWAY fails the calls above its last stream id and retires the connection, MAX_CONCURRENT_STREAMS
    respected; a new connection is opened when the old one is retired or lost;
  - request headers are one pre-encoded HPACK block that never touches the dynamic table (a table size
    update to 0, static-table names, literals without indexing), so it can be sent as is on every stream;
  - we advertise SETTINGS_HEADER_TABLE_SIZE 0, so the server's header blocks never depend on earlier ones:
    each distinct block is decoded once by `hpack.Decoder` (Huffman included) and then looked up, which
    takes HPACK off the per-call cost.
A call fails with PerfError on a non-200 `:status`, a non-zero `grpc-status`, or a compressed message.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
import urllib.parse
from typing import Any

# The server's frame numbers and serializers, and its HPACK encoders: all the load tester shares with it.
from engine.frontend.h2 import frames as f
from engine.frontend.h2.headers import hpack_integer, hpack_string

from .types import PerfError

RECEIVE_REPLENISH = 1 << 20  # give the server back its connection window every MiB received

_now = time.monotonic_ns


def grpc_status_name(code: int) -> str:
    """`grpc-status` as grpcio names it (`INVALID_ARGUMENT`), for an error message. grpcio is imported on this
    error path only: its names, not a copy of them, and no import cost for a run without errors."""
    import grpc

    return next((s.name for s in grpc.StatusCode if s.value[0] == code), str(code))


def h2_error_name(code: int) -> str:
    try:
        return f.H2Error(code).name
    except ValueError:
        return str(code)


def _hpack_string(text: str) -> bytes:
    return hpack_string(text.encode())


def request_header_block(authority: str, path: str) -> bytes:
    """HPACK for a gRPC unary request, free of dynamic-table state (RFC 7541 §6.1, §6.2.2). It opens with a
    dynamic table size update to 0 (§6.3): we never index, and a server that advertises a smaller
    SETTINGS_HEADER_TABLE_SIZE than the default requires that update in our next block (§4.2)."""
    return (b"\x20"  # dynamic table size update: 0
            + b"\x83\x86"  # :method POST, :scheme http (static indices 3 and 6)
            + hpack_integer(4, 4, 0) + _hpack_string(path)  # :path, name index 4, literal without indexing
            + hpack_integer(1, 4, 0) + _hpack_string(authority)  # :authority, name index 1
            + hpack_integer(31, 4, 0) + _hpack_string("application/grpc")  # content-type, name index 31
            + b"\x00" + _hpack_string("te") + _hpack_string("trailers"))


class NotSent(PerfError):
    """The call never reached the server (connection retired first, or refused by GOAWAY): safe to retry."""


class _Stream:
    __slots__ = ("data", "first_byte_ns", "future", "headers", "id", "send_window")

    def __init__(self, stream_id: int, future: asyncio.Future[tuple[bytes, int]], send_window: int) -> None:
        self.id = stream_id
        self.future = future
        self.send_window = send_window
        self.headers: dict[bytes, bytes] | None = None
        self.data: list[bytes] = []
        self.first_byte_ns = 0


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent unary calls. Owned by GrpcH2Client."""

    def __init__(self, header_block: bytes) -> None:
        import hpack

        self._decoder = hpack.Decoder()
        self._decoder.header_table_size = 0  # as we advertise: blocks carry no state from one to the next
        self._decoded: dict[bytes, dict[bytes, bytes]] = {}
        self._header_block = header_block
        self._transport: Any = None
        self._buffer = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_stream_id = 1
        self._send_window = f.DEFAULT_WINDOW  # the connection's, as the server grants it
        self._initial_stream_window = f.DEFAULT_WINDOW
        self._max_frame_size = f.DEFAULT_MAX_FRAME_SIZE
        self._max_streams = f.MAX_WINDOW
        self._received_unacked = 0
        self._continuation: tuple[int, int, bytearray] | None = None  # stream id, flags, block so far
        self._window_changed = asyncio.Event()
        # Calls waiting for a stream under MAX_CONCURRENT_STREAMS, oldest first; each freed stream wakes one
        # (waking all of them on every answer costs O(n²) once thousands queue behind a stalled server).
        self._stream_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # first SETTINGS in
        self.retired = False  # GOAWAY received, connection lost, or stream ids used up: open a new one

    # asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(f.PREFACE
                        + f.settings(((f.SETTINGS_HEADER_TABLE_SIZE, 0), (f.SETTINGS_ENABLE_PUSH, 0),
                                    (f.SETTINGS_INITIAL_WINDOW_SIZE, f.MAX_WINDOW)))
                        + f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.retired = True
        self._fail_all(PerfError(f"the server closed the gRPC connection{': ' + str(exc) if exc else ''}"))
        if not self.settled.done():
            self.settled.set_exception(PerfError("the server closed the gRPC connection during the handshake"))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset, size = 0, len(buffer)
        try:
            while size - offset >= f.FRAME_HEADER_SIZE:
                length_high, length_low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(buffer, offset)
                end = offset + f.FRAME_HEADER_SIZE + (length_high << 8 | length_low)
                if end > size:
                    break
                payload = bytes(buffer[offset + f.FRAME_HEADER_SIZE:end])
                offset = end
                stream_id &= f.STREAM_ID_MASK
                self._on_frame(kind, flags, stream_id, payload)
        except PerfError as e:
            self._abort(e)
        except Exception as e:  # noqa: BLE001  # malformed frame or HPACK block: the connection is unusable
            self._abort(PerfError(f"unreadable HTTP/2 data from the server: {e!r}"))
        del buffer[:offset]

    # frames ------------------------------------------------------------------------------------------------
    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise PerfError("HTTP/2 protocol error: a header block was interrupted")
        if kind == f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            if flags & f.PADDED:
                payload = bytes(f.strip_padding(memoryview(payload), flags, stream_id))
            if flags & f.PRIORITY_FLAG:
                payload = payload[5:]
            self._header_fragment(stream_id, flags, bytearray(payload))
        elif kind == f.CONTINUATION:
            if self._continuation is None or self._continuation[0] != stream_id:
                raise PerfError("HTTP/2 protocol error: unexpected CONTINUATION")
            sid, first_flags, block = self._continuation
            block += payload
            self._continuation = None
            self._header_fragment(sid, first_flags | (flags & f.END_HEADERS), block)
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._on_settings(payload)
        elif kind == f.WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & f.STREAM_ID_MASK  # the reserved bit is ignored (§6.9)
            if stream_id == 0:
                self._send_window += increment
            elif stream_id in self._streams:
                self._streams[stream_id].send_window += increment
            self._wake(self._window_changed)
        elif kind == f.PING:
            if not flags & f.ACK:
                self._transport.write(f.ping(payload, ack=True))
        elif kind == f.RST_STREAM:
            code = h2_error_name(int.from_bytes(payload[:4], "big"))
            self._finish(stream_id, PerfError(f"the server reset the gRPC stream (HTTP/2 error {code})"))
        elif kind == f.GOAWAY:
            last = int.from_bytes(payload[:4], "big") & f.STREAM_ID_MASK
            self.retired = True
            for sid in [s for s in self._streams if s > last]:
                self._finish(sid, NotSent("the server is going away (GOAWAY) and did not take the request"))
            self._wake_stream_waiters(len(self._stream_waiters))
        elif kind == f.PUSH_PROMISE:
            raise PerfError("HTTP/2 protocol error: the server pushed although push is disabled")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 §5.5 asks

    def _on_settings(self, payload: bytes) -> None:
        for key, value in f.parse_settings(memoryview(payload)):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._initial_stream_window
                self._initial_stream_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self._max_frame_size = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self._max_streams = value
        self._transport.write(f.SETTINGS_ACK)
        self._wake(self._window_changed)
        self._wake_stream_waiters(self._max_streams - len(self._streams))
        if not self.settled.done():
            self.settled.set_result(None)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._received_unacked += len(payload)
        if self._received_unacked >= RECEIVE_REPLENISH:
            self._transport.write(f.window_update(0, self._received_unacked))
            self._received_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream we already gave up on
        if flags & f.PADDED:
            payload = bytes(f.strip_padding(memoryview(payload), flags, stream_id))
        stream.data.append(payload)
        if flags & f.END_STREAM:
            self._finish(stream_id, PerfError("the gRPC answer ended without trailers (no grpc-status)"))

    def _header_fragment(self, stream_id: int, flags: int, block: bytearray) -> None:
        if not flags & f.END_HEADERS:
            self._continuation = (stream_id, flags, block)
            return
        key = bytes(block)
        headers = self._decoded.get(key)
        if headers is None:
            headers = dict(self._decoder.decode(key, raw=True))
            if len(self._decoded) >= 256:  # distinct blocks (error messages, dates...) must not pile up
                self._decoded.clear()
            self._decoded[key] = headers
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.headers is None:
            stream.headers = headers
            stream.first_byte_ns = _now()
            status = headers.get(b":status", b"")
            if status != b"200":
                self._finish(stream_id, PerfError(f"the server answered the gRPC call with HTTP {status.decode()}"))
                return
        if flags & f.END_STREAM:  # trailers, or a trailers-only answer
            self._complete(stream, headers)

    # calls -------------------------------------------------------------------------------------------------
    def _complete(self, stream: _Stream, trailers: dict[bytes, bytes]) -> None:
        code = int(trailers.get(b"grpc-status", b"2"))
        if code != 0:
            name = grpc_status_name(code)
            message = urllib.parse.unquote(trailers.get(b"grpc-message", b"").decode(errors="replace"))
            self._finish(stream.id, PerfError(f"the server refused an inference request ({name}): {message}"))
            return
        body = b"".join(stream.data)
        if len(body) < 5 or body[0] != 0:
            self._finish(stream.id, PerfError("the gRPC answer is compressed or carries no message"))
            return
        length = int.from_bytes(body[1:5], "big")
        self._finish(stream.id, (body[5:5 + length], stream.first_byte_ns))

    def _finish(self, stream_id: int, outcome: tuple[bytes, int] | PerfError) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        if not stream.future.done():
            if isinstance(outcome, PerfError):
                stream.future.set_exception(outcome)
            else:
                stream.future.set_result(outcome)
        self._wake_stream_waiters(1)

    def _wake_stream_waiters(self, count: int) -> None:
        while count > 0 and self._stream_waiters:
            waiter = self._stream_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def _fail_all(self, error: PerfError) -> None:
        for sid in list(self._streams):
            self._finish(sid, error)
        self._wake_stream_waiters(len(self._stream_waiters))  # they find the connection retired

    def _abort(self, error: PerfError) -> None:
        self.retired = True
        self._fail_all(error)
        if self._transport is not None:
            self._transport.close()

    @staticmethod
    def _wake(event: asyncio.Event) -> None:
        event.set()
        event.clear()  # waiters already woken stay woken; later waiters wait for the next change

    async def call(self, message: bytes) -> tuple[bytes, int, int]:
        """One unary call: (answer message, nanoseconds spent sending, monotonic ns of its first answer frame)."""
        while len(self._streams) >= self._max_streams and not self.retired:
            waiter = asyncio.get_running_loop().create_future()
            self._stream_waiters.append(waiter)
            await waiter
        if self.retired:
            raise NotSent("the gRPC connection was retired before the call")
        start = _now()
        stream_id = self._next_stream_id
        self._next_stream_id += 2
        if self._next_stream_id > f.STREAM_ID_MASK:
            self.retired = True
            self._wake_stream_waiters(len(self._stream_waiters))
        future: asyncio.Future[tuple[bytes, int]] = asyncio.get_running_loop().create_future()
        stream = self._streams[stream_id] = _Stream(stream_id, future, self._initial_stream_window)
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        headers = f.frame(f.HEADERS, f.END_HEADERS, stream_id, self._header_block)
        if len(body) <= min(self._send_window, stream.send_window, self._max_frame_size):
            self._send_window -= len(body)
            stream.send_window -= len(body)
            self._transport.write(headers + f.frame(f.DATA, f.END_STREAM, stream_id, body))
        else:
            self._transport.write(headers)
            await self._send_body(stream, body)
        sent = _now()
        answer, first_byte_ns = await future
        return answer, sent - start, first_byte_ns

    async def _send_body(self, stream: _Stream, body: bytes) -> None:
        view, offset = memoryview(body), 0
        while offset < len(body):
            if stream.future.done():
                return  # failed or reset meanwhile
            allowed = min(self._send_window, stream.send_window, self._max_frame_size, len(body) - offset)
            if allowed <= 0:
                await self._window_changed.wait()
                continue
            last = offset + allowed == len(body)
            self._transport.write(f.frame(f.DATA, f.END_STREAM if last else 0, stream.id, bytes(view[offset:offset + allowed])))
            self._send_window -= allowed
            stream.send_window -= allowed
            offset += allowed

    def close(self) -> None:
        self.retired = True
        if self._transport is not None:
            self._transport.close()


CALLS_PER_CONNECTION = 6  # as perf_analyzer's gRPC client shares a channel (observed: c=4 → 1, c=16 → 3)
MAX_CONNECTIONS = 64  # past this, calls share the least busy connection


class _Lane:
    """One connection slot of the pool: its connection (reopened when retired) and its calls in flight."""

    __slots__ = ("conn", "in_flight", "opening")

    def __init__(self) -> None:
        self.conn: H2Connection | None = None
        self.opening: asyncio.Future[H2Connection] | None = None
        self.in_flight = 0


class GrpcH2Client:
    """An InferClient: ModelInfer calls spread over H2Connections, at most `calls_per_connection` in flight
    on each, as perf_analyzer's client spreads its requests over shared channels.

    Why spread at all when HTTP/2 multiplexes: the number of connections shapes what the server sees per
    read — sixteen calls on one connection arrive in one recv() and tend to form one batch, on three
    connections they arrive apart. Matching perf_analyzer here is part of measuring what it measures
    (perf/README.md, "hubserve perf vs perf_analyzer"); `--grpc-calls-per-connection 0` puts every call on
    one connection."""

    HANDSHAKE_TIMEOUT_S = 10.0

    def __init__(self, host: str, port: int, method_path: str,
                 calls_per_connection: int = CALLS_PER_CONNECTION) -> None:
        from engine.proto import grpc_service_pb2

        pb: Any = grpc_service_pb2  # generated classes: mypy cannot see them
        self._host, self._port = host, port
        self._block = request_header_block(f"{host}:{port}", method_path)
        self._parse = pb.ModelInferResponse.FromString
        self._per_connection = calls_per_connection if calls_per_connection > 0 else f.MAX_WINDOW
        self._lanes: list[_Lane] = []

    def _lane(self) -> _Lane:
        """The first lane with room, a new one when all are full, the least busy one past MAX_CONNECTIONS."""
        for lane in self._lanes:
            if lane.in_flight < self._per_connection:
                return lane
        if len(self._lanes) < MAX_CONNECTIONS:
            self._lanes.append(_Lane())
            return self._lanes[-1]
        return min(self._lanes, key=lambda lane: lane.in_flight)

    async def _connection(self, lane: _Lane) -> H2Connection:
        if lane.conn is not None and not lane.conn.retired:
            return lane.conn
        if lane.opening is None:  # the first caller opens; the others wait for the same connection
            lane.opening = asyncio.ensure_future(self._open(lane))
        opening = lane.opening
        try:
            conn = await asyncio.shield(opening)
        finally:
            if opening.done():
                lane.opening = None
        return conn

    async def _open(self, lane: _Lane) -> H2Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: H2Connection(self._block), self._host, self._port)
            await asyncio.wait_for(asyncio.shield(conn.settled), self.HANDSHAKE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            raise PerfError(f"cannot open a gRPC connection to {self._host}:{self._port}: {e!r}") from None
        if lane.conn is not None:
            lane.conn.close()
        lane.conn = conn
        return conn

    async def infer(self, wire: bytes) -> tuple[int, int]:
        lane = self._lane()
        lane.in_flight += 1
        try:
            try:
                answer, send_ns, first_byte_ns = await (await self._connection(lane)).call(wire)
            except NotSent:  # once more, on a new connection; a server going away for good fails that too
                answer, send_ns, first_byte_ns = await (await self._connection(lane)).call(wire)
        finally:
            lane.in_flight -= 1
        self._parse(answer)
        return send_ns, _now() - first_byte_ns

    @property
    def connections(self) -> int:
        """Connections open now (for tests and the progress line)."""
        return sum(1 for lane in self._lanes if lane.conn is not None and not lane.conn.retired)

    async def close(self) -> None:
        for lane in self._lanes:
            if lane.conn is not None:
                lane.conn.close()
