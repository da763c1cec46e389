"""Tests of engine/scheduling/batching/join_forecast.py's `JoinForecast`: plain functions, a fake clock in
nanoseconds."""

from __future__ import annotations

from engine.scheduling.batching.join_forecast import EPOCH_NS, RARE, JoinForecast

WINDOW_NS = 1_000_000  # a 1 ms window
STEP_NS = 2_000_000  # one round of a closed loop


def closed_loop(forecast: JoinForecast, clients: int, start_ns: int, epochs: float) -> int:
    """`clients` requests arrive together every STEP_NS (in flight 1..clients), for `epochs` epochs; returns
    the time after the last round."""
    now = start_ns
    while now < start_ns + epochs * EPOCH_NS:
        for i in range(clients):
            forecast.on_arrival(now + i, i + 1, WINDOW_NS)
        now += STEP_NS
    return now


def test_a_cold_forecast_knows_no_population_and_never_cuts_a_window_short() -> None:
    forecast = JoinForecast()
    closed_loop(forecast, 4, 1, 1.5)  # one complete epoch only
    assert forecast.population == 0
    assert not forecast.none_can_join(WINDOW_NS, 4)


def test_two_epochs_with_the_same_peak_give_the_population() -> None:
    forecast = JoinForecast()
    now = closed_loop(forecast, 4, 1, 2.5)
    forecast.on_arrival(now, 1, WINDOW_NS)  # still in the third epoch: the last two complete agree
    assert forecast.population == 4
    assert forecast.none_can_join(WINDOW_NS, 4)  # everybody is in: nobody can join
    assert not forecast.none_can_join(WINDOW_NS, 3)  # one client is still to come
    assert not forecast.none_can_join(WINDOW_NS, 5)  # more than the population: it is growing, not known


def test_a_population_still_moving_is_not_known() -> None:
    forecast = JoinForecast()
    now = closed_loop(forecast, 2, 1, 1.0)
    now = closed_loop(forecast, 8, now, 1.0)  # grew from 2 to 8
    closed_loop(forecast, 8, now, 0.5)
    assert forecast.population == 0
    assert not forecast.none_can_join(WINDOW_NS, 2)


def test_a_population_that_shrinks_is_learned_within_three_epochs() -> None:
    forecast = JoinForecast()
    now = closed_loop(forecast, 16, 1, 3.0)
    assert forecast.population == 16
    closed_loop(forecast, 1, now, 3.2)
    assert forecast.population == 1
    assert forecast.none_can_join(WINDOW_NS, 1)


def test_an_idle_spell_forgets_the_population() -> None:
    forecast = JoinForecast()
    now = closed_loop(forecast, 4, 1, 3.0)
    assert forecast.population == 4
    forecast.on_arrival(now + 3 * EPOCH_NS, 1, WINDOW_NS)  # two whole epochs with no arrival
    assert forecast.population == 0


def test_sparse_arrivals_do_not_wait_and_dense_ones_do() -> None:
    sparse = JoinForecast()
    gap = int(2 * WINDOW_NS / RARE)  # every window far shorter than RARE mean gaps
    for i in range(1, 18):
        sparse.on_arrival(i * gap, 1, WINDOW_NS)
        if i <= 16:
            assert not sparse.none_can_join(WINDOW_NS, 1), "the first gaps of a run do not count yet"
    assert sparse.none_can_join(WINDOW_NS, 1)

    dense = JoinForecast()
    for i in range(1, 40):
        dense.on_arrival(i * WINDOW_NS // 2, 1, WINDOW_NS)
    assert not dense.none_can_join(WINDOW_NS, 1)


def test_one_long_idle_gap_does_not_make_dense_traffic_look_sparse() -> None:
    forecast = JoinForecast()
    now = 1
    for _ in range(40):
        now += WINDOW_NS // 2
        forecast.on_arrival(now, 1, WINDOW_NS)
    now += 100 * EPOCH_NS  # a long pause, then the burst goes on
    forecast.on_arrival(now, 1, WINDOW_NS)
    assert not forecast.none_can_join(WINDOW_NS, 1)
