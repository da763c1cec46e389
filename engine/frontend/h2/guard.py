"""What keeps one client from taking more than its share of the server: flood counts per time window, a
budget of request bytes a connection may hold, the connection timeouts, and the rate at which dropped buffers
are handed back to the OS.

Why apart from connection.py: these are policies, not protocol. Each is a small synchronous object that the
connection (or the gRPC app) tells what happened and that answers with a decision, so its thresholds are
tested without sockets or an event loop. None reads the clock on the request path: the server's sweeper
passes `now` about once a second (`tick`, `check`, `due`), and the frame handlers only count.
"""

from __future__ import annotations

import enum

from .frames import H2ConnectionError, H2Error
from .streams import Limits


class FloodGuard:
    """Per connection: frames that cost us work but carry no request, counted per `flood_window_secs`
    (CVE-2023-44487 rapid reset; the 2019 ping, settings, empty-frame and reset floods, CVE-2019-9512..9518;
    the 2024 CONTINUATION flood). Past a limit the count raises H2ConnectionError(ENHANCE_YOUR_CALM), which
    the connection answers with GOAWAY and a close. Called by H2Connection's frame handlers; `tick` by its
    sweep."""

    __slots__ = ("_limits", "_window_start", "empty", "pings", "resets", "settings", "unread_acks")

    def __init__(self, limits: Limits, now: float = 0.0) -> None:
        self._limits = limits
        self._window_start = now
        self.resets = self.pings = self.settings = self.empty = 0
        self.unread_acks = 0  # control frames we queued while the peer was not reading

    def tick(self, now: float) -> None:
        """A new window once the current one is over (the unread count is not timed: see
        `reader_caught_up`)."""
        if now - self._window_start >= self._limits.flood_window_secs:
            self._window_start = now
            self.resets = self.pings = self.settings = self.empty = 0

    def stream_reset(self) -> None:
        """The client reset a stream that was open (RST_STREAM): its request was decoded, maybe submitted."""
        self.resets += 1
        if self.resets > self._limits.max_resets_per_window:
            raise _calm(f"more than {self._limits.max_resets_per_window} streams reset by the client in "
                        f"{self._limits.flood_window_secs:g} s")

    def ping(self) -> None:
        self.pings += 1
        if self.pings > self._limits.max_pings_per_window:
            raise _calm(f"more than {self._limits.max_pings_per_window} PINGs in "
                        f"{self._limits.flood_window_secs:g} s")

    def settings_frame(self) -> None:
        self.settings += 1
        if self.settings > self._limits.max_settings_per_window:
            raise _calm(f"more than {self._limits.max_settings_per_window} SETTINGS in "
                        f"{self._limits.flood_window_secs:g} s")

    def empty_frame(self) -> None:
        """A frame that does nothing: DATA or a header fragment with no bytes and no END flag, PRIORITY, an
        unknown type."""
        self.empty += 1
        if self.empty > self._limits.max_empty_frames_per_window:
            raise _calm(f"more than {self._limits.max_empty_frames_per_window} frames that carry nothing in "
                        f"{self._limits.flood_window_secs:g} s")

    def ack_unread(self) -> None:
        """We are about to queue an answer to a control frame (PING or SETTINGS ACK, RST_STREAM) while the
        transport is paused: the peer does not read what we already sent, so each ACK would only grow our
        buffer (as nginx, h2o and Go limit since 2023-24)."""
        self.unread_acks += 1
        if self.unread_acks > self._limits.max_unread_acks:
            raise _calm(f"more than {self._limits.max_unread_acks} control frames to answer while our "
                        "answers are not read")

    def reader_caught_up(self) -> None:
        """The transport drained below its low-water mark (resume_writing): the peer reads again."""
        self.unread_acks = 0


def _calm(message: str) -> H2ConnectionError:
    return H2ConnectionError(H2Error.ENHANCE_YOUR_CALM, message)


class Expiry(enum.Enum):
    """Why ConnectionClock ends a connection; the value is the GOAWAY's debug text."""

    PREFACE = "no client preface and SETTINGS within the client timeout"
    IDLE = "no request for the idle timeout"
    STALLED = "a frame left incomplete for the client timeout"
    HEAD = "a request's header block not complete within the client timeout"
    UNREAD = "answers left unread for the client timeout"


class ConnectionClock:
    """The timeouts of one connection, checked by the server's sweeper about once a second (never per frame:
    the connection only keeps counters, and `check` compares them with what it saw last time). A timeout of
    0 or less is off."""

    __slots__ = ("_buffered", "_busy_at", "_client", "_drains", "_heading_since", "_heads", "_idle",
                 "_read_at", "_reads", "_started", "_waiting_since")

    def __init__(self, client_timeout_secs: float, idle_timeout_secs: float, now: float) -> None:
        self._client = client_timeout_secs if client_timeout_secs > 0 else float("inf")
        self._idle = idle_timeout_secs if idle_timeout_secs > 0 else float("inf")
        self._started = self._busy_at = self._read_at = now
        self._reads = 0
        self._drains = 0
        self._buffered = 0
        self._waiting_since: float | None = None
        self._heads = 0
        self._heading_since: float | None = None

    def check(self, now: float, *, handshaken: bool, busy: bool, reads: int, partial_frame: bool,
              waiting: bool, drains: int, buffered: int, heading: bool = False, heads: int = 0
              ) -> Expiry | None:
        """`handshaken`: preface and first SETTINGS received; `busy`: a stream is open or was opened since
        the last check; `reads`: data_received calls so far; `partial_frame`: part of a frame is buffered;
        `waiting`: answers wait for the peer (a paused transport or a flow-control window); `drains`: times
        waiting answers moved so far; `buffered`: bytes in the transport's write buffer; `heading`: a header
        block is arriving (a HEADERS or CONTINUATION frame in part, or a block awaiting its END_HEADERS);
        `heads`: header blocks completed so far.

        A header block is a request's head: like an HTTP/1.1 head it must arrive whole within the client
        timeout, however steadily its bytes trickle (a slowloris sends one byte at a time, which keeps
        `reads` moving and so never stalls). Bodies are timed as in HTTP/1.1: only a pause ends them."""
        if not handshaken:
            return Expiry.PREFACE if now - self._started >= self._client else None
        if not heading or heads != self._heads:
            self._heads = heads
            self._heading_since = now if heading else None
        elif self._heading_since is None:
            self._heading_since = now
        elif now - self._heading_since >= self._client:
            return Expiry.HEAD
        if busy:
            self._busy_at = now
        elif now - self._busy_at >= self._idle:
            return Expiry.IDLE
        if reads != self._reads:
            self._reads = reads
            self._read_at = now
        elif partial_frame and now - self._read_at >= self._client:
            return Expiry.STALLED
        moved = drains != self._drains or buffered < self._buffered
        self._drains, self._buffered = drains, buffered
        if not waiting:
            self._waiting_since = None
        elif moved or self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since >= self._client:
            return Expiry.UNREAD
        return None
