"""HTTP/2 flow control (RFC 9113 §5.2, §6.9): the two windows of one stream, or of the connection, as a small
pure object.

Why one object for both directions: the rules are few but each has its own error code and scope — DATA
beyond what we granted is FLOW_CONTROL_ERROR, a WINDOW_UPDATE of 0 is PROTOCOL_ERROR, a window past 2^31-1 is
FLOW_CONTROL_ERROR, each a stream error on a stream and a connection error on stream 0 (§6.9, §6.9.1) — and
keeping them beside the counters they guard is how they stay right. The core (core.py) and its sending half
(outbound.py) use one `FlowWindows` for the connection, and every stream is one (`streams.H2Stream` extends
it: one object per stream, not two, on the request path), for either role.

Receiving: we consume DATA as it arrives, so once half of what we granted is used up, `received` returns the
increment that restores the window, for the caller to send as WINDOW_UPDATE (one frame per half window, not
one per DATA frame). Sending: `send_window` is what the peer lets us send; the sender subtracts what it
writes.
"""

from __future__ import annotations

from .frames import MAX_WINDOW, H2ConnectionError, H2Error, H2StreamError


class FlowWindows:
    __slots__ = ("id", "recv_size", "recv_window", "send_window")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id  # 0: the connection's
        # what the peer lets us send (§6.9): its initial window + WINDOW_UPDATEs
        self.send_window = send_window
        self.recv_window = recv_window  # what we still let the peer send
        # what we grant in full (our SETTINGS_INITIAL_WINDOW_SIZE, or the connection's)
        self.recv_size = recv_window

    def received(self, size: int, end_stream: bool = False) -> int:
        """DATA of `size` bytes arrived (padding included, §6.9.1). Returns the WINDOW_UPDATE increment to
        send now, 0 for none (none after END_STREAM: the stream takes no more DATA)."""
        self.recv_window -= size
        if self.recv_window < 0:
            raise self._error(H2Error.FLOW_CONTROL_ERROR, "DATA beyond the window we granted")
        if end_stream or self.recv_window >= self.recv_size >> 1:
            return 0
        increment = self.recv_size - self.recv_window
        self.recv_window = self.recv_size
        return increment

    def granted(self, increment: int) -> None:
        """The peer's WINDOW_UPDATE (§6.9)."""
        if increment == 0:
            raise self._error(H2Error.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        self.send_window += increment
        if self.send_window > MAX_WINDOW:  # §6.9.1
            raise self._error(H2Error.FLOW_CONTROL_ERROR, "window exceeds 2^31-1")

    def shift(self, delta: int) -> None:
        """The peer changed SETTINGS_INITIAL_WINDOW_SIZE: the stream's send window moves by the difference and
        may go negative (§6.9.2); past 2^31-1 it is a connection error."""
        self.send_window += delta
        if self.send_window > MAX_WINDOW:
            raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, f"stream {self.id}'s window exceeds 2^31-1")

    def _error(self, code: H2Error, message: str) -> Exception:
        if self.id == 0:
            return H2ConnectionError(code, f"{message} (connection)")
        return H2StreamError(self.id, code, f"{message} (stream {self.id})")
