"""Where hubserve answers as Triton does (issue 11, the core's half), through Triton's own clients over both
protocols: error wording clients match on, output reshape, metadata platform, readiness of an unknown version,
unsupported configuration and request features refused, the extensions listed.

The server runs in its own process; this file imports `tritonclient.grpc` and none of our generated modules.
Where a point is Triton's wording, the comment names the Triton source it comes from.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from engine import examples

RESHAPED = """name: "reshaped"
backend: "onnxruntime"
max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10, 1, 1 ] } }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10, 1, 1 ] } }
"""
DECOUPLED = 'name: "decoupled"\nbackend: "onnxruntime"\nmax_batch_size: 4\n' \
            "model_transaction_policy { decoupled: true }\n"
CLIENTS = (httpclient, grpcclient)


@pytest.fixture(scope="module")
def parity_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("parity_repository")
    simple = examples.model_bytes(examples.simple_model())
    for name, config in (("simple", 'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'),
                         ("by_backend", 'name: "by_backend"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'),
                         ("no_config", None), ("decoupled", DECOUPLED)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(simple)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
    # The ONNX model answers [batch, 1, 10, 1, 1]; the config says [batch, 10] on both sides.
    examples.write_model(examples.identity_model("FP32", (-1, 1, 10, 1, 1)), root / "reshaped" / "1" / "model.onnx")
    (root / "reshaped" / "config.pbtxt").write_text(RESHAPED)
    log = tmp_path_factory.mktemp("parity_server") / "server.log"
    srv = start_server(root, log, "--no-strict-readiness", "--model-control-mode", "none")
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["http", "grpc"])
def client(request, parity_server):
    module = httpclient if request.param == "http" else grpcclient
    url = parity_server.http_url if request.param == "http" else parity_server.grpc_url
    with module.InferenceServerClient(url) as c:
        c.module = module
        yield c


def simple_inputs(module, batch: int = 1) -> list:
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [batch, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    return inputs


def error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def as_json(client, method: str, *args) -> dict:
    """A metadata call's answer as JSON: the gRPC client needs `as_json`, the HTTP one returns it."""
    call = getattr(client, method)
    return call(*args, as_json=True) if client.module is grpcclient else call(*args)


def status(client, http: str, grpc: str) -> str:
    return http if client.module is httpclient else grpc


# 1 ------------------------------------------------------------------------------------------- wording

def test_unknown_model_and_version_errors_use_tritons_words(client):
    # Triton core model_repository_manager.cc GetModel / model_lifecycle.cc GetModel; the forms its own tests
    # match on in server qa/L0_server_status/server_status_test.py (test_unknown_model, _version).
    e = error_of(lambda: client.get_model_metadata("no_such_model"))
    assert e.message().startswith("Request for unknown model: 'no_such_model' is not found"), e.message()
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    e = error_of(lambda: client.infer("simple", simple_inputs(client.module), model_version="42"))
    assert e.message().startswith("Request for unknown model: 'simple' version 42 is not found"), e.message()
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    # An existing model that cannot serve: qa/L0_lifecycle/lifecycle_test.py "... has no available versions".
    e = error_of(lambda: client.infer("decoupled", simple_inputs(client.module)))
    assert e.message().startswith("Request for unknown model: 'decoupled' has no available versions")
    assert "decoupled" in e.message().split("versions", 1)[1]  # our reason follows Triton's words


def test_bad_version_string_uses_tritons_words(client):
    # Triton server src/common.cc GetModelVersionFromString.
    e = error_of(lambda: client.get_model_metadata("simple", model_version="abc"))
    assert e.message().startswith("failed to get model version from specified version string 'abc'")
    assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    e = error_of(lambda: client.infer("simple", simple_inputs(client.module), model_version="-1"))
    assert e.message().startswith("invalid model version specified '-1'"), e.message()


# 3 ------------------------------------------------------------------------------------------- reshape

