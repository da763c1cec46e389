"""Where hubserve answers as Triton does (issue 11), through Triton's own clients over both protocols. The
core's half: error wording clients match on, output reshape, metadata platform, readiness of an unknown
version, unsupported configuration and request features refused, the extensions listed. The frontends' half:
raw and typed contents refused together, extensions we don't serve answered alike on both protocols,
compression, stream responses flagged final.

The server runs in its own process; this file imports `tritonclient.grpc` and none of our generated modules.
Where a point is Triton's wording, the comment names the Triton source it comes from.
"""

from __future__ import annotations

import queue
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as grpc_service_pb2
from tritonclient.grpc import service_pb2_grpc as grpc_service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, start_server
from hubserve_models import examples

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
    examples.write_model(examples.identity_model("FP32", (-1, 1, 10, 1, 1)),
                         root / "reshaped" / "1" / "model.onnx")
    (root / "reshaped" / "config.pbtxt").write_text(RESHAPED)
    # Triton's string example pair, with the configs committed in our example repository.
    for name in ("simple_string", "simple_identity"):
        (root / name).mkdir()
        (root / name / "config.pbtxt").write_bytes((EXAMPLES / name / "config.pbtxt").read_bytes())
    examples.build_repository(root, ["simple_string", "simple_identity"])
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


# 8 ------------------------------------------------------------------------------------ request features

def test_classification_request_is_answered_as_triton_does(client):
    # Once refused (UNSUPPORTED); now the extension itself (engine/classification.py): `simple`'s INT32
    # OUTPUT0 (INPUT0 + INPUT1 = 2 * arange(16)) as "score:index" entries, integers without decimals, highest
    # first.
    out = client.module.InferRequestedOutput("OUTPUT0", class_count=3)
    result = client.infer("simple", simple_inputs(client.module), outputs=[out])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (1, 3)
    assert [c.decode() if isinstance(c, bytes) else c for c in classes[0]] == ["30:15", "28:14", "26:13"]


def test_shared_memory_tensors_are_refused_while_client_shm_is_off(client):
    # Off by default (--allow-client-shm turns it on: test_client_shm.py): refused, never ignored, in
    # Triton's words for it, with our flag named; HTTP 400 as the issue asks, gRPC FAILED_PRECONDITION
    # (the method exists: refused by configuration, not unimplemented).
    inputs = simple_inputs(client.module)
    inputs[1] = client.module.InferInput("INPUT1", [1, 16], "INT32")
    inputs[1].set_shared_memory("input1_region", 64)
    e = error_of(lambda: client.infer("simple", inputs))
    assert "Client shared memory is disabled" in e.message() and "--allow-client-shm" in e.message()
    assert e.status() == status(client, "400", "StatusCode.FAILED_PRECONDITION")
    out = client.module.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("output0_region", 64)
    e = error_of(lambda: client.infer("simple", simple_inputs(client.module), outputs=[out]))
    assert "--allow-client-shm" in e.message(), e.message()
    assert e.status() == status(client, "400", "StatusCode.FAILED_PRECONDITION")
    client.infer("simple", simple_inputs(client.module))  # the server serves on


# 10 ------------------------------------------------------------------------------------------ extensions

def test_extensions_are_exactly_what_is_served(client):
    # Names from Triton core src/server.cc; each listed one is exercised by the API suites.
    meta = as_json(client, "get_server_metadata")
    assert sorted(meta["extensions"]) == sorted(["classification", "binary_tensor_data", "model_repository",
                                                 "model_repository(unload_dependents)", "schedule_policy",
                                                 "model_configuration", "statistics", "sequence", "logging",
                                                 "trace"])


# ================================================================ issue 11, the frontends' half

# 2 ------------------------------------------------------------------------- raw and typed contents at once

def contents_and_raw_request(with_contents: bool) -> grpc_service_pb2.ModelInferRequest:
    request = grpc_service_pb2.ModelInferRequest(model_name="simple", id="both")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    if with_contents:
        request.inputs[0].contents.int_contents[:] = range(16)
    return request


