"""Python models (`backend: "python"`): Triton's API as models use it, over HTTP and gRPC with tritonclient.

One server in explicit mode serves a repository of models these tests write (tests/python_models.py). What
is checked: initialize's args, what a request reports (parameters, requested outputs, id, correlation id,
flags), BYTES as object arrays of bytes, DLPack (a CUDA tensor refused with its reason), async execute,
in-process models, per-request errors and which batch-mates they spare, load failures (import error,
initialize raising) in the index, auto-complete, and the refusal of Python model files sent with a load.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc as grpc_module
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import start_server
from python_models import (
    ASYNC,
    AUTO,
    BEHAVE,
    BEHAVE_CONFIG,
    DLPACK,
    DLPACK_CONFIG,
    FAILS_IMPORT,
    FAILS_INIT,
    ONE_IN_ONE_OUT,
    PARAMETER_ECHO,
    PROBE,
    PROBE_CONFIG,
    write_model,
)

MODELS = ("probe", "behave", "async_model", "in_process", "fails_init", "fails_import", "auto",
          "parameter_echo", "dlpack")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("py_repository")
    write_model(repo, "probe", PROBE, PROBE_CONFIG + "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    write_model(repo, "behave", BEHAVE, BEHAVE_CONFIG)
    write_model(repo, "async_model", ASYNC, ONE_IN_ONE_OUT)
    write_model(repo, "in_process", PROBE, PROBE_CONFIG +
                'parameters { key: "in_process" value: { string_value: "true" } }\n')
    write_model(repo, "fails_init", FAILS_INIT, ONE_IN_ONE_OUT)
    write_model(repo, "fails_import", FAILS_IMPORT, ONE_IN_ONE_OUT)
    write_model(repo, "auto", AUTO, "")
    write_model(repo, "parameter_echo", PARAMETER_ECHO, ONE_IN_ONE_OUT)
    write_model(repo, "dlpack", DLPACK, DLPACK_CONFIG)
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    srv = start_server(repo, tmp_path_factory.mktemp("py_server") / "server.log", *args, wait_ready=False,
                       ready_timeout=120)
    yield srv
    srv.stop()


def probe_inputs(module, x: np.ndarray, text: list[bytes] | None = None) -> list:
    inputs = [module.InferInput("IN", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    if text is not None:
        t = module.InferInput("TEXT", [len(text)], "BYTES")
        t.set_data_from_numpy(np.array(text, dtype=object))
        inputs.append(t)
    return inputs


@pytest.mark.parametrize("model", ["probe", "in_process"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_reports_what_triton_reports(server, http, grpc, model: str, protocol: str) -> None:
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    x = np.arange(4, dtype=np.float32)
    result = client.infer(model, probe_inputs(module, x, [b"ab", b"c"]), request_id="r-7",
                          parameters={"scale": 3, "tag": "x", "flag": True},
                          outputs=[module.InferRequestedOutput("INFO"), module.InferRequestedOutput("DOUBLE"),
                                   module.InferRequestedOutput("UPPER")])
    info = json.loads(result.as_numpy("INFO")[0])
    if protocol == "http":  # compact JSON in the order sent
        assert info["parameters"] == '{"scale":3,"tag":"x","flag":true}'
    else:  # tritonclient's protobuf writes a map in hash order: the wire order is checked below
        assert json.loads(info["parameters"]) == {"scale": 3, "tag": "x", "flag": True}
    assert info["requested"] == ["INFO", "DOUBLE", "UPPER"] and info["id"] == "r-7"
    assert info["correlation_id"] == 0 and info["flags"] == 0 and info["text_type"] == "bytes"
    assert info["types"] == ["str"] and info["out_config"] == "TYPE_FP32" and "float32" in info["dtype"]
    assert info["dlpack"] == 6.0
    args = info["args"]
    assert args["model_name"] == model and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == f"{model}_0_0"
    assert args["model_repository"].endswith(f"/{model}")
    config = json.loads(args["model_config"])
    assert config["name"] == model and config["backend"] == "python"
    np.testing.assert_array_equal(result.as_numpy("DOUBLE"), x * 2)
    assert list(result.as_numpy("UPPER")) == [b"AB", b"C"]


@pytest.mark.parametrize("model", ["probe", "in_process"])
def test_grpc_parameters_reach_the_model_in_the_order_sent(server, model: str) -> None:
    # Triton: parameters() is the request's parameters in the order sent. The request is written by hand,
    # one map entry per appended message, so the wire order is ours (not protobuf's hash order); sent twice,
    # so the second is decoded from the codec's cached plan.
    head = service_pb2.ModelInferRequest(model_name=model, outputs=[{"name": "INFO"}],
                                         inputs=[{"name": "IN", "datatype": "FP32", "shape": [2]}],
                                         raw_input_contents=[np.ones(2, np.float32).tobytes()])
    entries = []
    for key, value in (("zeta", {"int64_param": 1}), ("alpha", {"string_param": "a"}),
                       ("mid", {"bool_param": True}), ("zeta", {"int64_param": 2})):
        entries.append(service_pb2.ModelInferRequest(parameters={key: value}).SerializeToString())
    message = head.SerializeToString() + b"".join(entries)
    with grpc_module.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
        for _ in range(2):
            result = grpcclient.InferResult(infer(message, timeout=30))
            info = json.loads(result.as_numpy("INFO")[0])
            assert info["parameters"] == '{"zeta":2,"alpha":"a","mid":true}'


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_response_parameters_reach_the_client(http, grpc, protocol: str) -> None:
    # Triton sends a Python model's InferenceResponse(parameters=...) as the response's parameters: HTTP
    # JSON `parameters`, gRPC ModelInferResponse.parameters (bool, int64, string). Twice: the second request
    # finds the codecs' cached plans, which must not drop them.
    client, module = (http, httpclient) if protocol == "http" else (grpc, grpcclient)
    x = np.arange(3, dtype=np.float32)
    sent = {"count": 7, "label": "cat", "final": True}
    for _ in range(2):
        result = client.infer("parameter_echo", _one_input(module, x),
                              parameters=sent, outputs=[module.InferRequestedOutput("OUT")])
        np.testing.assert_array_equal(result.as_numpy("OUT"), x)
        response = result.get_response()
        if protocol == "http":
            assert response["parameters"] == sent
        else:
            got = response.parameters
            assert (got["count"].int64_param, got["label"].string_param, got["final"].bool_param) == \
                (7, "cat", True) and len(got) == 3
    plain = client.infer("parameter_echo", _one_input(module, x)).get_response()  # none set: none sent
    assert ("parameters" not in plain) if protocol == "http" else len(plain.parameters) == 0


def _one_input(module, x: np.ndarray) -> list:
    tensor = module.InferInput("IN", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def test_unrequested_outputs_are_dropped_and_no_names_means_all(http) -> None:
    x = np.ones(2, dtype=np.float32)
    only = http.infer("probe", probe_inputs(httpclient, x),
                      outputs=[httpclient.InferRequestedOutput("DOUBLE")])
    assert only.as_numpy("INFO") is None and only.as_numpy("DOUBLE") is not None
    every = http.infer("probe", probe_inputs(httpclient, x))
    assert json.loads(every.as_numpy("INFO")[0])["requested"] == ["INFO", "DOUBLE", "UPPER"]
    assert json.loads(every.as_numpy("INFO")[0])["parameters"] == "{}"
    assert every.as_numpy("UPPER") is None  # the model returned no UPPER: not an error, it was not named


def test_an_output_named_but_not_returned_is_an_error(http) -> None:
    with pytest.raises(InferenceServerException, match="returned no output 'UPPER'"):
        http.infer("probe", probe_inputs(httpclient, np.ones(2, np.float32)),
                   outputs=[httpclient.InferRequestedOutput("UPPER")])


def test_async_execute(http, grpc) -> None:
    x = np.array([1.5, 2.5], dtype=np.float32)
    for client, module in ((http, httpclient), (grpc, grpcclient)):
        i = module.InferInput("IN", [2], "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("async_model", [i]).as_numpy("OUT"), x + 1)


def behave(client, module, mode: int, rows: int = 1):
    i = module.InferInput("MODE", [rows, 1], "INT32")
    i.set_data_from_numpy(np.full((rows, 1), mode, np.int32))
    return client.infer("behave", [i], outputs=[module.InferRequestedOutput("OUT")])


@pytest.mark.parametrize("mode,status,text", [
    (1, "400", "mode one is refused"),
    (2, "500", "plain failure"),
    (3, "500", "model 'behave' returned no output 'OUT', which the request asked for (it returned none)"),
    (4, "500", "returned output 'OUT' as INT32; its config declares FP32"),
    (5, "500", "returned output 'OUT' with shape [1, 3]; its config declares [1,2]"),
    (6, "500", "Failed to process the request(s) for model 'behave_0_0', message: "
               "ValueError: execute gave up"),
    (7, "500", "returned 0 responses for 1 requests"),
    (8, "500", "execute returned NoneType for request 0"),
])
def test_each_fault_is_a_precise_error(http, mode: int, status: str, text: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        behave(http, httpclient, mode)
    assert text in e.value.message()
    assert e.value.status() == status


def test_a_model_error_over_grpc_keeps_its_code_and_traceback(grpc) -> None:
    with pytest.raises(InferenceServerException) as e:
        behave(grpc, grpcclient, 1)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as e:
        behave(grpc, grpcclient, 6)
    assert e.value.status() == "StatusCode.INTERNAL"
    assert "At:\n  behave/1/model.py(" in e.value.message() and "/tmp" not in e.value.message()


def test_one_bad_request_in_a_batch_fails_alone(server) -> None:
    """Four requests batched together (the window is 300 ms): the two bad ones fail, each with its own
    error; the good ones are answered, and report the batch of four they were in."""
    def one(mode: int):
        with httpclient.InferenceServerClient(server.http_url) as c:
            try:
                return behave(c, httpclient, mode).as_numpy("OUT")
            except InferenceServerException as e:
                return e.message()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, [0, 1, 0, 3]))
    assert results[0].tolist() == [[4.0, 0.0]] and results[2].tolist() == [[4.0, 0.0]]
    assert results[1] == "mode one is refused"
    assert "returned no output 'OUT'" in results[3]


def test_load_failures_are_unavailable_with_the_error_in_the_index(http, server) -> None:
    index = {(m["name"]): m for m in http.get_model_repository_index()}
    init = index["fails_init"]
    assert init["state"] == "UNAVAILABLE"
    assert "RuntimeError: no weights in" in init["reason"] and "fails_init/1/model.py(" in init["reason"]
    assert str(server.repository) not in init["reason"]
    missing = "ModuleNotFoundError: No module named 'a_module_nobody_installed'"
    assert missing in index["fails_import"]["reason"]
    with pytest.raises(InferenceServerException, match="no available versions"):
        http.infer("fails_init", probe_inputs(httpclient, np.ones(1, np.float32)))
    assert "RuntimeError: no weights in" in server.log()
    assert "probe initialized: probe_0_0" in server.log()  # Logger lines reach the server's log


def test_auto_complete_config_fills_the_config(http) -> None:
    config = http.get_model_config("auto")
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("IN", "TYPE_FP32", [3])]
    i = httpclient.InferInput("IN", [1, 3], "FP32")
    i.set_data_from_numpy(np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(http.infer("auto", [i]).as_numpy("OUT"), np.full((1, 3), 3, np.float32))


def load_with_files(server, name: str, config: dict, files: dict[str, bytes]) -> tuple[int, str]:
    body = {"parameters": {"config": json.dumps(config),
                           **{f"file:{k}": base64.b64encode(v).decode() for k, v in files.items()}}}
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{name}/load",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


UPLOAD_CONFIG = {"backend": "python", "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
                 "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]}


def test_python_files_in_a_load_are_refused_by_default(server, http) -> None:
    status, text = load_with_files(server, "uploaded", UPLOAD_CONFIG, {"1/model.py": ASYNC.encode()})
    assert status == 400 and "--allow-python-model-upload" in text and "backend 'python'" in text
    status, text = load_with_files(server, "uploaded", {**UPLOAD_CONFIG, "backend": "onnxruntime"},
                                   {"1/model.onnx": b"x", "1/helper.py": b"import os"})
    assert status == 400 and "Python file '1/helper.py'" in text
    status, text = load_with_files(server, "probe", {**UPLOAD_CONFIG, "backend": "onnxruntime"},
                                   {"1/model.onnx": b"x"})
    assert status == 400 and "replace the Python model 'probe'" in text
    assert http.is_model_ready("probe")


def test_python_files_in_a_load_with_the_flag(tmp_path) -> None:
    srv = start_server(tmp_path, tmp_path / "server.log", "--model-control-mode", "explicit",
                       "--allow-python-model-upload")
    try:
        status, text = load_with_files(srv, "uploaded", UPLOAD_CONFIG, {"1/model.py": ASYNC.encode()})
        assert status == 200, text
        with httpclient.InferenceServerClient(srv.http_url) as c:
            i = httpclient.InferInput("IN", [1], "FP32")
            i.set_data_from_numpy(np.ones(1, np.float32))
            np.testing.assert_array_equal(c.infer("uploaded", [i]).as_numpy("OUT"), [2.0])
    finally:
        srv.stop()


def test_dlpack_keeps_memory_dtype_and_shape_and_refuses_a_cuda_tensor(http, grpc) -> None:
    x = np.array([1.5, 2.0, 3.0], np.float32)
    inputs = probe_inputs(httpclient, x)
    result = http.infer("dlpack", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)
    info = json.loads(result.as_numpy("INFO")[0])
    assert info == {"shared": True, "round_trip_shared": True, "through_numpy": [3.0, 4.0, 6.0],
                    "dtype": "FP32", "shape": [3], "is_cpu": True, "int16": [2, 3]}
    with pytest.raises(InferenceServerException) as e:
        http.infer("dlpack", probe_inputs(httpclient, np.array([-1.0], np.float32)))
    assert e.value.status() == "500"
    message = e.value.message()
    assert ("Failed to process the request(s) for model 'dlpack_0_0', message: TritonModelException: "
            "Tensor.from_dlpack: 'OUT' is on CUDA device 0; hubserve serves Python models' tensors from host "
            "memory only") in message, message
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("dlpack", probe_inputs(grpcclient, np.array([-1.0], np.float32)))
    assert e.value.status() == "StatusCode.INTERNAL" and "is on CUDA device 0" in e.value.message()
    assert http.infer("dlpack", inputs).as_numpy("OUT").tolist() == [3.0, 4.0, 6.0]  # the instance lives on
