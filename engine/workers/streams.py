"""Streamed HTTP answers across the channel (`--workers N`): the OpenAI API's server-sent events are made in
the engine process, where the generation engines are, and written by the frontend that holds the client.

On the wire (messages.py) a streamed answer is a forwarded HTTP control whose answer comes in pieces, all
under the control's id: first the head, `(status, None, content type, extra header lines)` (an answer with
no body: the body follows), then each piece as bytes, then None for the end. A frontend whose client leaves
sends the control's id with its cancels; the engine then cancels the route's task (the generation stops and
frees its KV blocks) and sends nothing more for it.

The route writes the one `ResponseStream` interface (frontend/http/types.py) on both sides: in the engine, the
request's stream is a `StreamOut` (pieces into the session's next frame); in the frontend, remote.py hands
the head and the pieces to the client's connection (`start`, `send`) and resolves the forwarded request's
future at the end, so the connection ends the body and releases the request's admission then. Back-pressure
crosses with the pieces (credit.py): `StreamOut.drain` waits while a window of pieces is out that the
frontend's connection has not taken, so a client that stops reading leaves the rest of its generation in
the route's queue in the engine (the rest of a download on disk), as in one process, and its frontend holds
at most that window; a client
that stops reading is dropped after --client-timeout-secs, which cancels the stream in the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..frontend.endpoints import Endpoint, Where
from .credit import SendWindow

StreamHead = tuple[int, None, bytes, bytes]
# the endpoints, by name, whose forwarded requests the engine cancels when their client leaves
_CANCELLABLE = frozenset(e.name for e in Endpoint if e.row.cancellable and e.row.where is Where.FORWARDED)


def cancellable(endpoint: str) -> bool:
    """Whether a forwarded HTTP request is cancelled in the engine when its client leaves, by its parsed
    target's endpoint name (frontend/http/path.py `HttpTarget.to_wire`): a forwarded endpoint whose row
    (frontend/endpoints.py) says so, a generation (the OpenAI API), which would otherwise run on for nobody.
    Other forwarded requests (a repository load, say) finish whatever happens to their client, as they always
    have with --workers N; a local endpoint's request forwarded only to be refused (a GET to infer) is
    answered at once."""
    return endpoint in _CANCELLABLE


def is_stream_head(result: Any) -> bool:
    """Whether a control answer is a stream's head (an HTTP answer whose body follows in pieces)."""
    return type(result) is tuple and len(result) == 4 and result[1] is None


class StreamOut:
    """Engine side: the `ResponseStream` of a forwarded request, whose head and pieces go out with the
    session's next frame under `cid` (`piece(cid, item)`); the session sends the end when the route's task
    is done. `started` tells the control runner that the answer went out this way. `window` is the session's
    count of the pieces the frontend has not yet given back (None: a request that is never streamed)."""

    __slots__ = ("_cid", "_piece", "_window", "started")

    def __init__(self, cid: int, piece: Callable[[int, StreamHead | bytes], None],
                 window: SendWindow | None = None) -> None:
        self._cid = cid
        self._piece = piece
        self._window = window
        self.started = False

    def start(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        if not self.started:
            self.started = True
            self._piece(self._cid, (status, None, content_type, extra))

    def send(self, data: bytes) -> None:
        if self.started and data:
            self._piece(self._cid, bytes(data))
            if self._window is not None:
                self._window.sent(len(data))

    async def drain(self) -> None:
        """At once while the frontend's connection keeps up; otherwise once it has taken enough of what was
        sent (credit.py)."""
        if self._window is not None:
            await self._window.wait()
