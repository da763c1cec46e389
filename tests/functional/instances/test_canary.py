"""Canary readiness (engine/instances/canary.py): periodic synthetic inferences that turn a version not-ready
when it stops answering, and ready again when it answers.

The policy (`verdict`, `sample`) is tested on its own; the rest against the real server with canaries every
0.2 s: a Python model that hangs while a flag file exists (a hung instance), one that raises while a flag file
exists (a model that broke, with and without the operator's warm-up data), and the ONNX `simple`, whose
statistics must not count canaries. Each wait is for a condition, bounded.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import start_server, wait_until
from engine.config import steps as config_module
from engine.errors import EngineError, ErrorCode
from engine.instances.canary import sample, verdict
from engine.proto import model_config_pb2 as pb
from python_models import add_simple, write_model

# Hangs in execute while <model dir>/hang exists; raises while <model dir>/fail exists; else doubles IN.
FLAGGED = '''
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        while os.path.exists(os.path.join(self.folder, "hang")):
            time.sleep(0.01)
        if os.path.exists(os.path.join(self.folder, "fail")):
            raise pb_utils.TritonModelException("the weights went bad")
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
'''
IO = '''max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
WARMUP = '''model_warmup [ { name: "ones" batch_size: 1
  inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]
'''
CANARY = ("--canary-interval-secs", "0.2", "--canary-timeout-secs", "0.5")


def _config(text: str):
    msg = pb.ModelConfig()
    config_module.parse_pbtxt(text, msg)
    return config_module.validate(msg, "config.pbtxt")


def test_generated_inputs_follow_the_signature() -> None:
    cfg = _config('name: "m" backend: "onnxruntime" max_batch_size: 4\n'
                  'input [ { name: "A" data_type: TYPE_INT64 dims: [ -1, 3 ] },'
                  ' { name: "S" data_type: TYPE_STRING dims: [ 2 ] },'
                  ' { name: "O" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]\n'
                  'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    picked = sample(cfg, Path("/nonexistent"))
    assert not picked.strict and set(picked.inputs) == {"A", "S"}  # optional inputs are left out
    assert picked.inputs["A"].shape == (1, 1, 3) and picked.inputs["A"].dtype == np.int64
    assert picked.inputs["S"].shape == (1, 2) and picked.inputs["S"][0, 0] == b"0"


def test_warm_up_data_is_preferred_and_strict(tmp_path: Path) -> None:
    cfg = _config('name: "m" backend: "onnxruntime"\n' + IO + WARMUP)
    picked = sample(cfg, tmp_path)
    assert picked.strict and picked.inputs["IN"].shape == (1, 4)


def test_verdict_policy() -> None:
    model_error = EngineError(ErrorCode.INTERNAL, "bad input")
    down = EngineError(ErrorCode.UNAVAILABLE, "instance died")
    assert verdict(None, strict=True) == "" and verdict(None, strict=False) == ""
    # Generated inputs may mean nothing to the model: its own error still shows a live path.
    assert verdict(model_error, strict=False) == ""
    assert verdict(down, strict=False) == "instance died"
    # With the operator's warm-up data every error counts.
    assert verdict(model_error, strict=True) == "bad input"
    assert verdict(ValueError("x"), strict=True) == "ValueError: x"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metric(server, name: str, model: str) -> float | None:
    _, text = _get(server.metrics_url)
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}",'):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("canary_repository")
    write_model(repo, "hangs", FLAGGED, IO)
    write_model(repo, "raises", FLAGGED, IO)
    write_model(repo, "raises_warm", FLAGGED, IO + WARMUP)
    add_simple(repo)
    srv = start_server(repo, tmp_path_factory.mktemp("canary_server") / "server.log", *CANARY,
                       ready_timeout=120)
    yield srv
    srv.stop()


def _ready(server, model: str) -> tuple[int, str]:
    return _get(f"http://{server.http_url}/v2/models/{model}/ready")


def _index(server, model: str) -> dict:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}",
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        return next(row for row in json.loads(r.read()) if row["name"] == model)


def test_a_hung_instance_turns_the_version_not_ready_and_back(server) -> None:
    folder = server.repository / "hangs"
    wait_until(lambda: _metric(server, "hubserve_model_canary_healthy", "hangs") == 1,
               "a first passing canary")
    (folder / "hang").touch()
    try:
        status, body = wait_until(lambda: (r := _ready(server, "hangs"))[0] != 200 and r, "not ready")
        assert status == 503 and "canary failed" in body and "has not answered" in body, body
        row = _index(server, "hangs")
        assert row["state"] == "UNAVAILABLE" and "canary failed" in row["reason"], row
        assert _metric(server, "hubserve_model_canary_healthy", "hangs") == 0
        assert _get(f"http://{server.http_url}/v2/health/ready")[0] != 200  # strict readiness follows
        assert _ready(server, "simple")[0] == 200  # the other models are unaffected
        failures = _metric(server, "hubserve_model_canary_failures_total", "hangs")
        assert failures is not None and failures >= 1
    finally:
        (folder / "hang").unlink()
    wait_until(lambda: _ready(server, "hangs")[0] == 200, "ready again")
    wait_until(lambda: _get(f"http://{server.http_url}/v2/health/ready")[0] == 200, "server ready again")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = grpcclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("hangs", [inp]).as_numpy("OUT"), x * 2)


def test_model_errors_on_generated_inputs_do_not_fail_the_canary(server) -> None:
    folder = server.repository / "raises"
    (folder / "fail").touch()
    try:
        before = _metric(server, "hubserve_model_canary_runs_total", "raises") or 0
        wait_until(lambda: (_metric(server, "hubserve_model_canary_runs_total", "raises") or 0) >= before + 3,
              "three canaries")
        assert _ready(server, "raises")[0] == 200
        assert _metric(server, "hubserve_model_canary_healthy", "raises") == 1
    finally:
        (folder / "fail").unlink()


def test_with_warm_up_data_a_model_error_fails_the_canary(server) -> None:
    folder = server.repository / "raises_warm"
    (folder / "fail").touch()
    try:
        status, body = wait_until(lambda: (r := _ready(server, "raises_warm"))[0] != 200 and r, "not ready")
        assert status == 503 and "the weights went bad" in body, body
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as e:
            inp = grpcclient.InferInput("IN", [1, 4], "FP32")
            inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
            client.infer("raises_warm", [inp])
        assert "canary failed" in e.value.message()  # refused while not ready, saying why
    finally:
        (folder / "fail").unlink()
    wait_until(lambda: _ready(server, "raises_warm")[0] == 200, "ready again")


def test_canaries_are_not_counted_in_statistics(server) -> None:
    wait_until(lambda: (_metric(server, "hubserve_model_canary_runs_total", "simple") or 0) >= 3, "canaries")
    _, body = _get(f"http://{server.http_url}/v2/models/simple/stats")
    stats = json.loads(body)["model_stats"][0]
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0, stats
    assert _metric(server, "nv_inference_count", "simple") == 0


def test_a_canary_failed_by_a_killed_instance_is_run_again_once_it_serves(tmp_path: Path) -> None:
    """The first canary (6 s after the start) hangs in the instance, which its execute_timeout_secs kills:
    the canary fails with the kill's reason. Once the restarted instance serves, the version is checked again
    at once and READY, not at the next round 6 s later (the failure judged the process that is gone)."""
    repo = tmp_path / "repo"
    timeout = 'parameters { key: "execute_timeout_secs" value: { string_value: "1" } }\n'
    write_model(repo, "killed", FLAGGED, IO + timeout)
    (repo / "killed" / "hang").touch()
    # explicit: the flag's removal changes the folder, which polling would reload as a new version
    srv = start_server(repo, tmp_path / "server.log", "--canary-interval-secs", "6", "--canary-timeout-secs",
                       "30", "--model-control-mode", "explicit", "--load-model", "killed", ready_timeout=120)
    try:
        status, body = wait_until(lambda: (r := _ready(srv, "killed"))[0] != 200 and r, "the kill",
                                  timeout_s=60)
        killed = time.monotonic()
        assert status == 503 and "execute_timeout_secs" in body, body
        (repo / "killed" / "hang").unlink()
        wait_until(lambda: _metric(srv, "hubserve_model_canary_failures_total", "killed") == 1,
                   "the canary failed by the kill", timeout_s=30)
        wait_until(lambda: _ready(srv, "killed")[0] == 200, "ready again", timeout_s=30)
        assert time.monotonic() - killed < 5, "ready again only at the next round"
        assert _metric(srv, "hubserve_model_canary_runs_total", "killed") == 2  # the first, and the one again
    finally:
        srv.stop()


def test_interval_zero_turns_canaries_off(tmp_path: Path) -> None:
    add_simple(tmp_path / "repo")
    srv = start_server(tmp_path / "repo", tmp_path / "server.log", "--canary-interval-secs", "0")
    try:  # an absence: watched for as long as seven canary intervals of the module's server
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert "hubserve_model_canary" not in _get(srv.metrics_url)[1]
            time.sleep(0.1)
    finally:
        srv.stop()


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_bad_intervals_are_refused(tmp_path: Path, value: str) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--model-repository", str(tmp_path),
                          "--canary-interval-secs", value], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "expected a number of seconds" in out.stderr
