"""Graceful shutdown: SIGTERM while requests are in flight lets every one of them finish with correct data,
then the process exits 0.

The server under test is our own process, serving one slow identity-backend model (each execution sleeps
300 ms), so the requests are provably still in flight when the signal arrives: we wait until the server's own
`nv_inference_pending_request_count` gauge counts all of them before sending it.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import RunningServer, start_server

SLOW_MODEL = "slow_identity"
EXECUTE_DELAY_MS = 300
HTTP_REQUESTS = 6
GRPC_REQUESTS = 2

SLOW_CONFIG = f"""
name: "{SLOW_MODEL}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{EXECUTE_DELAY_MS}" }} }}
"""


def build_slow_repository(root: Path) -> Path:
    """One identity-backend model; the identity backend needs no model file, only a version folder."""
    model = root / SLOW_MODEL
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(SLOW_CONFIG)
    return root


def pending_requests(server: RunningServer) -> int:
    with urllib.request.urlopen(server.metrics_url, timeout=5) as r:
        text = r.read().decode()
    pattern = rf'^nv_inference_pending_request_count\{{model="{SLOW_MODEL}",version="1"\}} (\d+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no pending-request gauge for {SLOW_MODEL} in /metrics:\n{text}"
    return int(match.group(1))


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def http_infer(url: str, data: np.ndarray) -> np.ndarray:
    with httpclient.InferenceServerClient(url, network_timeout=60.0) as client:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        result = client.infer(SLOW_MODEL, [tensor])
        return result.as_numpy("OUTPUT0")


def grpc_infer(url: str, data: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(SLOW_MODEL, [tensor], client_timeout=60.0)
        return result.as_numpy("OUTPUT0")


def test_sigterm_finishes_in_flight_requests_then_exits_zero(tmp_path: Path) -> None:
    server = start_server(build_slow_repository(tmp_path / "repository"), tmp_path / "server.log",
                          "--model-control-mode", "none")
    try:
        calls = ([(http_infer, server.http_url)] * HTTP_REQUESTS
                 + [(grpc_infer, server.grpc_url)] * GRPC_REQUESTS)
        sent = [np.arange(4, dtype=np.float32).reshape(1, 4) + 10 * i for i in range(len(calls))]
        results: list[np.ndarray | None] = [None] * len(calls)
        errors: list[BaseException | None] = [None] * len(calls)

        def worker(i: int) -> None:
            infer, url = calls[i]
            try:
                results[i] = infer(url, sent[i])
            except BaseException as e:  # reported by the main thread
                errors[i] = e

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
        for t in threads:
            t.start()
        # Without dynamic batching each request is its own 300 ms execution, so they queue behind each other.
        wait_for(lambda: pending_requests(server) == len(calls), 30.0, f"{len(calls)} requests in flight")

        server.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60.0)
        assert not any(t.is_alive() for t in threads), "a request never completed after SIGTERM"
        returncode = server.process.wait(60.0)

        failures = [f"request {i}: {e!r}" for i, e in enumerate(errors) if e is not None]
        assert not failures, "in-flight requests failed during shutdown:\n" + "\n".join(failures) + \
            f"\nserver log:\n{server.log()}"
        for i, (want, got) in enumerate(zip(sent, results, strict=True)):
            assert got is not None and got.dtype == np.float32, f"request {i}: {got!r}"
            np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
        assert returncode == 0, f"server exited with {returncode}:\n{server.log()}"
    finally:
        server.stop()
