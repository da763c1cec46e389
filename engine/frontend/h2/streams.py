"""The nouns shared by the HTTP/2 core and what runs on top of it: the role, the limits a connection
advertises, a stream, and the two small interfaces the core calls upward (RFC 9113 §5): `StreamHandler`, one
per stream, and `CoreEvents`, one per connection (the I/O adapter: connection.py for the server,
perf/hubserve_perf/grpc_h2.py for the load tester)."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from . import frames as f
from .states import StreamState
from .windows import FlowWindows


class Role(enum.Enum):
    """Which end of the connection the core is: the server answers streams the client opens (odd ids)."""

    SERVER = "server"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection advertises in its SETTINGS and enforces (§6.5.2)."""

    max_concurrent_streams: int = 1024  # more open streams → RST_STREAM REFUSED_STREAM (§5.1.2)
    max_header_list_bytes: int = 16 << 10  # the app rejects larger request heads
    max_frame_bytes: int = 1 << 20  # a larger frame is a FRAME_SIZE_ERROR (§4.2)
    # SETTINGS_INITIAL_WINDOW_SIZE: what each stream may send unacknowledged
    stream_window_bytes: int = 1 << 20
    connection_window_bytes: int = 16 << 20  # the connection receive window, raised by WINDOW_UPDATE at start
    # A request head is at most max_header_list_bytes; clients split it at our frame size (1 MiB) or at
    # 16 KiB, so a real block takes 1 or 2 frames. More than this many is a CONTINUATION flood
    # (ENHANCE_YOUR_CALM).
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
    # END_STREAM); a stream that would exceed it ends RESOURCE_EXHAUSTED. Server.start sets 2 × the message
    # limit.
    max_buffered_request_bytes: int = 128 << 20
    # Response bytes waiting for the peer's windows or a paused transport; past it new streams are refused
    # (REFUSED_STREAM) until the queue drains. Server.start sets 2 × the message limit.
    max_queued_response_bytes: int = 128 << 20
    client_timeout_secs: float = 30.0  # preface, partial frames and messages, unread answers (0 = off)
    idle_timeout_secs: float = 300.0  # a connection without a stream this long gets GOAWAY NO_ERROR (0 = off)

    def settings(self, role: Role = Role.SERVER) -> list[tuple[int, int]]:
        """Our SETTINGS. A header table of 0 makes every block the peer sends stateless (see headers.py). A
        client turns push off and leaves the rest at their defaults, as the load tester always has."""
        if role is Role.CLIENT:
            return [(f.SETTINGS_HEADER_TABLE_SIZE, 0), (f.SETTINGS_ENABLE_PUSH, 0),
                    (f.SETTINGS_INITIAL_WINDOW_SIZE, self.stream_window_bytes)]
        return [(f.SETTINGS_HEADER_TABLE_SIZE, 0),
                (f.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
                (f.SETTINGS_INITIAL_WINDOW_SIZE, self.stream_window_bytes),
                (f.SETTINGS_MAX_FRAME_SIZE, self.max_frame_bytes),
                (f.SETTINGS_MAX_HEADER_LIST_SIZE, self.max_header_list_bytes)]


class StreamHandler(Protocol):
    """What runs one stream above the core: a server's call (created by CoreEvents.stream_opened) or a
    client's (handed to H2Core.open_stream). Called by the core as the peer's frames arrive."""

    def headers_received(self, head: Any, end_stream: bool) -> None:
        """A field block on a stream already open: a response's headers, or trailers (then `end_stream`).
        `head` is what the core's header decoder makes of it (headers.py)."""

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        """DATA of the stream, padding removed; `end_stream` once, when the peer has sent everything. The
        memoryview is valid as long as the handler keeps it."""

    def reset(self, code: f.H2Error | int) -> None:
        """The stream is gone before it finished (RST_STREAM either way, refused by GOAWAY, connection lost
        or failed): stop its work; anything sent on it now is dropped."""


class CoreEvents(Protocol):
    """What the core tells its connection's adapter. None of these may call back into the core's receive
    path; sending (H2Core.send) is fine."""

    def stream_opened(self, stream: H2Stream, head: Any) -> StreamHandler:
        """The peer opened a stream with a well-formed request head (server role). May answer at once."""

    def settings_received(self) -> None:
        """The peer's SETTINGS were applied and acknowledged (its limits may have changed)."""

    def goaway_received(self, last_stream_id: int, code: f.H2Error | int, debug: bytes) -> None:
        """The peer opens no more streams; ours above `last_stream_id` were reset REFUSED_STREAM already."""

    def stream_sent(self, stream: H2Stream) -> None:
        """Our END_STREAM on `stream` went out after waiting for flow-control window (not called when
        `send` wrote it at once)."""

    def output_ready(self) -> None:
        """Bytes wait in H2Core.data_to_send(), the first since it was last emptied: the adapter writes
        them at the end of this round of the event loop, so one round's frames leave in one syscall."""

    def close_transport(self, abort: bool, code: f.H2Error | None, message: str) -> None:
        """Close the transport after writing what data_to_send() holds (`abort`: without waiting for the
        peer to read it). `code`: the connection error we sent in GOAWAY, if that is why (else None)."""


class H2Stream(FlowWindows):
    """One stream: its state, its flow-control windows (inherited), what waits to be sent, its handler. Owned
    by its connection's core until closed; the handler's side holds it to send."""

    __slots__ = ("end_with_data", "handler", "head_seen", "held", "on_drained", "pending", "state",
                 "trailers")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = self.recv_size = recv_window
        self.state = StreamState.IDLE
        self.head_seen = False  # the peer's first field block arrived: any later one is trailers (§8.1)
        self.handler: Any = None
        self.pending: deque[memoryview] | None = None  # DATA waiting for window (made when some first waits)
        self.trailers: bytes | None = None  # trailers waiting behind `pending`
        self.end_with_data = False  # END_STREAM goes on the last of `pending` (no trailers)
        # The handler stopped reading (backpressure): DATA is taken within the window already granted, and no
        # WINDOW_UPDATE is sent for the stream until the handler calls H2Core.open_window.
        self.held = False
        # Called once when DATA that waited in `pending` has all gone out (set it again to hear it again);
        # by the sending half, so it may not send on the connection itself: it schedules what follows.
        self.on_drained: Any = None

    @property
    def closed(self) -> bool:
        return self.state is StreamState.CLOSED
