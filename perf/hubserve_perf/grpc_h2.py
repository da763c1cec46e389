"""A lean gRPC client for the load hot path: unary ModelInfer calls over HTTP/2 connections of our own, on
`asyncio.Protocol`, with HPACK from the `hpack` package.

Why not grpcio: its Python layer costs 300–400 µs of client CPU per unary call on a 2-core machine — about
twice perf_analyzer's C++ client. On cores shared with the server that CPU is taken from the server, and the
tool measured 30 % less throughput than perf_analyzer at the same settings (perf/history/agreement.md).
This client costs a few tens of µs per call. `--grpc-client grpcio` still selects grpc.aio, to cross-check.

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

# The HTTP/2 core the server runs on (framing, stream states, flow control), in the client role, with its
# frame numbers and HPACK encoders: all the load tester shares with the server. None of it imports gRPC or
# the data plane (tests/unit/perf/test_perf_layout.py).
from engine.frontend.h2 import frames as f
from engine.frontend.h2.core import H2Core
from engine.frontend.h2.headers import hpack_integer, hpack_string
from engine.frontend.h2.streams import H2Stream, Limits, Role

from .types import PerfError

_now = time.monotonic_ns


def grpc_status_name(code: int) -> str:
    """`grpc-status` as grpcio names it (`INVALID_ARGUMENT`), for an error message. grpcio is imported on this
    error path only: its names, not a copy of them, and no import cost for a run without errors. Without
    grpcio (the perf extra's), the number."""
    try:
        import grpc
    except ImportError:
        return str(code)

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


class _Call:
    """The StreamHandler of one unary call: collects the answer and settles `future` once, with (message,
    monotonic ns of its first answer frame) or a PerfError."""

    __slots__ = ("conn", "data", "first_byte_ns", "future", "headers", "sent")

    def __init__(self, conn: H2Connection, future: asyncio.Future[tuple[bytes, int]]) -> None:
        self.conn = conn
        self.future = future
        self.headers: dict[bytes, bytes] | None = None
        self.data: list[memoryview] = []
        self.first_byte_ns = 0
        self.sent: asyncio.Future[None] | None = None  # set while the request waits for flow-control window

    def headers_received(self, head: dict[bytes, bytes], end_stream: bool) -> None:
        if self.headers is None:
            self.headers = head
            self.first_byte_ns = _now()
            status = head.get(b":status", b"")
            if status != b"200":
                self._settle(PerfError(f"the server answered the gRPC call with HTTP {status.decode()}"))
        if end_stream:  # trailers, or a trailers-only answer
            self._complete(head)
            self.conn.stream_done()

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        self.data.append(data)
        if end_stream:
            self._settle(PerfError("the gRPC answer ended without trailers (no grpc-status)"))
            self.conn.stream_done()

    def reset(self, code: f.H2Error | int) -> None:
        if code == f.H2Error.REFUSED_STREAM:  # §8.7: not processed (RST_STREAM, or above a GOAWAY's last id)
            self._settle(NotSent("the server did not take the request (REFUSED_STREAM or GOAWAY)"))
        elif self.conn.lost is not None:
            self._settle(self.conn.lost)
        else:
            self._settle(PerfError(f"the server reset the gRPC stream (HTTP/2 error {h2_error_name(code)})"))
        self.conn.stream_done()

    def _complete(self, trailers: dict[bytes, bytes]) -> None:
        code = int(trailers.get(b"grpc-status", b"2"))
        if code != 0:
            name = grpc_status_name(code)
            message = urllib.parse.unquote(trailers.get(b"grpc-message", b"").decode(errors="replace"))
            self._settle(PerfError(f"the server refused an inference request ({name}): {message}"))
            return
        body = b"".join(self.data)
        if len(body) < 5 or body[0] != 0:
            self._settle(PerfError("the gRPC answer is compressed or carries no message"))
            return
        length = int.from_bytes(body[1:5], "big")
        self._settle((body[5:5 + length], self.first_byte_ns))

    def _settle(self, outcome: tuple[bytes, int] | PerfError) -> None:
        if self.sent is not None and not self.sent.done():
            self.sent.set_result(None)
        if self.future.done():
            return
        if isinstance(outcome, PerfError):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


CLIENT_LIMITS = Limits(
    stream_window_bytes=f.MAX_WINDOW, connection_window_bytes=f.MAX_WINDOW,  # the server never waits on us
    max_frame_bytes=f.DEFAULT_MAX_FRAME_SIZE,  # we advertise none, so the default holds (§6.5.2)
    max_resets_per_window=1 << 30,  # a server refusing streams under overload is not a flood
    client_timeout_secs=0, idle_timeout_secs=0)  # nothing ticks a client's core


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent unary calls: the asyncio adapter over the same sans-I/O
    core as the server's (engine/frontend/h2/core.py), in the client role. Owned by GrpcH2Client.

    Unlike the server's adapter, it writes at once rather than at the end of the loop's round: each call's
    request leaves as it is made, as perf_analyzer's do, so what the server sees per read is not changed by
    how our calls happen to be scheduled."""

    def __init__(self, header_block: bytes) -> None:
        self._header_block = header_block
        self._transport: Any = None
        self._loop = asyncio.get_running_loop()
        self._core = H2Core(Role.CLIENT, CLIENT_LIMITS, self)
        # Calls waiting for a stream under MAX_CONCURRENT_STREAMS, oldest first; each freed stream wakes one
        # (waking all of them on every answer costs O(n²) once thousands queue behind a stalled server).
        self._stream_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.settled: asyncio.Future[None] = self._loop.create_future()  # first SETTINGS in
        self.retired = False  # GOAWAY received, connection lost, or stream ids used up: open a new one
        self.lost: PerfError | None = None  # why the connection ended, for the calls it ends

    # asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._core.initiate()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.retired = True
        if self.lost is None:
            self.lost = PerfError(f"the server closed the gRPC connection{': ' + str(exc) if exc else ''}")
        self._core.connection_lost()
        self._wake_stream_waiters(len(self._stream_waiters))  # they find the connection retired
        if not self.settled.done():
            self.settled.set_exception(
                PerfError("the server closed the gRPC connection during the handshake"))

    def data_received(self, data: bytes) -> None:
        try:
            self._core.receive(data)
        except Exception as e:  # a bug on our side: the connection is unusable
            self._abort(PerfError(f"unreadable HTTP/2 data from the server: {e!r}"))
        self._flush()

    def _flush(self) -> None:
        parts = self._core.data_to_send()
        if parts and self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(parts)

    # CoreEvents --------------------------------------------------------------------------------------------
    def stream_opened(self, stream: H2Stream, head: Any) -> Any:
        raise AssertionError("the client core opens no peer streams")

    def settings_received(self) -> None:
        self._wake_stream_waiters(self._core.peer_max_streams - self._core.open_streams)
        if not self.settled.done():
            self.settled.set_result(None)

    def goaway_received(self, last_stream_id: int, code: f.H2Error | int, debug: bytes) -> None:
        self.retired = True
        self._wake_stream_waiters(len(self._stream_waiters))

    def stream_sent(self, stream: H2Stream) -> None:
        call = stream.handler
        if call is not None and call.sent is not None and not call.sent.done():
            call.sent.set_result(None)

    def output_ready(self) -> None:
        pass  # written at once: after each call's send and after each read

    def close_transport(self, abort: bool, code: f.H2Error | None, message: str) -> None:
        self.retired = True
        if code is not None and self.lost is None:
            self.lost = PerfError(f"HTTP/2 protocol error from the server ({code.name}): {message}")
        self._flush()
        if self._transport is not None:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()

    # calls -------------------------------------------------------------------------------------------------
    def stream_done(self) -> None:
        """A call's stream ended: one waiting call may take its place."""
        self._wake_stream_waiters(1)

    def _wake_stream_waiters(self, count: int) -> None:
        while count > 0 and self._stream_waiters:
            waiter = self._stream_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def _abort(self, error: PerfError) -> None:
        self.retired = True
        if self.lost is None:
            self.lost = error
        self._core.abort()  # GOAWAY, every call fails with `lost`, and the transport closes

    async def call(self, message: bytes) -> tuple[bytes, int, int]:
        """One unary call: (answer message, nanoseconds spent sending, monotonic ns of its first answer
        frame)."""
        core = self._core
        while core.open_streams >= core.peer_max_streams and not self.retired:
            waiter = self._loop.create_future()
            self._stream_waiters.append(waiter)
            await waiter
        if self.retired or core.closed:
            raise NotSent("the gRPC connection was retired before the call")
        start = _now()
        future: asyncio.Future[tuple[bytes, int]] = self._loop.create_future()
        call = _Call(self, future)
        stream = core.open_stream(call)
        if core.next_stream_id > f.STREAM_ID_MASK:
            self.retired = True
            self._wake_stream_waiters(len(self._stream_waiters))
        # uncompressed, then the length (PROTOCOL-HTTP2.md)
        prefix = b"\x00" + len(message).to_bytes(4, "big")
        done = core.send(stream, self._header_block, [prefix, message], None, end_stream=True)
        self._flush()
        if not done and not future.done():  # the request waits for the server's windows
            call.sent = self._loop.create_future()
            await call.sent
        sent = _now()
        answer, first_byte_ns = await future
        return answer, sent - start, first_byte_ns

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
    (perf/history/agreement.md, "hubserve perf vs perf_analyzer"); `--grpc-calls-per-connection 0` puts
    every call on one connection."""

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
