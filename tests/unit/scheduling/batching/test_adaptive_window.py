"""The SLO-driven window as a pure object: synthetic arrivals and executions in, a window out."""

from engine.scheduling.batching.adaptive_window import AdaptiveWindow

MS = 1_000_000


def feed(w: AdaptiveWindow, gap_ns: int, fixed_ns: int, per_item_ns: int, sizes=(1, 2, 4, 8, 16)) -> None:
    now = 1
    for _ in range(200):
        now += gap_ns
        w.on_arrival(now)
    for _ in range(20):
        for n in sizes:
            w.on_execution(n, fixed_ns + per_item_ns * n)


def test_no_measurements_means_no_window():
    w = AdaptiveWindow(10 * MS, 32)
    assert w.window_ns == 0


def test_fit_recovers_a_linear_execution_time():
    w = AdaptiveWindow(50 * MS, 64)
    feed(w, gap_ns=MS // 5, fixed_ns=MS, per_item_ns=MS // 2)
    assert abs(w.exec_time_ns(10) - 6 * MS) < 0.05 * MS
    assert abs(w.exec_time_ns(40) - 21 * MS) < 0.2 * MS  # extrapolated past the sizes seen


def test_window_is_the_largest_that_meets_the_budget():
    w = AdaptiveWindow(20 * MS, 64)
    feed(w, gap_ns=MS // 5, fixed_ns=MS, per_item_ns=MS // 2)
    budget = w.k * w.target_ns
    assert 0 < w.window_ns < w.target_ns
    assert w.predicted_ns(w.window_ns) <= budget
    assert w.predicted_ns(w.window_ns + 0.02 * MS) > budget


def test_window_never_exceeds_the_time_to_fill_a_maximal_batch():
    w = AdaptiveWindow(100 * MS, 8)
    feed(w, gap_ns=MS // 10, fixed_ns=MS // 10, per_item_ns=MS // 100)
    assert w.window_ns <= 7 * (MS // 10) + 1


def test_a_model_too_slow_for_the_target_gets_no_window():
    w = AdaptiveWindow(5 * MS, 32)
    feed(w, gap_ns=MS, fixed_ns=4 * MS, per_item_ns=MS)
    assert w.window_ns == 0


def test_feedback_shrinks_the_window_when_p95_is_over_target_and_regrows_it():
    w = AdaptiveWindow(20 * MS, 64)
    feed(w, gap_ns=MS // 5, fixed_ns=MS, per_item_ns=MS // 2)
    before, k_before = w.window_ns, w.k
    for _ in range(64 * 3):
        w.on_latency(30 * MS)
    assert w.k < k_before and w.window_ns < before
    shrunk = w.window_ns
    for _ in range(64 * 20):
        w.on_latency(5 * MS)
    assert w.window_ns > shrunk
    assert w.k <= 1.0


def test_a_batcher_with_a_p95_target_opens_a_window_and_batches():
    """Through a real Model: 16 closed-loop clients against a backend whose cost grows with the batch."""
    import asyncio

    import numpy as np

    from test_batcher import data, model_config, output, request, started

    config = model_config("dynamic_batching { }", max_batch_size=16, execute_delay_ms="2",
                          execute_delay_ms_per_item="0.2", p95_latency_target_ms="40")

    async def main() -> None:
        model = await started(config)

        async def client(c: int) -> None:
            for i in range(25):
                value = c * 1000 + i
                response = await model.infer(request(model, data(value)))
                np.testing.assert_array_equal(output(response), data(value))

        try:
            await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(16))), 30)
        finally:
            await model.stop()
        assert model.batcher.adaptive is not None
        assert model.batcher.adaptive.window_ns > 0
        assert model.stats.execution_count < model.stats.inference_count / 2

    asyncio.run(main())


def test_with_a_p95_target_a_full_round_leaves_without_waiting_out_the_window():
    """Issue 13, point 6: the window bounds the wait; once all 16 closed-loop clients are in, the batch goes
    (early dispatch) instead of idling the instance for the rest of the window."""
    import asyncio

    from test_batcher import closed_loop_until_early, model_config, started

    # max_batch_size 32: 16 requests never fill a batch, so only the window or early dispatch sends one.
    config = model_config("dynamic_batching { }", max_batch_size=32, execute_delay_ms="2",
                          execute_delay_ms_per_item="0.2", p95_latency_target_ms="40")

    async def main() -> None:
        model = await started(config)
        try:
            await asyncio.wait_for(closed_loop_until_early(model, 16, 10), 30)
        finally:
            await model.stop()
        assert model.batcher.adaptive is not None and model.batcher.adaptive.window_ns > 0
        assert model.stats.batches[16].compute_infer.count >= 10  # the early batches held everyone

    asyncio.run(main())


def test_the_target_is_validated():
    import pytest

    from engine.errors import EngineError
    from test_batcher import model_config

    with pytest.raises(EngineError, match="positive number"):
        model_config("dynamic_batching { }", p95_latency_target_ms="soon")
    with pytest.raises(EngineError, match="add dynamic_batching"):
        model_config("", p95_latency_target_ms="10")
