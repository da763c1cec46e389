"""The model-repository extension (explicit load, unload, config override, model files sent with the load,
index) through both of Triton's clients, against a server of its own started in explicit model-control mode.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import ROOT, build_test_repository, start_server

BAD_PBTXT = 'name: "bad_config"\nbackend: "onnxruntime"\nmax_batch_size: 8\ninput [ { name: "INPUT0" \n'


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory):
    """Starts with only `simple` and `bad_config` loaded; `bad_config` fails, so the server is live but not
    strictly ready."""
    repo = build_test_repository(tmp_path_factory.mktemp("explicit_repository"))
    bad = repo / "bad_config"
    (bad / "1").mkdir(parents=True)
    (bad / "1" / "model.onnx").write_bytes((repo / "simple" / "1" / "model.onnx").read_bytes())
    (bad / "config.pbtxt").write_text(BAD_PBTXT)
    log = tmp_path_factory.mktemp("explicit_server") / "server.log"
    srv = start_server(repo, log, "--model-control-mode", "explicit", "--load-model", "simple",
                       "--load-model", "bad_config", wait_ready=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(explicit_server):
    with httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def grpc_client(explicit_server):
    with grpcclient.InferenceServerClient(explicit_server.grpc_url) as c:
        yield c


def http_ready_index(server) -> list[dict]:
    """POST /v2/repository/index {"ready": true}: tritonclient has no argument for it."""
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b'{"ready": true}',
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def grpc_ready_index(server) -> list:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return list(stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=10).models)


def infer_simple(client, module, batch: int = 1) -> None:
    a = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, [batch, 16], "INT32")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_only_requested_models_load_at_start(http, explicit_server):
    assert http.is_server_live()
    assert http.is_model_ready("simple")
    assert not http.is_model_ready("mlp")
    assert not http.is_server_ready()  # strict readiness: bad_config was asked for and failed
    ready = {row["name"] for row in http_ready_index(explicit_server)}
    assert "simple" in ready and "mlp" not in ready and "bad_config" not in ready
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows["simple"]["state"] == "READY"
    assert rows["mlp"]["state"] != "READY"  # on disk, not loaded


def test_bad_config_is_unavailable_with_reason_while_others_serve(http, grpc_client, explicit_server):
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows["bad_config"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in rows["bad_config"]["reason"], rows["bad_config"]
    grpc_rows = {m.name: m for m in grpc_client.get_model_repository_index().models}
    assert grpc_rows["bad_config"].state == "UNAVAILABLE" and "config.pbtxt" in grpc_rows["bad_config"].reason
    assert not http.is_model_ready("bad_config")
    # A config that cannot be read fails the poll in Triton: INTERNAL "failed to load 'X', failed to poll from
    # model repository" (core model_repository_manager.cc; server qa/L0_lifecycle/lifecycle_test.py); our
    # reason follows.
    triton_words = "failed to load 'bad_config', failed to poll from model repository"
    with pytest.raises(InferenceServerException) as e:
        http.load_model("bad_config")
    assert e.value.status() == "500" and e.value.message().startswith(triton_words), e.value.message()
    assert "config.pbtxt" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("bad_config")
    assert e.value.status() == "StatusCode.INTERNAL" and e.value.message().startswith(triton_words)
    assert "config.pbtxt" in e.value.message()
    infer_simple(http, httpclient)
    infer_simple(grpc_client, grpcclient)


def test_http_load_infer_unload(http, explicit_server):
    http.load_model("mlp")
    assert http.is_model_ready("mlp") and http.is_model_ready("mlp", "1")
    assert "mlp" in {row["name"] for row in http_ready_index(explicit_server)}
    x = np.random.default_rng(0).standard_normal((2, 256), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [2, 256], "FP32")
    tensor.set_data_from_numpy(x)
    out = http.infer("mlp", [tensor]).as_numpy("OUTPUT0")
    assert out.shape == (2, 256) and np.isfinite(out).all()

    http.unload_model("mlp")
    assert not http.is_model_ready("mlp")
    assert "mlp" not in {row["name"] for row in http_ready_index(explicit_server)}
    assert "mlp" in {row["name"] for row in http.get_model_repository_index()}  # still on disk
    with pytest.raises(InferenceServerException) as e:
        http.infer("mlp", [tensor])
    assert e.value.status() in ("404", "503")
    assert http.is_model_ready("simple")


def test_grpc_load_infer_unload(grpc_client, explicit_server):
    grpc_client.load_model("strings")
    assert grpc_client.is_model_ready("strings")
    assert "strings" in {m.name for m in grpc_ready_index(explicit_server)}
    tensor = grpcclient.InferInput("TEXT", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"abc", b""], dtype=object))
    result = grpc_client.infer("strings", [tensor])
    assert [bytes(x) for x in result.as_numpy("UPPER")] == [b"ABC", b""]

    grpc_client.unload_model("strings")
    assert not grpc_client.is_model_ready("strings")
    assert "strings" not in {m.name for m in grpc_ready_index(explicit_server)}
    with pytest.raises(InferenceServerException) as e:
        grpc_client.infer("strings", [tensor])
    assert e.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE")


def test_http_load_with_config_override(http):
    override = {"name": "simple", "backend": "onnxruntime", "max_batch_size": 2,
                "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    try:
        http.load_model("simple", config=json.dumps(override))
        config = http.get_model_config("simple")
        assert config["max_batch_size"] == 2
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]  # auto-completed from the model
        assert http.get_model_metadata("simple")["inputs"][0]["shape"] == [-1, 16]
        infer_simple(http, httpclient, batch=2)
        with pytest.raises(InferenceServerException) as e:
            infer_simple(http, httpclient, batch=3)
        assert e.value.status() == "400" and "max_batch_size" in e.value.message()
    finally:
        http.load_model("simple")  # back to the config file
    assert http.get_model_config("simple")["max_batch_size"] == 8
    infer_simple(http, httpclient, batch=3)


def test_grpc_load_with_config_override(grpc_client):
    override = {"name": "simple", "backend": "onnxruntime", "max_batch_size": 3}
    try:
        grpc_client.load_model("simple", config=json.dumps(override))
        config = grpc_client.get_model_config("simple").config
        assert config.max_batch_size == 3
        assert not config.HasField("dynamic_batching")
        assert grpc_client.get_model_config("simple", as_json=True)["config"]["max_batch_size"] == 3
        infer_simple(grpc_client, grpcclient, batch=3)
    finally:
        grpc_client.load_model("simple")
    assert grpc_client.get_model_config("simple").config.max_batch_size == 8


def test_load_bad_override_fails_in_tritons_words_and_model_keeps_serving(http, grpc_client, explicit_server):
    # Triton's words and code: core model_repository_manager.cc (InitializeModelInfo logs "Invalid config
    # override", the load answers INTERNAL "failed to load '<name>', failed to poll from model repository");
    # client src/python/examples/simple_{http,grpc}_model_control.py match on "failed to load".
    words = "failed to load 'simple', failed to poll from model repository: Invalid config override: "
    # What those examples send, a JSON array, a JSON string, and (raw HTTP) a config that is not a string.
    for config in ('"parameters": {"config": {{"max_batch_size": "16"}}}', "[1, 2]", '"x"'):
        for client, code in ((http, "500"), (grpc_client, "StatusCode.INTERNAL")):
            with pytest.raises(InferenceServerException) as e:
                client.load_model("simple", config=config)
            assert e.value.status() == code and e.value.message().startswith(words), e.value.message()
    request = urllib.request.Request(f"http://{explicit_server.http_url}/v2/repository/models/simple/load",
                                     data=b'{"parameters": {"config": {"max_batch_size": 4}}}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 500 and json.loads(e.value.read())["error"].startswith(words)
    assert http.get_model_config("simple")["max_batch_size"] == 8
    infer_simple(http, httpclient)
    infer_simple(grpc_client, grpcclient)


def test_load_unknown_model(http, grpc_client):
    # Triton's words and code (core model_repository_manager.cc; server qa/L0_lifecycle/lifecycle_test.py
    # "Load non-existent model"); no server path in the message.
    triton_words = "failed to load 'no_such_model', failed to poll from model repository"
    with pytest.raises(InferenceServerException) as e:
        http.load_model("no_such_model")
    assert e.value.status() == "500" and e.value.message().startswith(triton_words), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("no_such_model")
    assert e.value.status() == "StatusCode.INTERNAL" and e.value.message().startswith(triton_words)
    assert "/" not in e.value.message()


def test_unload_unknown_model(http, grpc_client):
    with pytest.raises(InferenceServerException) as e:
        http.unload_model("no_such_model")
    assert e.value.status() == "404" and "no_such_model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        grpc_client.unload_model("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND" and "no_such_model" in e.value.message()


SIMPLE_OVERRIDE = {"name": "from_files", "backend": "onnxruntime", "max_batch_size": 8}


def infer_named(client, module, name: str) -> str:
    """Infer `simple`'s add/sub on the model `name`; returns the version that answered."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for input_name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(input_name, [1, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    result = client.infer(name, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    response = result.get_response()
    return str(response["model_version"] if isinstance(response, dict) else response.model_version)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_model_files_through_the_api(protocol, http, grpc_client, explicit_server):
    """`file:<version>/<name>` parameters (base64 in HTTP JSON, bytes_param in gRPC) with a config: the model
    is served from those files, though the repository has no such folder."""
    client, module = (http, httpclient) if protocol == "http" else (grpc_client, grpcclient)
    onnx_bytes = (explicit_server.repository / "simple" / "1" / "model.onnx").read_bytes()
    client.load_model("from_files", config=json.dumps(SIMPLE_OVERRIDE),
                      files={"file:3/model.onnx": onnx_bytes})
    try:
        assert client.is_model_ready("from_files", "3")
        assert infer_named(client, module, "from_files") == "3"
        assert not (explicit_server.repository / "from_files").exists()
    finally:
        client.unload_model("from_files", unload_dependents=True)  # accepted; no ensembles to unload
    assert not client.is_model_ready("from_files")
    assert "from_files" not in {row["name"] for row in http.get_model_repository_index()}


