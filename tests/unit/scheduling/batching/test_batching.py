"""Tests of engine/scheduling/batching/policy.py's `BatchPolicy`: plain functions, no event loop.

Requests are `Pending` objects built by hand with a fake clock (nanoseconds), so every decision is exact.
The asyncio side (`Batcher`) is tested in test_batcher.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config.model_config import DynamicBatchingConfig, QueuePolicy, TimeoutAction
from engine.errors import EngineError, ErrorCode
from engine.scheduling.batching.join_forecast import EPOCH_NS
from engine.scheduling.batching.policy import BatchPolicy, Pending
from engine.types import InferenceRequest

MODEL = "policy_model"
WINDOW_US = 1_000  # a window far longer than the fake times below
WINDOW_NS = WINDOW_US * 1000


def pending(enqueue_ns: int = 0, batch_size: int = 1, shape_key: tuple = ((4,),), level: int = 1,
            deadline_ns: int = 0, action: TimeoutAction = TimeoutAction.REJECT, tag: str = "") -> Pending:
    request = InferenceRequest(MODEL, "", [], id=tag)
    inputs = {"INPUT0": np.zeros((batch_size, *shape_key[0]), dtype=np.float32)}
    return Pending(request, inputs, batch_size, shape_key, enqueue_ns, level, deadline_ns, action)


def tags(batch: list[Pending]) -> list[str]:
    return [p.request.id for p in batch]


def policy(max_batch_size: int = 8, **batching: object) -> BatchPolicy:
    """Triton's semantics unless a test asks for early dispatch (tested on its own below)."""
    batching.setdefault("early_dispatch", False)
    return BatchPolicy(max_batch_size, DynamicBatchingConfig(**batching))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- the window

def test_window_runs_from_the_oldest_request() -> None:
    pol = policy(max_queue_delay_us=100)  # 100_000 ns
    pol.enqueue(pending(1_000, tag="a"))
    pol.enqueue(pending(50_000, tag="b"))

    before = pol.peek(60_000)
    assert before.batch == []
    assert before.wait_ns == 1_000 + 100_000 - 60_000  # from "a", not from "b"

    at = pol.peek(101_000)
    assert tags(at.batch) == ["a", "b"]
    assert at.wait_ns is None
    assert len(pol) == 2  # peek never removes


def test_empty_policy_has_nothing_to_send_and_nothing_to_wait_for() -> None:
    decision = policy(max_queue_delay_us=100).peek(0)
    assert decision.batch == [] and decision.wait_ns is None


def test_zero_delay_sends_whatever_is_queued() -> None:
    pol = policy(max_queue_delay_us=0)
    pol.enqueue(pending(0, tag="a"))
    pol.enqueue(pending(5, tag="b"))
    decision = pol.peek(5)
    assert tags(decision.batch) == ["a", "b"]
    assert decision.wait_ns is None


# --------------------------------------------------------------------------------------------- sizes

def test_preferred_size_dispatches_at_once() -> None:
    pol = policy(max_queue_delay_us=WINDOW_US, preferred_batch_sizes=(2, 4))
    pol.enqueue(pending(0, tag="a"))
    assert pol.peek(1).batch == []
    pol.enqueue(pending(1, tag="b"))
    assert tags(pol.peek(2).batch) == ["a", "b"]  # long before the window closes


def test_the_longest_preferred_prefix_is_chosen() -> None:
    pol = policy(max_queue_delay_us=WINDOW_US, preferred_batch_sizes=(2, 4))
    for i, size in enumerate((1, 1, 1, 1, 1)):
        pol.enqueue(pending(i, batch_size=size, tag=str(i)))
    assert tags(pol.peek(10).batch) == ["0", "1", "2", "3"]  # 4 beats 2; the fifth waits

    pol = policy(max_queue_delay_us=WINDOW_US, preferred_batch_sizes=(2, 4))
    for i, size in enumerate((1, 2, 1, 2)):  # running totals 1, 3, 4, 6
        pol.enqueue(pending(i, batch_size=size, tag=str(i)))
    assert tags(pol.peek(10).batch) == ["0", "1", "2"]


def test_max_batch_size_caps_a_batch_and_the_request_that_does_not_fit_ends_it() -> None:
    pol = policy(max_batch_size=4, max_queue_delay_us=WINDOW_US)
    pol.enqueue(pending(0, batch_size=1, tag="a"))
    pol.enqueue(pending(1, batch_size=2, tag="b"))
    assert pol.peek(2).batch == []  # 3 of 4: still waiting for the window
    pol.enqueue(pending(2, batch_size=2, tag="c"))
    decision = pol.peek(3)
    assert tags(decision.batch) == ["a", "b"]  # "c" would make 5: the batch goes now, without it
    pol.take(decision.batch)
    assert len(pol) == 1


