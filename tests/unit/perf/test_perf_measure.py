"""The load tester's pure parts: percentiles, the stability rule, merging windows, the CSV row, ranges and
how a plan is split between worker processes. Plain functions, no server."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from hubserve_perf.cli import parse_range
from hubserve_perf.measure import MeasureSettings, Window, is_stable, nearest_rank, summarize
from hubserve_perf.report import csv_header, csv_row
from hubserve_perf.types import Distribution, LoadPlan, Records, ServerStats
from hubserve_perf.workers import split_plan


def records(latencies_us: list[int], start_ns: int = 0) -> Records:
    lat = np.array(latencies_us, dtype=np.int64) * 1000
    starts = np.full(len(lat), start_ns, dtype=np.int64)
    return Records(starts, starts + lat, np.full(len(lat), 2000, np.int64), np.full(len(lat), 3000, np.int64))


def window(count: int, latency_us: int = 1000, server: ServerStats | None = None) -> Window:
    return Window(1_000_000_000, records([latency_us] * count), server or ServerStats(), 0, 0)


def test_nearest_rank_is_perf_analyzers_index() -> None:
    values = np.arange(1, 101)  # 1..100
    assert nearest_rank(values, 50) == 51  # index round(0.5 * 99) = 50
    assert nearest_rank(values, 99) == 99
    assert nearest_rank(np.array([7]), 95) == 7


def test_stable_needs_three_windows_within_the_ratio() -> None:
    settings = MeasureSettings(stability_percentage=10)
    assert not is_stable([window(100), window(100)], settings)
    assert is_stable([window(100), window(105), window(109)], settings)
    assert not is_stable([window(100), window(105), window(111)], settings)  # 111/100 > 1.1
    assert not is_stable([window(100), window(100), window(100, latency_us=1200)], settings)
    assert not is_stable([window(100), window(100), window(0)], settings)


def test_stability_on_a_percentile() -> None:
    settings = MeasureSettings(stability_percentage=10, percentile=99)
    steady = Window(1_000_000_000, records([1000] * 99 + [5000]), ServerStats(), 0, 0)
    assert is_stable([steady, steady, steady], settings)
    assert settings.percentiles == (50, 90, 95, 99)
    assert MeasureSettings(percentile=75).percentiles == (50, 75, 90, 95, 99)


def test_summary_merges_the_last_three_windows() -> None:
    server = ServerStats(success_count=100, queue_ns=100 * 50_000, compute_infer_ns=100 * 200_000,
                         inference_count=100, execution_count=25, executions_by_batch_size=((4, 25),))
    windows = [window(999, 9000), window(100, 1000, server), window(100, 1000, server),
               window(100, 1000, server)]
    settings = MeasureSettings(batch_size=2)
    step = summarize(LoadPlan(concurrency=4), windows, True, settings)
    assert step.request_count == 300
    assert step.throughput == pytest.approx(200.0)  # 300 requests x batch 2 over 3 s
    assert step.percentiles_ns[50] == 1_000_000
    assert step.server.success_count == 300
    assert step.server.executions_by_batch_size == ((4, 75),)
    assert step.window_throughputs[0] == pytest.approx(1998.0)


def test_csv_row_has_perf_analyzers_columns_and_arithmetic() -> None:
    server = ServerStats(success_count=10, queue_ns=10 * 100_000, compute_input_ns=10 * 10_000,
                         compute_infer_ns=10 * 200_000, compute_output_ns=10 * 20_000)
    settings = MeasureSettings()
    step = summarize(LoadPlan(concurrency=2), [window(10, 1000, server)] * 3, True, settings)
    row = dict(zip(csv_header(False, settings), csv_row(step, settings), strict=True))
    assert row["Concurrency"] == "2"
    assert row["Inferences/Second"] == "10"
    # latency 1000 us = send 2 + recv 3 + wait 995; wait = queue 100 + compute 230 + network 665
    assert (row["Client Send"], row["Client Recv"], row["Server Queue"]) == ("2", "3", "100")
    assert row["Network+Server Send/Recv"] == "665"
    assert (row["Avg latency"], row["request/response"], row["response wait"]) == ("1000", "5", "995")
    assert csv_header(True, settings)[0] == "Request Rate"


def test_server_stats_difference() -> None:
    before = ServerStats(success_count=5, executions_by_batch_size=((1, 3), (2, 1)))
    after = ServerStats(success_count=9, executions_by_batch_size=((1, 3), (2, 2), (4, 1)))
    delta = after - before
    assert delta.success_count == 4
    assert delta.executions_by_batch_size == ((2, 1), (4, 1))


def test_ranges() -> None:
    assert parse_range("4").values() == [4]
    assert parse_range("1:4:2").values() == [1, 3]
    assert parse_range("100:300:100").values() == [100, 200, 300]
    for bad in ("0", "4:2", "1:2:0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_range(bad)


def test_plans_split_between_workers() -> None:
    assert [p.concurrency for p in split_plan(LoadPlan(concurrency=5), 2)] == [3, 2]
    rates = split_plan(LoadPlan(request_rate=300, distribution=Distribution.POISSON), 3)
    assert [p.request_rate for p in rates] == [100, 100, 100]
    assert len({p.seed for p in rates}) == 3
    assert [p.phase for p in rates] == pytest.approx([0, 1 / 3, 2 / 3])


@pytest.mark.parametrize("workers,cpu_s_per_window,warned",
                         [(1, 0.95, True), (1, 0.5, False), (2, 1.5, False), (2, 1.9, True)])
def test_a_saturated_load_process_warns_that_it_set_the_pace(
        capsys: pytest.CaptureFixture[str], workers: int, cpu_s_per_window: float, warned: bool) -> None:
    from hubserve_perf.session import Session

    busy = [Window(1_000_000_000, records([1000] * 10), ServerStats(), 0, int(cpu_s_per_window * 1e9))] * 3
    step = summarize(LoadPlan(concurrency=8), busy, True, MeasureSettings())
    session = Session(argparse.Namespace(), None, "", 0, None, None, MeasureSettings(), None, workers)  # type: ignore[arg-type]
    session.warn_if_client_bound(step)
    err = capsys.readouterr().err
    assert ("set the pace" in err) is warned
    if warned:
        assert f"busy {round(100 * cpu_s_per_window / workers)} %" in err
