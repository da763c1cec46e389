"""Flow control for a streamed answer across the channel (`--workers N`, streams.py): a window of pieces and
bytes the engine may send ahead of what the frontend's client connection has taken, and the credit the
frontend hands back as it takes them.

In one process the route (frontend/openai/stream.py, a Batch API download) awaits the connection's `drain()`
after each piece, so a client that stops reading leaves at most the transport's high-water mark written and
the rest waits in the route (a generation's small text events; a download's file, still on disk); the engine
itself goes on to the request's max_tokens (the generation is not paused) and the client is dropped after
`--client-timeout-secs`. Across processes the route runs in the engine and its `drain()` is `SendWindow.wait`:
it returns while fewer than `WINDOW_PIECES` pieces and `WINDOW_BYTES` bytes are unaccounted for, and otherwise
waits for credit. The frontend counts the pieces and bytes it writes to a stream's connection
(`CreditReturns.written`); after every `CREDIT_EVERY` pieces or `CREDIT_BYTES` bytes it awaits that
connection's own `drain()` and only then gives them back, in its next frame (messages.py `credits`), as a
count of pieces (the engine knows their sizes). So a client that stops reading stops the pieces in the engine,
where a single process holds them too, and its frontend holds at most a window of pieces (a window of bytes,
for large ones) beyond the transport's mark, whatever the answer's size. Each window is larger than its credit
batch, so the window never fills with pieces the frontend has not been asked to give back. The client timeout
works on the connection as in one process: it drops the client, which cancels the stream in the engine
(streams.py).

Credit is one `(cid, pieces)` in a frame per `CREDIT_EVERY` pieces (or `CREDIT_BYTES`), not a message per
token; a stream whose connection keeps up runs ahead by up to a window, so the engine never waits on the
round trip. Both sides are plain objects run on their loop; `CreditReturns` makes one small task per credit
batch (to await the connection's drain), and never more than one per stream at a time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ..frontend.http.types import ResponseStream
from .messages import Credit

WINDOW_PIECES = 128  # a stream's pieces the engine may have sent and the frontend not yet given back
CREDIT_EVERY = 32  # the frontend gives credit back in batches of this many pieces (a quarter window)
WINDOW_BYTES = 1 << 20  # and their bytes (a download's 64 KiB chunks: 16 pieces)
CREDIT_BYTES = 256 << 10  # or once this many bytes were written (a quarter window)


class SendWindow:
    """Engine side, one per forwarded request that may stream: made by the session (which hands it the
    frontend's credit, `grant`) and counted by the request's StreamOut (`sent`, `wait`)."""

    __slots__ = ("_sizes", "_unacked_bytes", "_waiter")

    def __init__(self) -> None:
        self._sizes: deque[int] = deque()  # the unaccounted pieces' sizes, oldest first
        self._unacked_bytes = 0
        self._waiter: asyncio.Future[None] | None = None

    @property
    def unacked(self) -> int:
        return len(self._sizes)

    @property
    def unacked_bytes(self) -> int:
        return self._unacked_bytes

    def sent(self, nbytes: int) -> None:
        self._sizes.append(nbytes)
        self._unacked_bytes += nbytes

    def grant(self, pieces: int) -> None:
        """The frontend's connection took `pieces` more, the oldest (it never gives back more than it got)."""
        sizes = self._sizes
        for _ in range(min(pieces, len(sizes))):
            self._unacked_bytes -= sizes.popleft()
        waiter = self._waiter
        if waiter is not None and not self._full():
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Returns once fewer than WINDOW_PIECES pieces and WINDOW_BYTES bytes are unaccounted for (at once,
        while the client reads). Cancelled with the route's task when the client leaves."""
        while self._full():
            if self._waiter is None:
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)

    def _full(self) -> bool:
        return len(self._sizes) >= WINDOW_PIECES or self._unacked_bytes >= WINDOW_BYTES


class CreditReturns:
    """Frontend side, one per engine client (remote.py): counts each stream's pieces written to its
    connection and collects the credit for the next frame. `schedule` asks for that frame."""

    __slots__ = ("_counts", "_draining", "_grants", "_schedule")

    def __init__(self, schedule: Callable[[], None]) -> None:
        self._schedule = schedule
        self._counts: dict[int, tuple[int, int]] = {}  # cid → (pieces, bytes) written since its last credit
        self._draining: dict[int, asyncio.Future[None]] = {}  # cid → awaiting its connection's drain
        self._grants: list[Credit] = []

    @property
    def pending(self) -> bool:
        return bool(self._grants)

    def written(self, cid: int, stream: ResponseStream, nbytes: int) -> None:
        """A piece of `nbytes` of stream `cid` was written to its connection."""
        pieces, size = self._counts.get(cid, (0, 0))
        pieces, size = pieces + 1, size + nbytes
        self._counts[cid] = pieces, size
        if (pieces >= CREDIT_EVERY or size >= CREDIT_BYTES) and cid not in self._draining:
            self._draining[cid] = asyncio.ensure_future(self._give_back(cid, stream))

    async def _give_back(self, cid: int, stream: ResponseStream) -> None:
        await stream.drain()  # at once unless the client leaves what it was sent unread
        if self._draining.pop(cid, None) is None:
            return  # forgotten while waiting: the stream ended or was cancelled
        pieces, _ = self._counts.pop(cid, (0, 0))
        if pieces:
            self._grants.append(Credit(cid, pieces))
            self._schedule()

    def give(self, rid: int, responses: int) -> None:
        """A streaming request's client took `responses` more of its decoupled model's responses (its
        StreamWindow's credit, engine/streaming/window.py): for the next frame."""
        self._grants.append(Credit(rid, responses))
        self._schedule()

    def forget(self, cid: int) -> None:
        """Stream `cid` ended, or its client left: nothing more is given back for it."""
        self._counts.pop(cid, None)
        waiting = self._draining.pop(cid, None)
        if waiting is not None:
            waiting.cancel()

    def take(self) -> list[Credit]:
        """The credit collected since the last frame, for this one."""
        grants, self._grants = self._grants, []
        return grants

    def close(self) -> None:
        for waiting in self._draining.values():
            waiting.cancel()
        self._draining.clear()
        self._counts.clear()
        self._grants.clear()
