"""`hubserve_inference_queued_requests`: the requests waiting in a version's scheduler queue, without the ones
executing, which `nv_inference_pending_request_count` adds. The CPU and GPU overlays' autoscaler scales on it
(deploy/kubernetes/hpa.yaml), so it must not count capacity in use as capacity missing.

The model is a Python model with one instance whose `execute` holds until the test opens a gate (a file in
the repository): with four requests sent, one is provably executing and three provably waiting, with no
timing involved.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import RunningServer, start_server, wait_until
from python_models import io, write_model

QUEUED = "hubserve_inference_queued_requests"
PENDING = "nv_inference_pending_request_count"
REQUESTS = 4

# Notes each execution's start in started.txt, then holds until the file `open` exists (bounded: a test that
# forgets the gate fails its requests instead of hanging the server).
GATED = '''
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.root = args["model_repository"]

    def execute(self, requests):
        with open(os.path.join(self.root, "started.txt"), "a") as f:
            f.write(f"{len(requests)}\\n")
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(self.root, "open")):
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException("the test never opened the gate")
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(
            r, "IN").as_numpy())]) for r in requests]
'''
GATED_CONFIG = io([("IN", "TYPE_FP32", "1")], [("OUT", "TYPE_FP32", "1")],
                  "instance_group [ { count: 1 kind: KIND_CPU } ]\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("queued_repository")
    folder = write_model(repo, "gated", GATED, GATED_CONFIG)
    server = start_server(repo, tmp_path_factory.mktemp("queued_server") / "server.log", ready_timeout=120)
    yield server, folder
    server.stop()


def infer(server: RunningServer, value: float) -> float:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], np.float32))
        return float(c.infer("gated", [tensor]).as_numpy("OUT")[0])


def executions_started(folder: Path) -> int:
    started = folder / "started.txt"
    return len(started.read_text().split()) if started.exists() else 0


def test_queued_gauge_counts_the_waiting_not_the_executing(served):
    server, folder = served
    assert server.metric_values([QUEUED, PENDING], "gated") == {QUEUED: 0, PENDING: 0}
    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = [pool.submit(infer, server, float(i)) for i in range(REQUESTS)]
        wait_until(lambda: executions_started(folder) == 1 and server.metric(PENDING, "gated") == REQUESTS,
                   "one request executing (held at the gate) and every request accepted")
        held = server.metric_values([QUEUED, PENDING], "gated")
        (folder / "open").touch()
        assert sorted(a.result(timeout=60) for a in answers) == [float(i) for i in range(REQUESTS)]
    # One read of /metrics: the pending gauge counts the executing request, the queued gauge does not.
    assert held == {QUEUED: REQUESTS - 1, PENDING: REQUESTS}
    wait_until(lambda: server.metric_values([QUEUED, PENDING], "gated") == {QUEUED: 0, PENDING: 0},
               "nothing queued or pending once every request is answered")
    assert executions_started(folder) == REQUESTS