def test_load_model_files_needs_a_config_and_paths_inside_the_folder(http, grpc_client, explicit_server):
    # Triton fails bad file overrides as any poll: INTERNAL "failed to load 'X', failed to poll from model
    # repository" (core model_repository_manager.cc; client src/python/examples/simple_grpc_model_control.py
    # checks both for a path component longer than NAME_MAX).
    words = "failed to load 'from_files', failed to poll from model repository: "
    with pytest.raises(InferenceServerException) as e:
        http.load_model("from_files", files={"file:1/model.onnx": b"x"})
    message = e.value.message()
    assert e.value.status() == "500" and message.startswith(words) and "'config'" in message
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("from_files", config=json.dumps(SIMPLE_OVERRIDE), files={"file:../x": b"x"})
    assert e.value.status() == "StatusCode.INTERNAL" and e.value.message().startswith(words)
    assert "inside the model folder" in e.value.message()
    for client, code in ((http, "500"), (grpc_client, "StatusCode.INTERNAL")):
        with pytest.raises(InferenceServerException) as e:
            client.load_model("from_files", config="{}", files={"file:1/" + "A" * 256: b"a"})
        assert e.value.status() == code and e.value.message().startswith(words), e.value.message()
        assert "/tmp" not in e.value.message() and client.is_server_live()
    request = urllib.request.Request(
        f"http://{explicit_server.http_url}/v2/repository/models/from_files/load",
        data=json.dumps({"parameters": {"config": json.dumps(SIMPLE_OVERRIDE), "file:1/model.onnx": "%%%"}})
        .encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(request, timeout=10)
    assert http_error.value.code == 400 and b"base64" in http_error.value.read()


def test_load_of_a_loaded_model_picks_up_a_new_version_folder(http, explicit_server):
    folder = explicit_server.repository / "grows"
    (folder / "1").mkdir(parents=True)
    simple_onnx = (explicit_server.repository / "simple/1/model.onnx").read_bytes()
    (folder / "1" / "model.onnx").write_bytes(simple_onnx)
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
    http.load_model("grows")
    assert infer_named(http, httpclient, "grows") == "1"
    (folder / "2").mkdir()
    (folder / "2" / "model.onnx").write_bytes((folder / "1" / "model.onnx").read_bytes())
    http.load_model("grows")
    assert infer_named(http, httpclient, "grows") == "2"
    grows = [(r["version"], r["state"], r["reason"]) for r in http.get_model_repository_index()
             if r["name"] == "grows"]
    assert grows == [("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")]  # as Triton lists them
    http.unload_model("grows")


def index_rows(client, name: str) -> list[tuple[str, str, str]]:
    """(version, state, reason) of each index row of `name`, from either client."""
    index = client.get_model_repository_index()
    rows = index if isinstance(index, list) else [
        {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    return [(r.get("version", ""), r.get("state", ""), r.get("reason", ""))
            for r in rows if r["name"] == name]


def test_a_failed_version_is_triton_worded_and_listed_beside_the_serving_one(
        http, grpc_client, explicit_server):
    folder = explicit_server.repository / "half_broken"
    (folder / "1").mkdir(parents=True)
    simple_onnx = (explicit_server.repository / "simple/1/model.onnx").read_bytes()
    (folder / "1" / "model.onnx").write_bytes(simple_onnx)
    (folder / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n'
                                         'version_policy: { all { } }\n')
    http.load_model("half_broken")
    (folder / "2").mkdir()
    (folder / "2" / "model.onnx").write_bytes(b"not an onnx file")
    # Versions that fail: INVALID_ARG "load failed for model 'X': version N is at UNAVAILABLE state: ...;"
    # (core model_repository_manager.cc LoadUnloadModels, model_lifecycle.cc OnLoadComplete).
    triton_words = "load failed for model 'half_broken': version 2 is at UNAVAILABLE state: "
    for client, code in ((http, "400"), (grpc_client, "StatusCode.INVALID_ARGUMENT")):
        with pytest.raises(InferenceServerException) as e:
            client.load_model("half_broken")
        assert e.value.status() == code and e.value.message().startswith(triton_words), e.value.message()
        assert str(explicit_server.repository) not in e.value.message()
        rows = index_rows(client, "half_broken")
        assert [r[:2] for r in rows] == [("1", "READY"), ("2", "UNAVAILABLE")], rows
        assert "ONNX" in rows[1][2] and str(explicit_server.repository) not in rows[1][2], rows
        assert infer_named(client, httpclient if client is http else grpcclient, "half_broken") == "1"
    # Unloaded versions stay listed as Triton lists them (core model_lifecycle.cc: reason "unloaded").
    http.unload_model("half_broken")
    for client in (http, grpc_client):
        assert index_rows(client, "half_broken") == [("1", "UNAVAILABLE", "unloaded")]


# ------------------------------------------------------------------ refused outside explicit mode

REFUSED = "explicit model load / unload is not allowed if polling is enabled"  # Triton's words, in any mode


@pytest.fixture(scope="module", params=["none", "poll"])
def closed_server(request: pytest.FixtureRequest, repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """A server of its own serving only `simple`, in `none` or `poll` mode, where the repository folder alone
    decides what serves: load and unload are an admin API these modes do not open (Triton's rule)."""
    repo = tmp_path_factory.mktemp(f"{request.param}_repository")
    shutil.copytree(repository / "simple", repo / "simple")
    srv = start_server(repo, tmp_path_factory.mktemp(f"{request.param}_server") / "server.log",
                       "--model-control-mode", request.param)
    yield request.param, srv
    srv.stop()


def test_load_and_unload_are_refused_outside_explicit_mode(closed_server):
    """Over both protocols, UNAVAILABLE (HTTP 503, as Triton's HTTP frontend answers it) in Triton's words
    with what to do, before anything else about the request is looked at (an unknown or invalid name, model
    files); nothing changes, and the index stays available."""
    mode, server = closed_server
    onnx = (server.repository / "simple" / "1" / "model.onnx").read_bytes()
    config = json.dumps({**SIMPLE_OVERRIDE, "max_batch_size": 2})
    with httpclient.InferenceServerClient(server.http_url) as http_client, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc_c:
        for client, code, bad_name in ((http_client, "503", "no_such_model"),
                                       (grpc_c, "StatusCode.UNAVAILABLE", "../outside")):
            for call, name, kwargs in ((client.load_model, "simple", {}),
                                       (client.load_model, "simple", {"config": config}),
                                       (client.load_model, "from_files",
                                        {"config": config, "files": {"file:1/model.onnx": onnx}}),
                                       (client.load_model, bad_name, {}),
                                       (client.unload_model, "simple", {"unload_dependents": True}),
                                       (client.unload_model, bad_name, {})):
                with pytest.raises(InferenceServerException) as e:
                    call(name, **kwargs)
                message = e.value.message()
                assert e.value.status() == code and message.startswith(REFUSED), (call, name, message)
                assert f"'{mode}' model-control mode" in message, message
                assert "--model-control-mode explicit" in message, message
            assert index_rows(client, "simple") == [("1", "READY", "")]
            assert not index_rows(client, "from_files")
            infer_simple(client, httpclient if client is http_client else grpcclient)
        assert http_client.get_model_config("simple")["max_batch_size"] == 8


def test_load_model_at_start_needs_explicit_mode(repository: Path):
    """`--load-model` without explicit mode would be ignored: refused at start, as Triton refuses it."""
    result = subprocess.run([sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
                             "--model-control-mode", "poll", "--load-model", "simple"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "Use of '--load-model' requires setting '--model-control-mode=explicit' as well." in result.stderr
