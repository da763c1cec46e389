"""perf/bench_scaling.py's pure parts: the core lists it pins to, what it expects `--workers auto` to pick,
and the scaling efficiency it reports (the run itself: tests/functional/perf/test_scaling_check.py)."""

from __future__ import annotations

import os

from bench_scaling import Point, auto_workers, efficiencies, parse_cores, table
from engine.cli.parser import default_workers


def test_core_lists_read_as_taskset_reads_them() -> None:
    assert parse_cores("0-7") == frozenset(range(8))
    assert parse_cores("8-15") == frozenset(range(8, 16))
    assert parse_cores("0,2-3,9") == frozenset({0, 2, 3, 9})


def test_auto_is_what_the_server_picks_from_the_same_affinity() -> None:
    assert auto_workers(frozenset(os.sched_getaffinity(0))) == default_workers()
    assert auto_workers(frozenset(range(8))) == 2 and auto_workers(frozenset({0})) == 1


def test_efficiency_is_throughput_over_workers_times_one_process() -> None:
    points = [Point("1", 1, "simple", "grpc", 16, infer_per_s=10_000.0, p99_ms=2.0),
              Point("2", 2, "simple", "grpc", 32, infer_per_s=15_000.0, p99_ms=3.0),
              Point("8", 8, "simple", "grpc", 128, status="unstable", infer_per_s=20_000.0),
              Point("2", 2, "simple", "http", 32, infer_per_s=9_000.0, p99_ms=3.0),  # no 1-process point
              Point("4", 4, "simple", "grpc", 64, status="fail: perf_analyzer exit 99")]
    efficiencies(points)
    assert [p.efficiency for p in points] == [1.0, 0.75, 0.25, None, None]
    lines = table(points)
    assert len(lines) == 1 + len(points)
    assert "—" in lines[3].split()  # no p99 where no window was stable