def test_reaching_max_batch_size_sends_at_once() -> None:
    pol = policy(max_batch_size=4, max_queue_delay_us=WINDOW_US)
    for i in range(5):
        pol.enqueue(pending(i, tag=str(i)))
    assert tags(pol.peek(5).batch) == ["0", "1", "2", "3"]


def test_different_non_batch_shapes_never_share_a_batch() -> None:
    pol = policy(max_queue_delay_us=WINDOW_US)
    pol.enqueue(pending(0, shape_key=((3,),), tag="a"))
    pol.enqueue(pending(1, shape_key=((5,),), tag="b"))
    pol.enqueue(pending(2, shape_key=((3,),), tag="c"))
    first = pol.peek(3)
    assert tags(first.batch) == ["a"]  # "b" cannot join, so "a" goes now; "c" does not jump "b"
    pol.take(first.batch)
    second = pol.peek(3)
    assert tags(second.batch) == ["b"]
    pol.take(second.batch)
    assert pol.peek(3).batch == []  # "c" alone waits for its window again
    assert tags(pol.peek(2 + WINDOW_NS).batch) == ["c"]


def test_without_dynamic_batching_each_request_is_its_own_batch() -> None:
    pol = BatchPolicy(8, None)
    for i in range(3):
        pol.enqueue(pending(i, tag=str(i)))
    for expected in ("0", "1", "2"):
        decision = pol.peek(10)
        assert tags(decision.batch) == [expected]
        pol.take(decision.batch)
    assert len(pol) == 0


def test_a_model_that_cannot_batch_sends_one_request_per_batch() -> None:
    pol = BatchPolicy(0, None)
    pol.enqueue(pending(0, tag="a"))
    pol.enqueue(pending(1, tag="b"))
    assert tags(pol.peek(2).batch) == ["a"]


# --------------------------------------------------------------------------------------------- priorities

def test_priority_levels_lowest_number_first_fifo_within_a_level() -> None:
    pol = policy(max_batch_size=8, priority_levels=3, default_priority_level=2)
    pol.enqueue(pending(0, level=3, tag="low"))
    pol.enqueue(pending(1, level=1, tag="high1"))
    pol.enqueue(pending(2, level=2, tag="mid"))
    pol.enqueue(pending(3, level=1, tag="high2"))
    assert tags(pol.peek(4).batch) == ["high1", "high2", "mid", "low"]

    pol = policy(max_batch_size=1, priority_levels=3, default_priority_level=2)
    pol.enqueue(pending(0, level=3, tag="low"))
    pol.enqueue(pending(1, level=1, tag="high"))
    order = []
    while len(pol):
        decision = pol.peek(2)
        order += tags(decision.batch)
        pol.take(decision.batch)
    assert order == ["high", "low"]


def test_level_of() -> None:
    single = policy()
    assert single.level_of(0) == 1
    assert single.level_of(7) == 1  # no levels configured: the parameter is ignored, as in Triton

    leveled = policy(priority_levels=3, default_priority_level=2)
    assert leveled.level_of(0) == 2
    assert leveled.level_of(1) == 1
    assert leveled.level_of(3) == 3
    with pytest.raises(EngineError) as info:
        leveled.level_of(4)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "priority 4" in info.value.message and "1..3" in info.value.message


# --------------------------------------------------------------------------------------------- queue policies

def test_max_queue_size_rejects_with_resource_exhausted_naming_the_model() -> None:
    pol = policy(default_queue_policy=QueuePolicy(max_queue_size=2))
    pol.enqueue(pending(0))
    pol.enqueue(pending(1))
    with pytest.raises(EngineError) as info:
        pol.enqueue(pending(2))
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert MODEL in info.value.message and "full" in info.value.message
    assert len(pol) == 2


def test_max_queue_size_applies_per_level() -> None:
    pol = policy(priority_levels=2, default_priority_level=2,
                 priority_queue_policies={1: QueuePolicy(max_queue_size=1)})
    pol.enqueue(pending(0, level=1))
    with pytest.raises(EngineError):
        pol.enqueue(pending(1, level=1))
    for i in range(5):
        pol.enqueue(pending(2 + i, level=2))  # level 2 has the default, unbounded policy
    assert len(pol) == 6


def test_expire_reject_returns_the_expired_requests() -> None:
    pol = policy(max_queue_delay_us=WINDOW_US)
    a = pending(0, deadline_ns=500, tag="a")
    b = pending(1, tag="b")  # never times out
    c = pending(2, deadline_ns=2_000, tag="c")
    for p in (a, b, c):
        pol.enqueue(p)
    assert pol.next_deadline_ns() == 500
    assert pol.expire(499) == []
    assert pol.expire(1_000) == [a]
    assert len(pol) == 2
    assert pol.next_deadline_ns() == 2_000
    assert pol.expire(2_000) == [c]
    assert pol.next_deadline_ns() is None
    assert tags(pol.peek(1 + WINDOW_NS).batch) == ["b"]


