"""Streaming HTTP answers across the channel (`--workers N`): the OpenAI API's server-sent events are made in
the engine process, where the generation engines are, and written by the frontend that holds the client.

On the wire (messages.py) a streamed answer is a forwarded HTTP control whose answer comes in pieces, all
under the control's id: first the head, `(status, None, content type, extra header lines)` (an answer with
no body: the body follows), then each piece as bytes, then None for the end. A frontend whose client leaves
sends the control's id with its cancels; the engine then cancels the stream (the generation stops and frees
its KV blocks) and sends nothing more for it.

`StreamOut` is the engine's sink for one stream (pieces into the session's next frame); `RemoteStream` is the
frontend's `Streaming` answer, fed by the session's frames and written by the HTTP connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..frontend.http_types import StreamSink

StreamHead = tuple[int, None, bytes, bytes]
_CANCELLABLE_PREFIX = b"/v1/"


def cancellable(url: bytes) -> bool:
    """Whether a forwarded HTTP request is cancelled in the engine when its client leaves: a generation (the
    OpenAI API), which would otherwise run on for nobody. Other forwarded requests (a repository load, say)
    finish whatever happens to their client, as they always have with --workers N."""
    return url.startswith(_CANCELLABLE_PREFIX)


def is_stream_head(result: Any) -> bool:
    """Whether a control answer is a stream's head (an HTTP answer whose body follows in pieces)."""
    return type(result) is tuple and len(result) == 4 and result[1] is None


class StreamOut:
    """Engine side: a `StreamSink` whose pieces go out with the session's next frame under `cid`."""

    __slots__ = ("_cid", "_piece")

    def __init__(self, cid: int, piece: Callable[[int, bytes | None], None]) -> None:
        self._cid = cid
        self._piece = piece

    def send(self, data: bytes) -> None:
        self._piece(self._cid, bytes(data))

    def end(self) -> None:
        self._piece(self._cid, None)


class RemoteStream:
    """Frontend side: a `Streaming` answer whose pieces arrive from the engine. Pieces that arrive before the
    connection has written the head are kept until `start`."""

    def __init__(self, head: StreamHead, cancel: Callable[[], None]) -> None:
        self.status, _, self.content_type, self.extra = head
        self._cancel = cancel
        self._sink: StreamSink | None = None
        self._early: list[bytes] = []
        self._ended = False

    def start(self, sink: StreamSink) -> None:
        self._sink = sink
        for piece in self._early:
            sink.send(piece)
        self._early.clear()
        if self._ended:
            sink.end()

    def cancel(self) -> None:
        """The client left (the connection calls this): the engine is told to stop the stream."""
        if not self._ended:
            self._ended = True
            self._cancel()

    def piece(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink.send(data)
        elif not self._ended:
            self._early.append(data)

    def end(self) -> None:
        """The engine ended the stream (or the engine is gone: the client sees it cut short)."""
        if self._ended and self._sink is None:
            return
        self._ended = True
        if self._sink is not None:
            self._sink.end()
