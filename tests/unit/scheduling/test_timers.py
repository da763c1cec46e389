"""PreciseTimer and FdTimer: order, cancellation, and shutdown (no wall-clock thresholds: only what happened,
in order)."""

import asyncio
import os

import pytest

from engine.scheduling.timers import FdTimer, PreciseTimer


def test_callbacks_fire_on_the_loop_in_deadline_order_and_cancelled_ones_never_fire():
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        done = loop.create_future()
        timer = PreciseTimer(loop, "test")
        try:
            timer.call_later(0.0009, lambda: fired.append("c") or done.set_result(None))
            timer.call_later(0.0003, lambda: fired.append("a"))
            cancelled = timer.call_later(0.0001, lambda: fired.append("never"))
            timer.call_later(0.0006, lambda: fired.append("b"))
            timer.cancel(cancelled)
            await asyncio.wait_for(done, 10)
        finally:
            timer.close()
        return fired

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_closed_timer_fires_nothing_more():
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        timer = PreciseTimer(loop, "test")
        timer.call_later(0.05, lambda: fired.append("late"))
        timer.close()
        await asyncio.sleep(0.1)
        return fired

    assert asyncio.run(main()) == []


def _loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


def _run(kind: str, coro_fn):
    if kind == "uvloop":
        import uvloop
        return uvloop.run(coro_fn())
    return asyncio.run(coro_fn())


@pytest.mark.skipif(not FdTimer.available(), reason="timerfd is Linux-only")
@pytest.mark.parametrize("kind", _loops())
def test_fd_timer_fires_once_on_the_loop_and_a_rearm_replaces_the_deadline(kind):
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        done = loop.create_future()

        def on_fire() -> None:
            fired.append("fired")
            if not done.done():
                done.set_result(None)

        timer = FdTimer(loop, on_fire)
        try:
            timer.arm(30.0)  # replaced by the next arm: would never fire within the test
            timer.arm(0.0005)
            await asyncio.wait_for(done, 10)
            # one-shot: nothing more fires after a loop round or two
            await asyncio.sleep(0.01)
            timer.arm(0.0002)
            timer.disarm()
            await asyncio.sleep(0.01)
        finally:
            timer.close()
        return fired

    assert _run(kind, main) == ["fired"]


@pytest.mark.skipif(not FdTimer.available(), reason="timerfd is Linux-only")
def test_a_closed_fd_timer_fires_nothing_and_frees_its_descriptor():
    async def main() -> tuple[list[str], int, int]:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        before = len(os.listdir("/proc/self/fd"))
        timer = FdTimer(loop, lambda: fired.append("late"))
        timer.arm(0.001)
        timer.close()
        timer.close()  # twice is harmless
        await asyncio.sleep(0.05)
        return fired, before, len(os.listdir("/proc/self/fd"))

    fired, before, after = asyncio.run(main())
    assert fired == []
    assert after == before
