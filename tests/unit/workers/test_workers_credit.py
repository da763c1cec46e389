"""engine/workers/credit.py on its own: the engine's window of a stream's pieces and the frontend's credit,
with a small real stand-in for a client connection (a `ResponseStream` whose drain waits while it is
"paused"). test_openai_slow_reader.py checks the two across real processes."""

from __future__ import annotations

import asyncio

import pytest

from engine.workers.credit import (
    CREDIT_BYTES,
    CREDIT_EVERY,
    WINDOW_BYTES,
    WINDOW_PIECES,
    CreditReturns,
    SendWindow,
)
from engine.workers.messages import Credit


class Connection:
    """A client connection as a stream sees it: drain returns at once unless paused."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self._resumed = asyncio.Event()
        self._resumed.set()

    def start(self, status: int, content_type: bytes, extra: bytes = b"") -> None:
        pass

    def send(self, data: bytes) -> None:
        self.pieces.append(data)

    async def drain(self) -> None:
        await self._resumed.wait()

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()


async def _rounds(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # lets the loop run the callbacks and tasks made so far, nothing timed


def test_the_window_waits_only_once_full_and_opens_with_credit():
    async def go() -> None:
        window = SendWindow()
        for _ in range(WINDOW_PIECES - 1):
            window.sent(1)
        await window.wait()  # not full: at once
        window.sent(1)
        waiting = asyncio.ensure_future(window.wait())
        await _rounds()
        assert not waiting.done()
        window.grant(CREDIT_EVERY)
        await _rounds()
        assert waiting.done() and window.unacked == WINDOW_PIECES - CREDIT_EVERY
        window.grant(10 * WINDOW_PIECES)  # never below nothing
        assert window.unacked == 0

    asyncio.run(go())


def test_credit_goes_back_per_batch_and_only_once_the_connection_takes_it():
    async def go() -> None:
        frames: list[list[tuple[int, int]]] = []
        credit = CreditReturns(lambda: None)
        conn = Connection()
        for _ in range(CREDIT_EVERY - 1):
            credit.written(7, conn, 1)
        await _rounds()
        assert not credit.pending  # fewer than a batch: nothing yet
        conn.pause()
        credit.written(7, conn, 1)
        credit.written(7, conn, 1)
        await _rounds()
        assert not credit.pending  # the client is not reading: nothing goes back
        conn.resume()
        await _rounds()
        frames.append(credit.take())
        assert frames == [[Credit(7, CREDIT_EVERY + 1)]] and not credit.pending

    asyncio.run(go())


def test_a_stream_forgotten_while_its_client_stalls_gives_nothing_back():
    async def go() -> None:
        credit = CreditReturns(lambda: None)
        conn = Connection()
        conn.pause()
        for _ in range(CREDIT_EVERY):
            credit.written(3, conn, 1)
        await _rounds()
        credit.forget(3)
        conn.resume()
        await _rounds()
        assert not credit.pending and credit.take() == []

    asyncio.run(go())


def test_large_pieces_fill_the_window_by_their_bytes_and_credit_goes_back_by_bytes():
    async def go() -> None:
        piece = 64 << 10
        window = SendWindow()
        for _ in range(WINDOW_BYTES // piece - 1):
            window.sent(piece)
        await window.wait()  # not full: at once
        window.sent(piece)
        waiting = asyncio.ensure_future(window.wait())
        await _rounds()
        assert not waiting.done() and window.unacked < WINDOW_PIECES
        window.grant(1)  # the oldest piece: its bytes come off
        await _rounds()
        assert waiting.done() and window.unacked_bytes == WINDOW_BYTES - piece
        credit, conn = CreditReturns(lambda: None), Connection()
        for _ in range(CREDIT_BYTES // piece - 1):
            credit.written(5, conn, piece)
        await _rounds()
        assert not credit.pending
        credit.written(5, conn, piece)
        await _rounds()
        assert credit.take() == [Credit(5, CREDIT_BYTES // piece)]

    asyncio.run(go())


@pytest.mark.parametrize("size", [1, 64 << 10])
def test_engine_and_frontend_together_never_send_more_than_a_window_ahead_of_the_client(size: int):
    """The two ends joined directly (each credit delivered as the frame would): a producer as fast as the
    route, a client that stops after some pieces and later reads again. Nothing stalls for good, and what
    is sent ahead stays within a window of pieces (small ones, a generation's events) or of bytes (a
    download's chunks)."""
    async def go() -> None:
        window, conn = SendWindow(), Connection()
        credit = CreditReturns(lambda: asyncio.get_running_loop().call_soon(deliver))
        delivered: list[int] = []
        payload = b"x" * size

        def deliver() -> None:
            for given in credit.take():
                window.grant(given.count)

        def arrive(i: int) -> None:  # the frontend receives a piece and writes it to the connection
            conn.send(payload)
            credit.written(1, conn, size)
            delivered.append(i)

        total = 10 * WINDOW_PIECES
        conn.pause()  # the client reads nothing

        async def route() -> None:
            for i in range(total):
                window.sent(size)
                asyncio.get_running_loop().call_soon(arrive, i)
                await window.wait()

        producer = asyncio.ensure_future(route())
        await _rounds(50)
        assert not producer.done() and len(delivered) <= WINDOW_PIECES
        assert len(delivered) * size <= WINDOW_BYTES + size
        conn.resume()
        await asyncio.wait_for(producer, 10)
        await _rounds()
        assert delivered == list(range(total))

    asyncio.run(go())
