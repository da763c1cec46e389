"""The h2 frontend's abuse policies (engine/frontend/h2/guard.py) and the header-block bound (headers.py's
FieldBlock), as plain synchronous objects: no sockets, no loop, time passed in."""

from __future__ import annotations

import pytest

from engine.access.quotas import ByteBudget
from engine.frontend.h2.frames import H2ConnectionError, H2Error
from engine.frontend.h2.guard import ConnectionClock, Expiry, FloodGuard
from engine.frontend.h2.headers import FieldBlock
from engine.frontend.h2.streams import Limits

LIMITS = Limits(flood_window_secs=10.0, max_resets_per_window=3, max_pings_per_window=2,
                max_settings_per_window=2, max_empty_frames_per_window=2, max_unread_acks=2)


def calm(call) -> H2ConnectionError:
    with pytest.raises(H2ConnectionError) as e:
        call()
    assert e.value.code == H2Error.ENHANCE_YOUR_CALM
    return e.value


@pytest.mark.parametrize("count, limit", [("stream_reset", 3), ("ping", 2), ("settings_frame", 2),
                                          ("empty_frame", 2), ("ack_unread", 2)])
def test_each_count_allows_its_limit_then_calls_for_calm(count, limit):
    guard = FloodGuard(LIMITS, now=0.0)
    for _ in range(limit):
        getattr(guard, count)()
    calm(getattr(guard, count))


def test_counts_start_again_with_each_window():
    guard = FloodGuard(LIMITS, now=0.0)
    for _ in range(3):
        guard.stream_reset()
    guard.tick(9.9)  # the same window
    calm(guard.stream_reset)
    guard = FloodGuard(LIMITS, now=0.0)
    for second in (10.0, 20.5, 31.0):  # 3 per window, over and over, is a client within the limit
        for _ in range(3):
            guard.stream_reset()
        guard.tick(second)


def test_counts_are_independent():
    guard = FloodGuard(LIMITS, now=0.0)
    guard.ping()
    guard.ping()
    guard.settings_frame()
    guard.empty_frame()
    guard.stream_reset()
    assert "PING" in calm(guard.ping).message


def test_unread_acks_count_until_the_reader_catches_up_not_per_window():
    guard = FloodGuard(LIMITS, now=0.0)
    guard.ack_unread()
    guard.ack_unread()
    guard.tick(100.0)  # time alone doesn't excuse a peer that still doesn't read
    calm(guard.ack_unread)
    guard.reader_caught_up()
    guard.ack_unread()
    guard.ack_unread()


def test_byte_budget_refuses_what_would_exceed_it_and_takes_nothing_then():
    budget = ByteBudget(100)
    assert budget.take(60) and not budget.take(41) and budget.used == 60
    assert budget.take(40) and budget.used == 100
    budget.give(60)
    assert budget.take(50) and budget.used == 90


def clock_check(clock: ConnectionClock, now: float, **state) -> Expiry | None:
    base = dict(handshaken=True, busy=False, reads=1, partial_frame=False, waiting=False, drains=0,
                buffered=0)
    return clock.check(now, **{**base, **state})


def test_preface_must_arrive_within_the_client_timeout():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=100.0)
    assert clock_check(clock, 104.0, handshaken=False) is None
    assert clock_check(clock, 105.0, handshaken=False) is Expiry.PREFACE


def test_idle_counts_from_the_last_busy_check():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=60, now=0.0)
    assert clock_check(clock, 30.0, busy=True) is None
    assert clock_check(clock, 89.0) is None
    assert clock_check(clock, 90.0) is Expiry.IDLE


def test_a_partial_frame_without_reads_stalls():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    assert clock_check(clock, 1.0, partial_frame=True, reads=2, busy=True) is None
    assert clock_check(clock, 5.0, partial_frame=True, reads=2, busy=True) is None
    assert clock_check(clock, 6.0, partial_frame=True, reads=2, busy=True) is Expiry.STALLED
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    for second in range(1, 20):  # reads keep coming: a large frame arriving slowly is fine
        assert clock_check(clock, float(second), partial_frame=True, reads=second, busy=True) is None


def test_a_header_block_must_complete_within_the_client_timeout():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    for second in range(1, 6):  # reads keep coming, but the same block is still arriving
        assert clock_check(clock, float(second), heading=True, reads=second, partial_frame=True) is None
    assert clock_check(clock, 6.0, heading=True, reads=6, partial_frame=True) is Expiry.HEAD
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    for second in range(1, 20):  # a block in progress at every check, but a different one each time
        assert clock_check(clock, float(second), heading=True, heads=second, reads=second) is None
    assert clock_check(clock, 20.0, heading=False, heads=19) is None


def test_answers_waiting_without_progress_are_unread():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    assert clock_check(clock, 1.0, busy=True, waiting=True, buffered=1000) is None
    assert clock_check(clock, 3.0, busy=True, waiting=True, buffered=800) is None  # the peer read some
    assert clock_check(clock, 7.0, busy=True, waiting=True, buffered=800, drains=1) is None  # a window opened
    assert clock_check(clock, 11.9, busy=True, waiting=True, buffered=800, drains=1) is None
    assert clock_check(clock, 12.0, busy=True, waiting=True, buffered=800, drains=1) is Expiry.UNREAD


def test_waiting_restarts_after_answers_flowed():
    clock = ConnectionClock(client_timeout_secs=5, idle_timeout_secs=300, now=0.0)
    assert clock_check(clock, 1.0, busy=True, waiting=True) is None
    assert clock_check(clock, 4.0, busy=True) is None
    assert clock_check(clock, 8.0, busy=True, waiting=True) is None
    assert clock_check(clock, 13.0, busy=True, waiting=True) is Expiry.UNREAD


def test_timeouts_of_zero_are_off():
    clock = ConnectionClock(client_timeout_secs=0, idle_timeout_secs=0, now=0.0)
    assert clock_check(clock, 1e6, handshaken=False) is None
    clock = ConnectionClock(client_timeout_secs=0, idle_timeout_secs=0, now=0.0)
    assert clock_check(clock, 1e6, waiting=True, partial_frame=True) is None
    assert clock_check(clock, 2e6, waiting=True, partial_frame=True) is None


def test_field_block_joins_fragments_and_bounds_bytes_and_frames():
    block = FieldBlock(max_bytes=10, max_frames=3)
    block.start(1, 0x1, b"ab")
    assert block.add(1, b"cd", end=False) is None
    assert block.add(1, b"ef", end=True) == b"abcdef" and block.stream_id == 0
    block.start(3, 0, b"")
    block.add(3, b"", end=False)
    block.add(3, b"", end=False)
    assert "frames" in calm(lambda: block.add(3, b"", end=False)).message
    block = FieldBlock(max_bytes=10, max_frames=3)
    block.start(5, 0, b"12345")
    assert "large" in calm(lambda: block.add(5, b"123456", end=True)).message


def test_continuation_must_continue_the_open_block():
    block = FieldBlock(max_bytes=10, max_frames=3)
    with pytest.raises(H2ConnectionError) as e:
        block.add(1, b"x", end=True)
    assert e.value.code == H2Error.PROTOCOL_ERROR
    block.start(1, 0, b"x")
    with pytest.raises(H2ConnectionError):
        block.add(3, b"x", end=True)
