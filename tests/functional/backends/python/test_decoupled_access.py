"""A decoupled Python model's access line (engine/observability/request_life.py): its queue time, and a
compute time that lasts until its final response (the model streams after execute returned), against a
real server on the example `repeat_stream` over gRPC ModelStreamInfer."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import RunningServer, start_server, wait_until
from hubserve_harness import EXAMPLES
from test_observability import access_lines


@pytest.fixture(scope="module")
def access_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decoupled_logs") / "hubserve.log"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, access_log: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("decoupled_access")
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    srv = start_server(repo, tmp_path_factory.mktemp("decoupled_access_log") / "server.log",
                       "--log-verbose", "1", "--log-format", "json", "--log-file", str(access_log))
    yield srv
    srv.stop()


def test_a_decoupled_request_has_its_queue_and_compute_time(server: RunningServer, access_log: Path) -> None:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        values = grpcclient.InferInput("IN", [3], "INT32")
        values.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
        delay = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
        delay.set_data_from_numpy(np.array([20], dtype=np.uint32))
        client.async_stream_infer("repeat_stream", [values, delay], request_id="dec-line-1")
        got = [results.get(timeout=30) for _ in range(3)]
        assert all(error is None for _, error in got)
    finally:
        client.stop_stream()
        client.close()
    line = wait_until(lambda: next((d for d in access_lines(access_log) if d["request_id"] == "dec-line-1"),
                                   None), "the access line of dec-line-1")
    assert line["model"] == "repeat_stream" and line["status"] == "OK" and line["batch_size"] == 1, line
    assert line["compute_us"] >= 3 * 20_000, line  # three sends, each after a 20 ms pause
    assert line["queue_us"] >= 0 and line["queue_us"] + line["compute_us"] <= line["total_us"], line
