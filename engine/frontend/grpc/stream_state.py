"""What a ModelStreamInfer call holds beyond a unary call's fields: `StreamState`, one per stream call
(`Call.streaming`; None for every other RPC, which so allocates none of it). Its requests in flight, whether
the stream is read or held (HTTP/2 flow control: its window is not opened while it must wait), what arrived
while it was held, and the decoupled responses waiting on the stream for the client. Read and written by
stream_infer.py's `StreamInfer` methods of the call, and emptied by `Call._stop_work` as the call ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...access.policy import Admission
from ...streaming.window import StreamWindow


class StreamState:
    """One ModelStreamInfer stream's reading and requests (module docstring)."""

    __slots__ = ("capped", "drain_due", "held", "held_bytes", "held_more", "next_bytes", "paused", "pending",
                 "unsent", "waiting_bytes")

    def __init__(self) -> None:
        # requests in flight, each with what its admission holds (None: no access policy)
        self.pending: dict[asyncio.Future[Any], Admission | None] = {}
        self.capped: set[asyncio.Future[Any]] = set()  # of those, what the stream's cap counts (_must_wait)
        self.paused = False  # not read for now (the stream's window is held)
        # while not read: what was not read of the DATA it stopped in, what came since, and their bytes
        # (drawn from the connection's budget)
        self.held: memoryview | None = None
        self.held_more: list[memoryview] = []
        self.held_bytes = 0
        self.next_bytes = -1  # the length of the message being read, once reserved in the in-flight budget
        self.waiting_bytes = 0  # what the next message waits for in the in-flight budget
        self.unsent: list[StreamWindow] = []  # decoupled responses waiting on the stream for the client
        self.drain_due = False  # a read-on after the stream drained is scheduled

    def take_held(self) -> memoryview | None:
        """What waited while the stream was not read, as one view (joined only when more came meanwhile)."""
        held, more = self.held, self.held_more
        self.held, self.held_more, self.held_bytes = None, [], 0
        if not more:
            return held
        joined = bytearray() if held is None else bytearray(held)
        for piece in more:
            joined += piece
        return memoryview(joined)  # never resized again: views of it stay valid

    def drop_held(self) -> None:
        """The call ended while held: what waited is not wanted (its budget is given back by the call)."""
        if self.held_bytes:
            self.held, self.held_more, self.held_bytes = None, [], 0
