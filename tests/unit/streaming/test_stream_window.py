"""Response flow control, both ends, in-process: `StreamWindow` (engine/streaming/window.py), the consumer's
count of what its client took, credited to the producer in batches; and `SendCredits`
(engine/backends/python/send_credits.py), where a decoupled model's sends wait for that credit. Plain
objects: the window's tests are plain functions; the credits' use real threads, each wait bounded.
"""

from __future__ import annotations

import threading

from engine.backends.python.send_credits import SendCredits
from engine.streaming.window import CREDIT_BATCH, RESPONSE_WINDOW, StreamWindow


def test_credit_goes_back_in_batches():
    granted: list[int] = []
    window = StreamWindow()
    window.bind(granted.append)
    for _ in range(CREDIT_BATCH - 1):
        window.taken()
    assert granted == []
    window.taken()
    assert granted == [CREDIT_BATCH]
    window.taken(3 * CREDIT_BATCH)
    assert granted == [CREDIT_BATCH, 3 * CREDIT_BATCH]


def test_what_was_taken_before_the_producer_bound_goes_at_once():
    granted: list[int] = []
    window = StreamWindow()
    window.taken(2)
    window.bind(granted.append)
    assert granted == [2]


def test_a_closed_window_grants_nothing_more():
    granted: list[int] = []
    window = StreamWindow(batch=1)
    window.bind(granted.append)
    window.taken()
    window.close()
    window.taken(5)
    assert granted == [1]


class Sender(threading.Thread):
    """A model's thread sending `count` responses of request `key`, each after the credit for it."""

    def __init__(self, credits: SendCredits, key: int, count: int) -> None:
        super().__init__(daemon=True)
        self.credits, self.key, self.count = credits, key, count
        self.sent = 0
        self.progress = threading.Condition()

    def run(self) -> None:
        for _ in range(self.count):
            self.credits.acquire(self.key)
            with self.progress:
                self.sent += 1
                self.progress.notify_all()

    def wait_for(self, sent: int) -> bool:
        with self.progress:
            return self.progress.wait_for(lambda: self.sent >= sent, timeout=10)


def test_a_send_waits_at_the_window_until_credit_comes():
    credits = SendCredits(set(), window=4)
    sender = Sender(credits, 7, 10)
    sender.start()
    assert sender.wait_for(4)
    sender.join(0.2)  # it stays at the window: no credit
    assert sender.is_alive() and sender.sent == 4
    credits.grant(7, 3)
    assert sender.wait_for(7)
    credits.grant(7, 3)
    sender.join(10)
    assert not sender.is_alive() and sender.sent == 10


def test_a_cancelled_request_never_waits():
    cancelled: set[int] = set()
    credits = SendCredits(cancelled, window=2)
    sender = Sender(credits, 3, 50)
    sender.start()
    assert sender.wait_for(2)
    cancelled.add(3)  # the engine said so: its sends go on, to be dropped
    credits.cancel(3)
    sender.join(10)
    assert not sender.is_alive() and sender.sent == 50


def test_requests_wait_on_their_own_credit_and_a_finished_one_is_forgotten():
    credits = SendCredits(set(), window=RESPONSE_WINDOW)
    for _ in range(RESPONSE_WINDOW):
        credits.acquire(1)  # request 1 at its window; request 2 untouched
    credits.acquire(2)
    credits.finished(1)
    credits.grant(1, 5)  # credit for a request that ended brings nothing back
    credits.acquire(1)  # a new key's full window (keys are never reused; this shows the count was dropped)
