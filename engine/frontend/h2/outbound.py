"""The sending half of the HTTP/2 core: the peer's flow-control windows and frame size, DATA waiting for them,
and the bytes the adapter is to write (RFC 9113 §6.9, §5.2). Pure: no transport, no loop.

Why apart from the receive side: sending has its own state (windows granted by the peer, a queue per stream)
and one rule — never exceed either window or SETTINGS_MAX_FRAME_SIZE — that is easiest to check in one place.
Every frame of the connection is appended to one outbox (`write`/`writelines`); the first append after the
outbox was emptied calls `on_output`, and the adapter takes the outbox (`take`) at the end of the event
loop's round, so one round's frames leave in one syscall.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from . import frames as f
from .streams import H2Stream
from .windows import FlowWindows


class Outbound:
    """Owned by one H2Core. `on_finished(stream, queued)` is called once a stream's END_STREAM has been
    written (`queued`: after waiting for window); `on_output()` when the outbox stops being empty."""

    def __init__(self, on_finished: Callable[[H2Stream, bool], None], on_output: Callable[[], None],
                 recv_window: int) -> None:
        self._on_finished = on_finished
        self._on_output = on_output
        # The connection's windows: the peer's for us, and ours for it (used by the receiving side).
        self.windows = FlowWindows(0, f.DEFAULT_WINDOW, recv_window)
        self.initial_window = f.DEFAULT_WINDOW  # SETTINGS_INITIAL_WINDOW_SIZE of the peer
        self.max_frame = f.DEFAULT_MAX_FRAME_SIZE  # SETTINGS_MAX_FRAME_SIZE of the peer
        self.paused = False  # the adapter's transport buffer is full (pause_writing)
        self.closed = False
        self.blocked: dict[int, H2Stream] = {}  # streams with DATA or trailers waiting
        self.queued_bytes = 0  # DATA in the streams' `pending`, waiting for window or the transport
        self.drains = 0  # times waiting DATA or trailers went out (the sweeper's sign of a reading peer)
        self._outbox: list[bytes | memoryview] = []

    def send(self, stream: H2Stream, head: bytes | None, data: Sequence[bytes | memoryview],
             trailers: bytes | None, end_stream: bool = False) -> bool:
        """See H2Core.send, which checks that neither the stream nor the connection is closed."""
        size = 0
        for part in data:
            size += len(part)
        sid = stream.id
        max_frame = self.max_frame
        conn = self.windows
        ending = trailers is not None or end_stream
        if not stream.pending and not self.paused and size <= stream.send_window and size <= conn.send_window:
            # Every answer passes here: a frame header that fits one frame is packed in place (f.frame_header
            # and f.headers spelled out), not through a Python call per frame.
            pack = f.FRAME_HEADER.pack
            out: list[bytes | memoryview]
            if head is None:
                out = []
            elif (n := len(head)) <= max_frame:
                out = [pack(n >> 8, n & 0xFF, f.HEADERS, f.END_HEADERS, sid), head]
            else:
                out = [f.headers(sid, head, False, max_frame)]
            last_flags = f.END_STREAM if trailers is None and end_stream else 0
            if size:
                stream.send_window -= size
                conn.send_window -= size
                if size <= max_frame:
                    out.append(pack(size >> 8, size & 0xFF, f.DATA, last_flags, sid))
                    out += data
                else:  # within the windows but over the peer's frame size (§4.2): several DATA frames
                    whole = memoryview(b"".join(data))
                    for i in range(0, size, max_frame):
                        chunk = whole[i:i + max_frame]
                        flags = last_flags if i + max_frame >= size else 0
                        out.append(f.frame_header(len(chunk), f.DATA, flags, sid))
                        out.append(chunk)
            elif last_flags:
                out.append(f.frame_header(0, f.DATA, last_flags, sid))
            if trailers is not None:
                if (n := len(trailers)) <= max_frame:
                    out.append(pack(n >> 8, n & 0xFF, f.HEADERS, f.END_HEADERS | f.END_STREAM, sid))
                    out.append(trailers)
                else:
                    out.append(f.headers(sid, trailers, True, max_frame))
            if size < 65536:
                self.write(b"".join(out))  # a small answer is one buffer: headers, message, trailers
            else:
                self.writelines(out)  # a large message is not copied
            if ending:
                self._on_finished(stream, False)
            return ending
        first: list[bytes | memoryview] = [] if head is None else [f.headers(sid, head, False, max_frame)]
        if stream.pending is None:
            stream.pending = deque()
        if size:
            stream.pending.append(memoryview(b"".join(data)))
            self.queued_bytes += size
        if trailers is not None:
            stream.trailers = trailers
        elif end_stream:
            stream.end_with_data = True
        self.blocked[sid] = stream
        if first:
            self.writelines(first)
        self.drain(stream, False)
        return ending and sid not in self.blocked

    def drain(self, stream: H2Stream, queued: bool = True) -> None:
        """Write as much of `stream`'s waiting DATA as both windows, the peer's frame size and the transport
        allow now (§6.9.1), then its END_STREAM (trailers, or a flag on the last DATA) once no DATA is
        left."""
        out: list[bytes | memoryview] = []
        pending = stream.pending
        assert pending is not None  # made when the stream was blocked
        sid = stream.id
        conn = self.windows
        ending = stream.end_with_data
        while pending and not self.paused:
            allowed = min(stream.send_window, conn.send_window, self.max_frame)
            if allowed <= 0:
                break
            chunk = pending[0]
            if len(chunk) > allowed:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            else:
                pending.popleft()
            flags = f.END_STREAM if ending and not pending else 0
            out.append(f.frame_header(len(chunk), f.DATA, flags, sid))
            out.append(chunk)
            stream.send_window -= len(chunk)
            conn.send_window -= len(chunk)
            self.queued_bytes -= len(chunk)
        done = not pending and not self.paused
        if done:
            self.blocked.pop(sid, None)
            if stream.trailers is not None:
                out.append(f.headers(sid, stream.trailers, True, self.max_frame))
                stream.trailers = None
            elif ending:
                if not out:  # END_STREAM with no DATA left to carry it
                    out.append(f.frame_header(0, f.DATA, f.END_STREAM, sid))
                stream.end_with_data = False
            else:
                done = False
        if out:
            self.drains += 1
            self.writelines(out)
        if not pending and stream.on_drained is not None:  # what waited went out: tell its handler
            drained, stream.on_drained = stream.on_drained, None
            drained()
        if done:
            self._on_finished(stream, queued)

    def flush(self) -> None:
        """After the windows grew or the transport drained: let waiting streams go, in the order they
        queued."""
        if not self.blocked:  # the common case: gRPC clients return window after every answer
            return
        for stream in list(self.blocked.values()):
            if self.windows.send_window <= 0 or self.paused or self.closed:
                return
            self.drain(stream)

    def initial_window_changed(self, value: int, streams: Iterable[H2Stream]) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE changed: open streams' windows move by the difference (§6.9.2)."""
        delta = value - self.initial_window
        self.initial_window = value
        for stream in streams:
            stream.shift(delta)

    def forget(self, stream: H2Stream) -> None:
        if stream.pending:
            for chunk in stream.pending:
                self.queued_bytes -= len(chunk)
            stream.pending = None
        stream.trailers = None
        stream.end_with_data = False
        stream.on_drained = None  # a reference back to its handler: dropped, so no cycle outlives it
        self.blocked.pop(stream.id, None)

    def detach(self) -> None:
        """The connection is gone: drop what waits and the references back to the core, so the two are freed
        by reference counting at once rather than by a later cyclic collection."""
        self.closed = True
        self._on_finished = _ignore
        self._on_output = _nothing
        self.blocked.clear()
        self._outbox = []
        self.queued_bytes = 0

    def write(self, data: bytes) -> None:
        """Every frame of the connection leaves through here or `writelines`, in order."""
        if not self._outbox:
            self._on_output()
        self._outbox.append(data)

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        if not self._outbox:
            self._on_output()
        self._outbox.extend(parts)

    def take(self) -> list[bytes | memoryview]:
        """What is to be written, in order; the outbox is empty afterwards."""
        out = self._outbox
        if out:
            self._outbox = []
        return out


def _ignore(stream: H2Stream, queued: bool) -> None:
    """on_finished of a detached Outbound."""


def _nothing() -> None:
    """on_output of a detached Outbound."""
