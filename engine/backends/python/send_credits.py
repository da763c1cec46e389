"""A decoupled model's side of response flow control (engine/streaming/window.py): each request (by its
sender's key) may send `RESPONSE_WINDOW` responses before it waits for credit, which the engine grants as the
request's client takes them. So a client that stops reading stops the model's thread in `sender.send()`,
instead of its responses piling up in the server until the client is dropped.

Shared by both sinks of decoupled sends: the instance process's (stub.py `StubSink`; the engine's grants
arrive as `SendCredit` messages, read by whichever of its threads reads: reading.py) and an in-process
instance's (backend.py `InProcessSink`; grants come from the loop). Thread-safe: `acquire` runs on the
model's threads, `grant` and `cancel` on another.

A send waits only while its request is live: a cancelled request (the client left; the server then drops
what is sent) and the final flag never wait, so the model's `is_cancelled()` check and its last send always
go through. The wait ends when the client reads again, or when it leaves (dropped after
--client-timeout-secs of unread answers, which cancels the request).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container

from ...streaming.window import RESPONSE_WINDOW
from . import pb_utils


class SendCredits:
    def __init__(self, cancelled: Container[int], window: int = RESPONSE_WINDOW) -> None:
        """`cancelled`: the keys the engine said are cancelled (the sink's set, read under no lock: a key is
        only ever added while live)."""
        self._cancelled = cancelled
        self._window = window
        self._credit: dict[int, int] = {}  # live keys that sent: sends left before a wait
        self._changed = threading.Condition()
        # Called before a send waits: the instance process's reader must then read the grant (stub.py).
        self.waiting: Callable[[], None] = lambda: None

    def acquire(self, key: int) -> None:
        """Before a send of `key` that is not its last: take one credit, waiting while there is none and the
        request is live."""
        with self._changed:
            left = self._credit.get(key, self._window)
            while left <= 0 and key not in self._cancelled:
                self.waiting()
                self._changed.wait()
                left = self._credit.get(key, self._window)
            self._credit[key] = left - 1

    def grant(self, key: int, n: int) -> None:
        """The engine's credit for `n` more sends of `key` (its client took that many)."""
        with self._changed:
            if key in self._credit:  # a key that finished is not brought back
                self._credit[key] += n
                self._changed.notify_all()

    def cancel(self, key: int) -> None:
        """`key` was cancelled (added to the sink's set first): its waiting send goes on, to be dropped."""
        with self._changed:
            self._changed.notify_all()

    def finished(self, key: int) -> None:
        """`key` sent its final flag, or its request failed: its count is dropped."""
        with self._changed:
            self._credit.pop(key, None)


__all__ = ["SendCredits"]


class CreditedSink(pb_utils.ResponseSink):
    """What both sinks of decoupled sends share: the keys the engine cancelled, the credits, and the order of
    a send (a final send frees its key; any other waits for credit first). `deliver` is where the response
    goes: the instance's channel (stub.py `StubSink`) or the event loop (backend.py `InProcessSink`)."""

    def __init__(self) -> None:
        self.cancelled: set[int] = set()
        self.credits = SendCredits(self.cancelled)

    def send(self, key: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if final:
            self.cancelled.discard(key)
            self.credits.finished(key)
        else:
            self.credits.acquire(key)  # waits while its client has RESPONSE_WINDOW responses not yet taken
        self.deliver(key, response, final)

    def deliver(self, key: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        raise NotImplementedError

    def is_cancelled(self, key: int) -> bool:
        return key in self.cancelled
