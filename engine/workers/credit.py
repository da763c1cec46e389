"""Flow control for a streamed answer across the channel (`--workers N`, streams.py): a window of pieces the
engine may send ahead of what the frontend's client connection has taken, and the credit the frontend hands
back as it takes them.

In one process the route (openai_stream.py) awaits the connection's `drain()` after each event, so a client
that stops reading leaves at most the transport's high-water mark written and the rest of its generation
waits in the route as the engine's small text events; the engine itself goes on to the request's max_tokens
(the generation is not paused) and the client is dropped after `--client-timeout-secs`. Across processes
the route runs in the engine and its `drain()` is `SendWindow.wait`: it returns while fewer than
`WINDOW_PIECES` pieces are unaccounted for, and otherwise waits for credit. The frontend counts the pieces
it writes to a stream's connection (`CreditReturns.written`); after every `CREDIT_EVERY` of them it awaits
that connection's own `drain()` and only then gives them back, in its next frame (messages.py `credits`).
So a client that stops reading stops the pieces in the engine, where a single process holds them too, and
its frontend holds at most a window of pieces beyond the transport's mark, whatever the request's size.
The client timeout works on the connection as in one process: it drops the client, which cancels the
stream in the engine (streams.py).

Credit is one `(cid, pieces)` in a frame per `CREDIT_EVERY` pieces, not a message per token; a stream
whose connection keeps up runs ahead by up to a window, so the engine never waits on the round trip.
Both sides are plain objects run on their loop; `CreditReturns` makes one small task per `CREDIT_EVERY`
pieces (to await the connection's drain), and never more than one per stream at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..frontend.http_types import ResponseStream

WINDOW_PIECES = 128  # a stream's pieces the engine may have sent and the frontend not yet given back
CREDIT_EVERY = 32  # the frontend gives credit back in batches of this many pieces (a quarter window)


class SendWindow:
    """Engine side, one per forwarded request that may stream: made by the session (which hands it the
    frontend's credit, `grant`) and counted by the request's StreamOut (`sent`, `wait`)."""

    __slots__ = ("_unacked", "_waiter")

    def __init__(self) -> None:
        self._unacked = 0
        self._waiter: asyncio.Future[None] | None = None

    @property
    def unacked(self) -> int:
        return self._unacked

    def sent(self) -> None:
        self._unacked += 1

    def grant(self, pieces: int) -> None:
        """The frontend's connection took `pieces` more (the frontend never gives back more than it got)."""
        self._unacked = max(0, self._unacked - pieces)
        waiter = self._waiter
        if waiter is not None and self._unacked < WINDOW_PIECES:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Returns once fewer than WINDOW_PIECES pieces are unaccounted for (at once, while the client
        reads). Cancelled with the route's task when the client leaves."""
        while self._unacked >= WINDOW_PIECES:
            if self._waiter is None:
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)


class CreditReturns:
    """Frontend side, one per engine client (remote.py): counts each stream's pieces written to its
    connection and collects the credit for the next frame. `schedule` asks for that frame."""

    __slots__ = ("_counts", "_draining", "_grants", "_schedule")

    def __init__(self, schedule: Callable[[], None]) -> None:
        self._schedule = schedule
        self._counts: dict[int, int] = {}  # cid → pieces written since its last credit
        self._draining: dict[int, asyncio.Future[None]] = {}  # cid → awaiting its connection's drain
        self._grants: list[tuple[int, int]] = []

    @property
    def pending(self) -> bool:
        return bool(self._grants)

    def written(self, cid: int, stream: ResponseStream) -> None:
        """A piece of stream `cid` was written to its connection."""
        count = self._counts.get(cid, 0) + 1
        self._counts[cid] = count
        if count >= CREDIT_EVERY and cid not in self._draining:
            self._draining[cid] = asyncio.ensure_future(self._give_back(cid, stream))

    async def _give_back(self, cid: int, stream: ResponseStream) -> None:
        await stream.drain()  # at once unless the client leaves what it was sent unread
        if self._draining.pop(cid, None) is None:
            return  # forgotten while waiting: the stream ended or was cancelled
        count = self._counts.pop(cid, 0)
        if count:
            self._grants.append((cid, count))
            self._schedule()

    def give(self, rid: int, responses: int) -> None:
        """A streaming request's client took `responses` more of its decoupled model's responses (its
        StreamWindow's credit, engine/stream_window.py): for the next frame."""
        self._grants.append((rid, responses))
        self._schedule()

    def forget(self, cid: int) -> None:
        """Stream `cid` ended, or its client left: nothing more is given back for it."""
        self._counts.pop(cid, None)
        waiting = self._draining.pop(cid, None)
        if waiting is not None:
            waiting.cancel()

    def take(self) -> list[tuple[int, int]]:
        """The credit collected since the last frame, for this one."""
        grants, self._grants = self._grants, []
        return grants

    def close(self) -> None:
        for waiting in self._draining.values():
            waiting.cancel()
        self._draining.clear()
        self._counts.clear()
        self._grants.clear()