def test_raw_and_typed_contents_together_are_refused(parity_server):
    # Triton's words and code: server src/grpc/infer_handler.cc; client src/python/examples/
    # grpc_explicit_int_content_client.py matches on them. tritonclient only sends raw contents: a plain stub.
    words = ("contents field must not be specified when using raw_input_contents for 'INPUT0' for model "
             "'simple'")
    with grpc.insecure_channel(parity_server.grpc_url) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(contents_and_raw_request(False), timeout=10).id == "both"  # makes a plan
        for _ in range(3):  # the wire path's first sight of it and its repeats
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(contents_and_raw_request(True), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details() == words
        answers = list(stub.ModelStreamInfer(iter([contents_and_raw_request(True)]), timeout=10))
    assert [a.error_message for a in answers] == [words]


# 8 ------------------------------------------------------------------------- extensions we don't serve

def test_every_protocol_extension_is_served(client):
    """Trace, logging and both shared memories answer on both protocols (they answered 501 / UNIMPLEMENTED
    before they were built); the shared-memory status is empty with no region registered."""
    assert client.get_trace_settings() is not None
    assert client.get_log_settings() is not None
    status = client.get_system_shared_memory_status()
    assert not (status if isinstance(status, list) else list(status.regions))
    assert client.get_cuda_shared_memory_status() is not None


def test_paths_that_are_no_endpoint_stay_404(parity_server):
    for path in ("systemsharedmemory/nothing", "logging/extra", "models/simple/trace"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{parity_server.http_url}/v2/{path}", timeout=10)
        assert e.value.code == 404, path


# 9 ------------------------------------------------------------------------- compression

@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary_output", [True, False])
def test_compressed_requests_and_responses(client, algorithm, binary_output):
    """tritonclient.http's request_/response_compression_algorithm (the request's Inference-Header-Content-
    Length counts the uncompressed JSON) and tritonclient.grpc's compression_algorithm."""
    inputs = simple_inputs(client.module, batch=2)
    outputs = [client.module.InferRequestedOutput(name, **({"binary_data": binary_output}
                                                           if client.module is httpclient else {}))
               for name in ("OUTPUT0", "OUTPUT1")]
    if client.module is httpclient:
        result = client.infer("simple", inputs, outputs=outputs, request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
    else:
        result = client.infer("simple", inputs, outputs=outputs, compression_algorithm=algorithm)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)


# 11 ------------------------------------------------------------------------ stream responses flagged final

def test_stream_responses_carry_triton_final_response(parity_server):
    # Triton flags a non-decoupled model's one response final (server src/grpc/stream_infer_handler.cc
    # StreamInferResponseComplete); a client asking for an empty final response waits for the flag.
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(parity_server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            c.async_stream_infer("simple", simple_inputs(grpcclient), request_id="f1",
                                 enable_empty_final_response=True)
            result, error = results.get(timeout=30)
            assert error is None
            response = result.get_response()
            assert response.id == "f1" and response.parameters["triton_final_response"].bool_param is True
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.arange(16).reshape(1, 16))
            c.async_stream_infer("simple", simple_inputs(grpcclient), request_id="f2")  # without asking
            result, error = results.get(timeout=30)
            assert error is None and result.get_response().parameters["triton_final_response"].bool_param
        finally:
            c.stop_stream()
    with grpc.insecure_channel(parity_server.grpc_url) as channel:  # an error's answer is flagged as well
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        bad = grpc_service_pb2.ModelInferRequest(model_name="no_such_model", id="f3")
        [answer] = list(stub.ModelStreamInfer(iter([bad]), timeout=10))
    assert "no_such_model" in answer.error_message and answer.infer_response.id == "f3"
    assert answer.infer_response.parameters["triton_final_response"].bool_param is True


# Triton's example models ----------------------------------------------------------------------------------

def test_tritons_string_example_models_answer_as_its_string_clients_check(client):
    # What client src/python/examples/simple_{http,grpc}_string_infer_client.py send and check against the
    # models of server docs/examples/model_repository/simple_string and simple_identity (ours: in
    # model_repository/).
    m = client.module
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        tensor = m.InferInput(name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(np.array([[str(v).encode() for v in values[0]]], dtype=np.object_))
        inputs.append(tensor)
    result = client.infer("simple_string", inputs)
    assert [int(v) for v in result.as_numpy("OUTPUT0")[0]] == list(a[0] + b[0])
    assert [int(v) for v in result.as_numpy("OUTPUT1")[0]] == list(a[0] - b[0])
    for data in (np.array([[b"he\x00llo"] * 16], dtype=np.object_), np.array([[b"\x00\x01\x02\x03"] * 16])):
        tensor = m.InferInput("INPUT0", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        got = client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")
        assert got.tolist() == data.astype(np.object_).tolist()
