"""Who reads an instance process's socket (engine/backends/python/reading.py), over a real socketpair and
real channels, no process: the main thread reads its batches itself; while it runs one, the helper thread
reads what a waiting model thread wants at once, and pings once the batch has run `TAKEOVER_S`; work the
helper read reaches the main thread next; EOF is reported by whichever thread finds it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine.backends.python.channel import Channel, ChannelClosed, engine_side, instance_side
from engine.backends.python.messages import BlsResult, Exec, Finalize, Ping, RequestHeader
from engine.backends.python.reading import Reading

BOUND_S = 5.0  # a generous bound on a loaded machine; the waits end as soon as the condition holds


class Routed:
    """The frames that are not work, as the reading threads handed them over, and by which thread."""

    def __init__(self) -> None:
        self.frames: list[tuple[Any, str]] = []
        self.arrived = threading.Condition()

    def __call__(self, message: Any, tensors: list[Any]) -> None:
        with self.arrived:
            self.frames.append((message, threading.current_thread().name))
            self.arrived.notify_all()

    def wait_for(self, count: int) -> list[tuple[Any, str]]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.frames) >= count, BOUND_S), self.frames
            return list(self.frames)


@pytest.fixture
def ends() -> Iterator[tuple[Channel, Reading, Routed, threading.Event]]:
    a_sock, b_sock = socket.socketpair()
    engine, instance = engine_side(a_sock, None, None), instance_side(b_sock, None, None)
    routed, eof = Routed(), threading.Event()
    reading = Reading(instance, routed, eof.set)
    yield engine, reading, routed, eof
    engine.close()
    assert eof.wait(BOUND_S)  # the helper (or a reader) saw the engine go
    instance.close()


def batch(n: int) -> Exec:
    return Exec(n, [RequestHeader("r", 0, 0, "{}", [], 0, 0)])


def test_the_main_thread_reads_its_batches_and_the_frames_between_them(ends) -> None:
    engine, reading, routed, _ = ends
    engine.send(Ping(1))
    engine.send(batch(1))
    assert reading.next_work()[0] == batch(1)
    assert routed.wait_for(1) == [(Ping(1), threading.current_thread().name)]  # read on its way to the batch


def test_while_a_batch_runs_the_helper_reads_what_a_model_thread_waits_for(ends) -> None:
    engine, reading, routed, _ = ends
    engine.send(batch(1))
    reading.next_work()  # the batch "runs" from here on: this thread reads nothing until next_work
    started = time.monotonic()
    reading.want()  # e.g. a BLS call was sent
    engine.send(BlsResult(7, None, "{}"))
    (message, thread), = routed.wait_for(1)
    assert message == BlsResult(7, None, "{}") and thread == "channel"
    assert time.monotonic() - started < BOUND_S
    engine.send(batch(2))  # the next batch, read by the helper meanwhile, is the main thread's next
    engine.send(Finalize())
    assert reading.next_work()[0] == batch(2)
    assert isinstance(reading.next_work()[0], Finalize)


def test_a_batch_past_takeover_has_its_pings_answered_meanwhile(ends) -> None:
    engine, reading, routed, _ = ends
    engine.send(batch(1))
    reading.next_work()
    engine.send(Ping(5))  # nobody wants it: the helper reads it once the batch has run TAKEOVER_S
    (message, thread), = routed.wait_for(1)
    assert message == Ping(5) and thread == "channel"


def test_eof_while_the_main_thread_reads_raises_after_reporting_it(ends) -> None:
    engine, reading, _, eof = ends
    engine.close()
    with pytest.raises(ChannelClosed):
        reading.next_work()
    assert eof.is_set()