def test_reshape_applies_on_the_way_in_and_out(client):
    meta = as_json(client, "get_model_metadata", "reshaped")
    assert meta["inputs"][0]["shape"] in ([-1, 10], ["-1", "10"])
    assert meta["outputs"][0]["shape"] in ([-1, 10], ["-1", "10"])
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    tensor = client.module.InferInput("INPUT0", [3, 10], "FP32")
    tensor.set_data_from_numpy(x)
    out = client.infer("reshaped", [tensor]).as_numpy("OUTPUT0")
    assert out.shape == (3, 10)  # the metadata's [batch, 10], not the ONNX [batch, 1, 10, 1, 1]
    np.testing.assert_array_equal(out, x)


# 4 ------------------------------------------------------------------------------------------- platform

def test_metadata_platform_is_tritons_name(client):
    for name in ("simple", "by_backend", "no_config"):
        meta = as_json(client, "get_model_metadata", name)
        assert meta["platform"] == "onnxruntime_onnx", (name, meta)


# 5 ------------------------------------------------------------------------------------------- readiness

def test_readiness_of_an_unknown_version_is_not_found(client, parity_server):
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("simple", "42") is False
    assert client.is_model_ready("no_such_model") is False
    if client.module is httpclient:  # Triton server src/http_server.cc HandleModelReady: the error's status
        for path, code in (("simple/versions/42", 404), ("no_such_model", 404), ("simple/versions/x", 400),
                           ("decoupled", 503)):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{parity_server.http_url}/v2/models/{path}/ready", timeout=10)
            assert e.value.code == code, path


# 7 ------------------------------------------------------------------------------------------- decoupled

def test_decoupled_model_is_unavailable_with_its_reason(client):
    index = client.get_model_repository_index()
    rows = [r for r in (index if client.module is httpclient else
                        [{"name": m.name, "state": m.state, "reason": m.reason} for m in index.models])
            if r["name"] == "decoupled"]
    assert [r["state"] for r in rows] == ["UNAVAILABLE"], rows
    assert "decoupled" in rows[0]["reason"] and "not supported" in rows[0]["reason"], rows
    assert client.is_model_ready("decoupled") is False


# 8 ------------------------------------------------------------------------------------------- request features

def test_classification_request_is_refused_not_ignored(client):
    out = client.module.InferRequestedOutput("OUTPUT0", class_count=3)
    e = error_of(lambda: client.infer("simple", simple_inputs(client.module), outputs=[out]))
    assert "classification" in e.message() and "class_count" in e.message(), e.message()
    assert e.status() == status(client, "501", "StatusCode.UNIMPLEMENTED")


def test_shared_memory_tensors_are_refused_not_ignored(client):
    inputs = simple_inputs(client.module)
    inputs[1] = client.module.InferInput("INPUT1", [1, 16], "INT32")
    inputs[1].set_shared_memory("input1_region", 64)
    e = error_of(lambda: client.infer("simple", inputs))
    assert "shared_memory" in e.message() and "INPUT1" in e.message(), e.message()
    assert e.status() == status(client, "501", "StatusCode.UNIMPLEMENTED")
    out = client.module.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("output0_region", 64)
    e = error_of(lambda: client.infer("simple", simple_inputs(client.module), outputs=[out]))
    assert "shared_memory" in e.message() and "OUTPUT0" in e.message(), e.message()
    assert e.status() == status(client, "501", "StatusCode.UNIMPLEMENTED")
    client.infer("simple", simple_inputs(client.module))  # the server serves on


# 10 ------------------------------------------------------------------------------------------ extensions

def test_extensions_are_exactly_what_is_served(client):
    # Names from Triton core src/server.cc; each listed one is exercised by the API suites.
    meta = as_json(client, "get_server_metadata")
    assert sorted(meta["extensions"]) == sorted(["binary_tensor_data", "model_repository", "schedule_policy",
                                                 "model_configuration", "statistics"])
