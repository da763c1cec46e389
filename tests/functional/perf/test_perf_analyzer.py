"""NVIDIA's real perf_analyzer against our server, on `simple`: gRPC and HTTP, sync and `--async`, and a batch
of 2. Each run is one short fixed-concurrency measurement (see `perf_analyzer.DEFAULT_ARGS`); passing means
perf_analyzer accepted every answer of ours (exit 0) and measured a throughput.

perf_analyzer is part of the test tools: when it is missing these tests fail, they do not skip.
"""

from __future__ import annotations

import pytest

from hubserve_harness.perf_analyzer import (
    PERF_ANALYZER,
    perf_analyzer_available,
    run_perf_analyzer_settled,
)

MODEL = "simple"
CONCURRENCY = "2"


def require_perf_analyzer() -> None:
    if not perf_analyzer_available():
        pytest.fail(f"perf_analyzer is not installed at {PERF_ANALYZER}: run `make perf-analyzer`",
                    pytrace=False)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("mode", ["sync", "async", "batch2"])
def test_perf_analyzer_measures_simple(server, protocol: str, mode: str) -> None:
    require_perf_analyzer()
    url = server.grpc_url if protocol == "grpc" else server.http_url
    extra = ["--concurrency-range", CONCURRENCY]
    if mode == "async":
        extra.append("--async")
    elif mode == "batch2":
        extra += ["-b", "2"]
    result = run_perf_analyzer_settled(MODEL, url, protocol, *extra, timeout_s=60)
    if not result.ok or result.throughput <= 0:
        print(" ".join(result.command))
        print(result.output)
    assert result.returncode == 0, (f"perf_analyzer exited with {result.returncode}\n"
                                    f"command: {' '.join(result.command)}\n{result.output}")
    assert result.throughput > 0, f"no throughput in perf_analyzer's report:\n{result.output}"
