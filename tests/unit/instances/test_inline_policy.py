"""Tests of engine/instances/inline_policy.py's `InlinePolicy`: which batch sizes run on the loop, from the
CPU time and wall time each run reports. Plain synchronous tests: no threads, no loop, no backend; the pool
that measures real runs is exercised in test_batcher.py."""

from __future__ import annotations

from engine.instances.inline_policy import (
    INLINE_BELOW_NS,
    INLINE_SAMPLE_CAP_NS,
    INLINE_STRIKE_SHARE,
    INLINE_STRIKES,
    INLINE_WALL_LIMIT_NS,
    InlinePolicy,
)

FAST_NS = INLINE_BELOW_NS // 5
LONG_NS = 2 * INLINE_WALL_LIMIT_NS


def test_nothing_runs_inline_before_a_run_was_measured() -> None:
    policy = InlinePolicy()
    assert not policy.runs_inline(1)


def test_a_fast_run_puts_its_size_and_smaller_ones_inline() -> None:
    policy = InlinePolicy()
    policy.ran_on_thread(3, FAST_NS)
    assert policy.runs_inline(1) and policy.runs_inline(3)
    assert not policy.runs_inline(4)  # never measured: stays on the thread


def test_a_slow_run_keeps_its_size_on_the_thread() -> None:
    policy = InlinePolicy()
    policy.ran_on_thread(1, 5 * INLINE_BELOW_NS)
    assert not policy.runs_inline(1)


def test_an_ineligible_policy_never_runs_inline() -> None:
    """A GPU instance, or a backend that may wait: fast runs change nothing."""
    policy = InlinePolicy(eligible=False)
    for _ in range(10):
        policy.ran_on_thread(1, 0)
    assert not policy.runs_inline(1)


def test_a_long_inline_run_that_gave_up_the_cpu_is_a_strike() -> None:
    """A sleep, a lock or a device wait held the loop: that size goes back to the thread at once."""
    policy = InlinePolicy()
    policy.ran_on_thread(2, FAST_NS)
    policy.ran_inline(2, LONG_NS, FAST_NS, gave_up_cpu=True)
    assert policy.strikes == 1
    assert policy.runs_inline(1) and not policy.runs_inline(2)


def test_a_long_inline_run_that_used_the_cpu_is_a_strike() -> None:
    policy = InlinePolicy()
    policy.ran_on_thread(1, FAST_NS)
    policy.ran_inline(1, LONG_NS, INLINE_WALL_LIMIT_NS, gave_up_cpu=False)
    assert policy.strikes == 1 and not policy.runs_inline(1)


def test_a_long_inline_run_is_a_strike_where_the_os_cannot_say_why() -> None:
    policy = InlinePolicy()
    policy.ran_on_thread(1, FAST_NS)
    policy.ran_inline(1, LONG_NS, FAST_NS, gave_up_cpu=None)
    assert policy.strikes == 1 and not policy.runs_inline(1)


def test_a_long_inline_run_that_was_only_preempted_is_no_strike() -> None:
    """Little CPU and no voluntary switch: another thread had the core; that says nothing of the backend."""
    policy = InlinePolicy()
    policy.ran_on_thread(1, FAST_NS)
    policy.ran_inline(1, LONG_NS, FAST_NS, gave_up_cpu=False)
    assert policy.strikes == 0 and policy.runs_inline(1)


def test_a_short_inline_run_is_a_sample() -> None:
    """A run within the wall limit is never a strike (nobody asks whether it gave up the CPU); its CPU time
    counts like a thread run's, so a size that got slow inline goes back to the thread."""
    policy = InlinePolicy()
    policy.ran_on_thread(1, FAST_NS)
    policy.ran_inline(1, INLINE_WALL_LIMIT_NS, FAST_NS, gave_up_cpu=None)
    assert policy.strikes == 0 and policy.runs_inline(1)
    while policy.runs_inline(1):
        policy.ran_inline(1, INLINE_WALL_LIMIT_NS, INLINE_SAMPLE_CAP_NS, gave_up_cpu=None)
    assert policy.strikes == 0


def test_the_third_strike_ends_inlining_for_good() -> None:
    """A backend that blocks is tried inline again once its thread runs bring the average down (they use
    no CPU); each try is another strike, and the third ends inlining: a GIL wait can strike a fast backend
    now and then, a blocking one strikes every time."""
    policy = InlinePolicy()
    for strike in range(1, INLINE_STRIKES + 1):
        while not policy.runs_inline(1):
            policy.ran_on_thread(1, 0)  # a sleeping backend's thread run: no CPU
        assert policy.inline_elements == 1
        policy.ran_inline(1, LONG_NS, 0, gave_up_cpu=True)
        assert policy.inline_elements == (0 if strike < INLINE_STRIKES else -1)
    for _ in range(100):
        policy.ran_on_thread(1, 0)
    assert policy.inline_elements == -1 and not policy.runs_inline(1)


def _strike_once(policy: InlinePolicy) -> None:
    """Bring size 1 back inline with fast thread runs, then one long inline run that gave up the CPU."""
    while not policy.runs_inline(1):
        policy.ran_on_thread(1, FAST_NS)
    policy.ran_inline(1, LONG_NS, FAST_NS, gave_up_cpu=True)


def test_clean_inline_runs_forgive_strikes() -> None:
    """A fast backend on a machine shared with other work strikes now and then (a GIL wait behind a preempted
    thread), sometimes several times in a few hundred runs: strikes leak away with clean inline runs, so it
    stays inline for good while a strike is more than INLINE_STRIKE_SHARE clean runs apart."""
    policy = InlinePolicy()
    for _ in range(10 * INLINE_STRIKES):
        _strike_once(policy)
        for _ in range(INLINE_STRIKE_SHARE):
            policy.ran_inline(1, FAST_NS, FAST_NS, gave_up_cpu=None)
        assert policy.strikes == 0 and policy.runs_inline(1)


def test_a_backend_that_blocks_often_is_struck_out_despite_clean_runs_between() -> None:
    """Blocking on one inline run in a few is still blocking: strikes outgrow what the clean runs forgive."""
    policy = InlinePolicy()
    for _ in range(10 * INLINE_STRIKES):
        if policy.inline_elements < 0:
            break
        _strike_once(policy)
        for _ in range(INLINE_STRIKE_SHARE // 2):
            if policy.runs_inline(1):
                policy.ran_inline(1, FAST_NS, FAST_NS, gave_up_cpu=None)
    assert policy.inline_elements == -1 and not policy.runs_inline(1)


def test_one_slow_run_does_not_move_a_batch_size_off_the_loop_but_a_slow_backend_does() -> None:
    """The inline decision follows a running average of CPU time per batch size: one outlier (a page fault,
    a cold cache) counts at most INLINE_SAMPLE_CAP_NS and leaves the size inline; runs that stay slow move it
    to the thread within a few samples, and larger batches with it."""
    policy = InlinePolicy()
    for elements in (1, 2, 3):
        policy.ran_on_thread(elements, FAST_NS)
    assert policy.inline_elements == 3
    policy.ran_on_thread(2, 100 * INLINE_BELOW_NS)
    assert policy.inline_elements == 3
    slow = 0
    while policy.inline_elements == 3:
        policy.ran_on_thread(2, 5 * INLINE_BELOW_NS)
        slow += 1
    assert 1 < slow < 10
    assert policy.inline_elements == 1  # 2 and 3 on the thread; 1 still measured fast
    for _ in range(20):
        policy.ran_on_thread(2, FAST_NS)  # fast again: back inline
    assert policy.inline_elements == 2
