"""The nouns shared by the HTTP/2 connection and the application on top of it: the limits a connection
advertises, a stream, and the two small interfaces between connection and application (RFC 9113 §5)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import frames as f

if TYPE_CHECKING:
    from .connection import H2Connection
    from .headers import RequestHead


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection advertises in its SETTINGS and enforces (§6.5.2)."""

    max_concurrent_streams: int = 1024  # more open streams → RST_STREAM REFUSED_STREAM (§5.1.2)
    max_header_list_bytes: int = 16 << 10  # the app rejects larger request heads
    max_frame_bytes: int = 1 << 20  # a larger frame is a FRAME_SIZE_ERROR (§4.2)
    stream_window_bytes: int = 1 << 20  # SETTINGS_INITIAL_WINDOW_SIZE: what each stream may send unacknowledged
    connection_window_bytes: int = 16 << 20  # the connection receive window, raised by WINDOW_UPDATE at start
    # A request head is at most max_header_list_bytes; clients split it at our frame size (1 MiB) or at 16 KiB,
    # so a real block takes 1 or 2 frames. More than this many is a CONTINUATION flood (ENHANCE_YOUR_CALM).
    max_header_block_frames: int = 16
    # Flood limits, per connection per window (guard.FloodGuard); past one: GOAWAY ENHANCE_YOUR_CALM.
    flood_window_secs: float = 10.0
    # Client resets of open streams: grpc clients reset a stream when a call is cancelled or its deadline
    # passes, at most once per call; 2,000 in 10 s is far above what perf_analyzer or tritonclient do, and
    # bounds the work a rapid-reset attack (CVE-2023-44487) gets from one connection.
    max_resets_per_window: int = 2000
    # PINGs: grpc keepalive sends one every few seconds at most, BDP probing one per round trip with an ACK
    # awaited before the next; 1,000 in 10 s is 100/s.
    max_pings_per_window: int = 1000
    # SETTINGS: one at start, and one per BDP window change (a few per second at most).
    max_settings_per_window: int = 200
    # Frames that carry nothing (empty DATA or header fragment without its END flag, PRIORITY, unknown types):
    # gRPC clients send none of these in practice.
    max_empty_frames_per_window: int = 1000
    # Control frames we would answer (PING/SETTINGS ACK, RST_STREAM) while the transport is paused because
    # the peer does not read: a reader awaits each PING's ACK, so a handful is the most it ever has pending.
    max_unread_acks: int = 100
    # Request bytes buffered across a connection's streams (partial messages, complete ones awaiting
    # END_STREAM); a stream that would exceed it ends RESOURCE_EXHAUSTED. Server.start sets 2 × the message limit.
    max_buffered_request_bytes: int = 128 << 20
    # Response bytes waiting for the peer's windows or a paused transport; past it new streams are refused
    # (REFUSED_STREAM) until the queue drains. Server.start sets 2 × the message limit.
    max_queued_response_bytes: int = 128 << 20
    client_timeout_secs: float = 30.0  # preface, partial frames and messages, unread answers (0 = off)
    idle_timeout_secs: float = 300.0  # a connection without a stream this long gets GOAWAY NO_ERROR (0 = off)

    def settings(self) -> list[tuple[int, int]]:
        """Our SETTINGS. A header table of 0 makes every block the client sends stateless (see headers.py)."""
        return [(f.SETTINGS_HEADER_TABLE_SIZE, 0), (f.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
                (f.SETTINGS_INITIAL_WINDOW_SIZE, self.stream_window_bytes),
                (f.SETTINGS_MAX_FRAME_SIZE, self.max_frame_bytes),
                (f.SETTINGS_MAX_HEADER_LIST_SIZE, self.max_header_list_bytes)]


class StreamHandler(Protocol):
    """The application's side of one stream; created by StreamApp.open_stream, called by the connection."""

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        """DATA of the stream, padding removed; `end_stream` once, when the client has sent everything. The
        memoryview is valid as long as the handler keeps it."""

    def reset(self) -> None:
        """The stream is gone before the app finished it (RST_STREAM, connection lost or failed): stop its
        work; anything sent on it now is dropped."""


class StreamApp(Protocol):
    def open_stream(self, conn: H2Connection, stream: H2Stream, head: RequestHead) -> StreamHandler:
        """A client opened a stream with a well-formed request head. May answer at once through conn.send."""


class H2Stream:
    """One client-initiated stream. Owned by its connection until `closed`; the app holds it to send."""

    __slots__ = ("closed", "handler", "id", "pending", "recv_window", "remote_closed", "send_window", "trailers")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window  # what the client lets us send (§6.9)
        self.recv_window = recv_window  # what we still let the client send
        self.remote_closed = False  # END_STREAM received: half-closed (remote) (§5.1)
        self.closed = False  # our END_STREAM sent or reset: the connection has forgotten it
        self.handler: Any = None
        self.pending: deque[memoryview] = deque()  # DATA waiting for window
        self.trailers: bytes | None = None  # trailers waiting behind `pending`
