"""Flow control for a streaming request's responses: a decoupled model may have at most `RESPONSE_WINDOW` of
one request's responses sent and not yet taken by its client, so a client that stops reading stops the
model's sends, and what waits for it stays bounded whatever the request asks for.

Credit, as HTTP/2 windows work: the producer (a decoupled Python model's sender: backends/python/decoupled.py
`Relay`, backends/python/send_credits.py) starts with `RESPONSE_WINDOW` sends and waits at zero; the consumer
(the gRPC stream, `infer_stream`'s queue for HTTP generate_stream, a frontend's channel with --workers N)
makes one `StreamWindow` per request, sets it as the request's `stream_window`, and calls `taken(n)` once it
has handed `n` responses to its client (written out, not waiting for the client to read them). The window
hands that credit to whatever producer bound it (`bind`), in batches of `batch`, so credit costs a message
per `batch` responses, not one per response.

A request without a window (a producer whose consumer does not count) gets its credit back as each
response is delivered: the old unbounded behaviour, never a wait that nothing would end. Loop-only; pure
apart from the bound callback.
"""

from __future__ import annotations

from collections.abc import Callable

RESPONSE_WINDOW = 64  # a request's responses sent by the model and not yet taken by its client, at most
CREDIT_BATCH = 16  # credit goes back in batches of this many responses (a quarter window)

Grant = Callable[[int], None]


class StreamWindow:
    """One streaming request's credit, from its consumer to its producer. Made by the consumer; the producer
    binds `grant(n)`, called with the credit for `n` more sends."""

    __slots__ = ("_batch", "_grant", "_owed")

    def __init__(self, batch: int = CREDIT_BATCH) -> None:
        self._batch = batch
        self._grant: Grant | None = None
        self._owed = 0  # responses taken and not yet granted back

    def bind(self, grant: Grant) -> None:
        """Called by the producer once: where credit goes. What was owed before goes at once."""
        self._grant = grant
        if self._owed:
            owed, self._owed = self._owed, 0
            grant(owed)

    def taken(self, n: int = 1) -> None:
        """The consumer handed `n` more responses to its client."""
        self._owed += n
        grant = self._grant
        if grant is not None and self._owed >= self._batch:
            owed, self._owed = self._owed, 0
            grant(owed)

    def close(self) -> None:
        """The request ended: no more credit for anyone."""
        self._grant = None
        self._owed = 0


__all__ = ["CREDIT_BATCH", "RESPONSE_WINDOW", "Grant", "StreamWindow"]
