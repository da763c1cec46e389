"""PreciseTimer: order, cancellation, and shutdown (no wall-clock thresholds: only what happened, in
order)."""

import asyncio

from engine.timers import PreciseTimer


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
