"""`hubserve_inference_queued_requests`: the requests waiting in a version's scheduler queue, without the ones
executing, which `nv_inference_pending_request_count` adds. The CPU and GPU overlays' autoscaler scales on it
(deploy/kubernetes/hpa.yaml), so it must not count capacity in use as capacity missing.

The models are Python models with one instance whose `execute` holds until the test opens a gate (a file in
the model's folder): with four requests sent, one is provably executing and three provably waiting, with no
timing involved. One model goes through the dynamic batcher's queue, the other through the sequence
batcher's (four sequences for its one slot: three wait in the backlog).
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
SEQUENCE_CONFIG = GATED_CONFIG + "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n"
MODELS = {"gated": GATED_CONFIG, "gated_sequence": SEQUENCE_CONFIG}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("queued_repository")
    folders = {name: write_model(repo, name, GATED, config) for name, config in MODELS.items()}
    server = start_server(repo, tmp_path_factory.mktemp("queued_server") / "server.log", ready_timeout=120)
    yield server, folders
    server.stop()


def infer(server: RunningServer, model: str, value: float) -> float:
    """One request; for the sequence model a whole sequence of its own (START and END), id value + 1."""
    sequence = {"sequence_id": int(value) + 1, "sequence_start": True, "sequence_end": True} \
        if model == "gated_sequence" else {}
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], np.float32))
        return float(c.infer(model, [tensor], **sequence).as_numpy("OUT")[0])


def executions_started(folder: Path) -> int:
    started = folder / "started.txt"
    return len(started.read_text().split()) if started.exists() else 0


@pytest.mark.parametrize("model", MODELS)
def test_queued_gauge_counts_the_waiting_not_the_executing(served, model):
    server, folders = served
    folder = folders[model]
    assert server.metric_values([QUEUED, PENDING], model) == {QUEUED: 0, PENDING: 0}
    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = [pool.submit(infer, server, model, float(i)) for i in range(REQUESTS)]
        wait_until(lambda: executions_started(folder) == 1 and server.metric(PENDING, model) == REQUESTS,
                   "one request executing (held at the gate) and every request accepted")
        held = server.metric_values([QUEUED, PENDING], model)
        (folder / "open").touch()
        assert sorted(a.result(timeout=60) for a in answers) == [float(i) for i in range(REQUESTS)]
    # One read of /metrics: the pending gauge counts the executing request, the queued gauge does not.
    assert held == {QUEUED: REQUESTS - 1, PENDING: REQUESTS}
    wait_until(lambda: server.metric_values([QUEUED, PENDING], model) == {QUEUED: 0, PENDING: 0},
               "nothing queued or pending once every request is answered")
    assert executions_started(folder) == REQUESTS