def test_expire_delay_moves_requests_behind_undelayed_ones() -> None:
    pol = policy(max_batch_size=8, priority_levels=2, default_priority_level=1)
    late = pending(0, level=1, deadline_ns=500, action=TimeoutAction.DELAY, tag="late")
    pol.enqueue(late)
    pol.enqueue(pending(1, level=1, tag="high"))
    pol.enqueue(pending(2, level=2, tag="low"))
    assert pol.expire(1_000) == []
    assert len(pol) == 3  # delayed, not dropped
    assert pol.next_deadline_ns() is None  # a delayed request does not time out again
    assert tags(pol.peek(1_000).batch) == ["high", "low", "late"]  # behind every undelayed level


# --------------------------------------------------------------------------------------------- remove / take

def test_remove() -> None:
    pol = policy(max_queue_delay_us=0)
    a, b = pending(0, tag="a"), pending(1, tag="b")
    pol.enqueue(a)
    pol.enqueue(b)
    assert pol.remove(a) is True
    assert pol.remove(a) is False  # already gone
    assert len(pol) == 1
    assert tags(pol.peek(2).batch) == ["b"]


def test_remove_a_delayed_request() -> None:
    pol = policy(max_queue_delay_us=0)
    late = pending(0, deadline_ns=10, action=TimeoutAction.DELAY, tag="late")
    pol.enqueue(late)
    pol.enqueue(pending(1, tag="b"))
    pol.expire(20)
    assert pol.remove(late) is True
    assert len(pol) == 1
    assert tags(pol.peek(20).batch) == ["b"]


def test_remove_after_take_reports_already_dispatched() -> None:
    pol = policy(max_queue_delay_us=0)
    a = pending(0, tag="a")
    pol.enqueue(a)
    pol.take(pol.peek(1).batch)
    assert pol.remove(a) is False
    assert len(pol) == 0


def test_take_removes_a_batch_spanning_levels_and_delayed_requests() -> None:
    pol = policy(max_batch_size=3, priority_levels=2, default_priority_level=1)
    late = pending(0, level=1, deadline_ns=5, action=TimeoutAction.DELAY, tag="late")
    pol.enqueue(late)
    pol.enqueue(pending(1, level=1, tag="h"))
    pol.enqueue(pending(2, level=2, tag="l1"))
    pol.enqueue(pending(3, level=2, tag="l2"))
    pol.expire(10)
    first = pol.peek(10)
    assert tags(first.batch) == ["h", "l1", "l2"]
    pol.take(first.batch)
    assert len(pol) == 1
    second = pol.peek(10)
    assert tags(second.batch) == ["late"]
    pol.take(second.batch)
    assert len(pol) == 0
    assert pol.peek(10).batch == []


def test_each_decision_says_why_the_batch_leaves() -> None:
    window = policy(max_batch_size=4, max_queue_delay_us=100, preferred_batch_sizes=(2,))
    window.enqueue(pending(0))
    assert window.peek(200_000).reason == "window"
    window.enqueue(pending(10))
    assert window.peek(20).reason == "preferred"
    for t in (20, 30):
        window.enqueue(pending(t))
    assert window.peek(40).reason == "full"
    immediate = policy(max_queue_delay_us=0)
    immediate.enqueue(pending(0))
    assert immediate.peek(0).reason == "immediate"


# --------------------------------------------------------------------------------------------- early dispatch

def learned(clients: int, window_us: int = WINDOW_US) -> tuple[BatchPolicy, int]:
    """A policy with early dispatch after three epochs of a closed loop of `clients` (all arrive, run as one
    batch, finish); returns it and the time after the last round."""
    pol = policy(max_batch_size=64, max_queue_delay_us=window_us, early_dispatch=True)
    now = 1
    while now < 3 * EPOCH_NS:
        for i in range(clients):
            pol.enqueue(pending(now + i))
        batch = pol.peek(now + window_us * 1000).batch
        assert len(batch) == clients
        pol.take(batch)
        pol.finished(len(batch))
        now += 2 * window_us * 1000
    return pol, now


def test_a_lone_client_is_dispatched_at_once_once_the_population_is_known() -> None:
    pol, now = learned(1)
    pol.enqueue(pending(now, tag="a"))
    decision = pol.peek(now + 1)  # long before the window ends
    assert tags(decision.batch) == ["a"] and decision.reason == "early"


