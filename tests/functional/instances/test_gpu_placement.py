"""KIND_GPU placement on a real server without a GPU: HUBSERVE_PRETEND_GPUS=1 with CUDA_VISIBLE_DEVICES=1,3
makes the server place on two GPUs (CUDA numbers 0 and 1) without asking a driver
(engine/instances/devices.py).

- A Python model with `count: 1` on `gpus: [0, 1]` gets one instance per GPU; each instance process gets its
  GPU's `model_instance_kind` / `model_instance_device_id`, and CUDA_VISIBLE_DEVICES as the server has it (as
  Triton's stub does), so `cuda:<device id>` names its GPU. The instances run on the CPU: placement only.
- Each instance needs one copy of rate-limiter resource R and the server has one (`--rate-limit-resource
  R:1`): copies are per device, so both instances execute at once (with one global copy, the second would
  wait). The model holds each execution at a gate (a file) until both have started: no timing involved.
  No canaries: they go to the instances without the limiter, and would run into the gate.
- An ONNX model on a GPU is UNAVAILABLE (ONNX Runtime cannot start CUDA here), not quietly run on the CPU.
- No GPU metrics family on /metrics (no NVML library here), and one info line saying why.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, RunningServer, start_server, wait_until
from python_models import io, write_model

PLACED = '''
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.root = args["model_repository"]
        self.device_id = int(args["model_instance_device_id"])
        keys = ("model_instance_kind", "model_instance_device_id", "model_instance_name")
        seen = {k: args[k] for k in keys}
        seen["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        with open(os.path.join(self.root, args["model_instance_name"] + ".json"), "w") as f:
            json.dump(seen, f)

    def execute(self, requests):
        with open(os.path.join(self.root, "started.txt"), "a") as f:
            f.write(f"start{self.device_id} ")
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(self.root, "open")):
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException("the test never opened the gate")
            time.sleep(0.01)
        with open(os.path.join(self.root, "started.txt"), "a") as f:
            f.write(f"end{self.device_id} ")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DEVICE", np.array([self.device_id], np.int32))])
                for _ in requests]
'''
PLACED_CONFIG = io([("IN", "TYPE_INT32", "1")], [("DEVICE", "TYPE_INT32", "1")], """
instance_group [ { name: "g" kind: KIND_GPU count: 1 gpus: [ 0, 1 ]
                   rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
""")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("gpu_placement_repository")
    folder = write_model(repo, "placed", PLACED, PLACED_CONFIG)
    onnx = repo / "simple_gpu"
    shutil.copytree(EXAMPLES / "simple", onnx, ignore=shutil.ignore_patterns("config.*"))
    config = (EXAMPLES / "simple" / "config.pbtxt").read_text()
    config = config.replace('name: "simple"', 'name: "simple_gpu"')
    assert "kind: KIND_CPU" in config
    (onnx / "config.pbtxt").write_text(config.replace("kind: KIND_CPU", "kind: KIND_GPU"))
    server = start_server(repo, tmp_path_factory.mktemp("gpu_placement_server") / "server.log",
                          "--model-control-mode", "explicit", "--load-model", "placed",
                          "--rate-limit-resource", "R:1", "--canary-interval-secs", "0", ready_timeout=120,
                          env={"HUBSERVE_PRETEND_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1,3"})
    yield server, folder
    server.stop()


def infer(server: RunningServer) -> int:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], np.int32))
        return int(c.infer("placed", [tensor]).as_numpy("DEVICE")[0])


def started(folder: Path) -> list[str]:
    path = folder / "started.txt"
    return path.read_text().split() if path.exists() else []


def test_each_instance_gets_its_gpus_device_id_and_the_servers_visible_devices(served) -> None:
    _, folder = served
    seen = {p.stem: json.loads(p.read_text()) for p in folder.glob("g_*.json")}
    assert seen == {
        "g_0": {"model_instance_kind": "GPU", "model_instance_device_id": "0", "model_instance_name": "g_0",
                "CUDA_VISIBLE_DEVICES": "1,3"},
        "g_1": {"model_instance_kind": "GPU", "model_instance_device_id": "1", "model_instance_name": "g_1",
                "CUDA_VISIBLE_DEVICES": "1,3"},
    }


def test_instances_on_two_gpus_hold_their_own_devices_copy_of_a_resource(served) -> None:
    server, folder = served
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(infer, server) for _ in range(2)]
        # Both executing at once: with R's one copy shared by both GPUs, the second would wait for the first.
        wait_until(lambda: sorted(started(folder)) == ["start0", "start1"],
                   "both instances executing at once")
        (folder / "open").touch()
        assert sorted(a.result(timeout=60) for a in answers) == [0, 1]


def test_an_onnx_model_on_a_gpu_without_the_cuda_provider_is_unavailable(served) -> None:
    server, _ = served
    with httpclient.InferenceServerClient(server.http_url) as c:
        with pytest.raises(InferenceServerException) as caught:
            c.load_model("simple_gpu")
        assert not c.is_model_ready("simple_gpu")
    assert "its instance group asks for CUDAExecutionProvider, but ONNX Runtime could not start it" in \
        str(caught.value), caught.value


def test_no_gpu_metrics_without_nvml_and_one_line_saying_why(served) -> None:
    server, _ = served
    page = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
    assert "nv_inference_request_success" in page
    assert "nv_gpu_" not in page and "nv_energy_consumption" not in page
    assert server.log().count("GPU metrics off") == 1, server.log
    assert "HUBSERVE_PRETEND_GPUS: placing on GPUs [0, 1]" in server.log()