def test_a_batch_waits_until_every_client_is_in() -> None:
    pol, now = learned(3)
    pol.enqueue(pending(now, tag="a"))
    pol.enqueue(pending(now + 10, tag="b"))
    waiting = pol.peek(now + 20)
    assert waiting.batch == [] and waiting.wait_ns == WINDOW_NS - 20  # one client still to come
    pol.enqueue(pending(now + 30, tag="c"))
    decision = pol.peek(now + 40)
    assert tags(decision.batch) == ["a", "b", "c"] and decision.reason == "early"


def test_executing_requests_count_until_they_finish() -> None:
    pol, now = learned(4)
    for i, tag in enumerate(("a", "b")):
        pol.enqueue(pending(now + i, tag=tag))
    running = pol.peek(now + WINDOW_NS)  # their window ran out: they go, and stay in flight
    pol.take(running.batch)
    pol.enqueue(pending(now + WINDOW_NS + 1, tag="c"))
    pol.enqueue(pending(now + WINDOW_NS + 2, tag="d"))
    assert pol.in_flight == 4
    assert tags(pol.peek(now + WINDOW_NS + 3).batch) == ["c", "d"]  # a and b cannot come back yet
    pol.finished(2)  # a and b answered: their clients may join, so c and d wait again
    assert pol.in_flight == 2
    assert pol.peek(now + WINDOW_NS + 4).batch == []


def test_a_cold_policy_waits_out_the_window() -> None:
    pol = policy(max_batch_size=64, max_queue_delay_us=WINDOW_US, early_dispatch=True)
    pol.enqueue(pending(0, tag="a"))
    assert pol.peek(1).batch == []
    assert tags(pol.peek(WINDOW_NS).batch) == ["a"]


def test_without_early_dispatch_a_known_population_changes_nothing() -> None:
    pol = policy(max_batch_size=64, max_queue_delay_us=WINDOW_US, early_dispatch=False)
    now = 1
    while now < 3 * EPOCH_NS:
        pol.enqueue(pending(now))
        pol.take(pol.peek(now + WINDOW_NS).batch)
        pol.finished(1)
        now += 2 * WINDOW_NS
    pol.enqueue(pending(now, tag="a"))
    assert pol.peek(now + 1).batch == []
    assert pol.forecast is None


# ------------------------------------------------------------------ the window's wait, whatever led to it

def test_window_runs_from_the_oldest_even_when_requests_were_queued_out_of_order() -> None:
    pol = policy(max_queue_delay_us=100)
    pol.enqueue(pending(50_000, tag="b"))
    pol.enqueue(pending(1_000, tag="a"))  # older than the request before it
    assert pol.peek(60_000).wait_ns == 1_000 + 100_000 - 60_000
    assert tags(pol.peek(101_000).batch) == ["b", "a"]


def test_window_moves_to_the_next_oldest_when_the_oldest_leaves() -> None:
    pol = policy(max_queue_delay_us=100)
    first = pending(1_000, tag="a")
    pol.enqueue(first)
    pol.enqueue(pending(30_000, tag="b"))
    assert pol.remove(first)
    assert pol.peek(60_000).wait_ns == 30_000 + 100_000 - 60_000
    decision = pol.peek(130_000)
    assert tags(decision.batch) == ["b"] and decision.reason == "window"


def test_requests_of_several_elements_fill_a_batch_and_a_new_shape_closes_it() -> None:
    pol = policy(max_batch_size=8, max_queue_delay_us=100)
    pol.enqueue(pending(0, batch_size=3, tag="a"))
    pol.enqueue(pending(1, batch_size=4, tag="b"))
    assert pol.peek(10).batch == []  # 7 of 8: waits
    pol.enqueue(pending(2, batch_size=1, tag="c"))
    full = pol.peek(10)
    assert tags(full.batch) == ["a", "b", "c"] and full.reason == "full"
    pol.take(full.batch)
    pol.enqueue(pending(20, tag="d"))
    pol.enqueue(pending(21, shape_key=((5,),), tag="e"))
    closed = pol.peek(30)
    assert tags(closed.batch) == ["d"] and closed.reason == "full"
    pol.take(closed.batch)
    # what is left is one shape again, and waits for its own window
    assert pol.peek(40).wait_ns == 21 + 100_000 - 40


def test_after_timeouts_and_a_drained_queue_the_wait_is_measured_afresh() -> None:
    pol = policy(max_queue_delay_us=100, default_queue_policy=QueuePolicy(default_timeout_us=10))
    stale = pending(0, deadline_ns=10_000, tag="stale")
    pol.enqueue(stale)
    assert tags(pol.expire(10_000)) == ["stale"]
    assert pol.peek(10_000).batch == [] and pol.peek(10_000).wait_ns is None
    pol.enqueue(pending(20_000, tag="x"))
    assert pol.peek(25_000).wait_ns == 20_000 + 100_000 - 25_000
