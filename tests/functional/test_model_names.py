"""Model names that would escape the repository, and folders that do.

A model name is one folder name of the repository (engine/names.py): `../evil`, an absolute path, `/`, `.`,
`..`, a backslash, a NUL byte or a name longer than 255 bytes is INVALID_ARG on every endpoint of every
protocol, with a message that names the rule and none of our paths. Independently, a folder (or version
folder) inside the repository that resolves outside it through a symbolic link is never served, on an explicit
load or in poll mode. Model files sent with a load are written to a folder named by the server alone, and a
bad file name leaves nothing behind.

The servers run against repositories in the test's tmp folder; next to each repository lies a valid model
folder `evil` (a copy of `simple`) that the old server could be talked into serving.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, start_server
from engine.errors import EngineError, ErrorCode
from engine.names import NAME_MAX_BYTES, check_model_name, name_problem
from engine.repository.overrides import PREFIX, check_files, write_override
from hubserve_models import examples

SIMPLE_CONFIG = {"name": "from_files", "backend": "onnxruntime", "max_batch_size": 8}


def make_layout(base: Path) -> tuple[Path, Path]:
    """`<base>/repository` holding `simple` (add/sub of two INT32[16]), and `<base>/evil`, a valid copy of it
    outside the repository (its config names no model, so it loads under any name)."""
    repo = base / "repository"
    (repo / "simple").mkdir(parents=True)
    shutil.copy(EXAMPLES / "simple" / "config.pbtxt", repo / "simple" / "config.pbtxt")
    examples.build_repository(repo, ["simple"])
    evil = copy_model(repo / "simple", base / "evil")
    return repo, evil


def copy_model(source: Path, target: Path) -> Path:
    """A copy of a model folder whose config names no model: it loads under the copy's folder name."""
    shutil.copytree(source, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{source.name}"\n', ""))
    return target


def assert_no_paths(message: str, *paths: Path) -> None:
    for path in paths:
        for form in {str(path), os.path.realpath(path)}:
            assert form not in message, f"message shows the server path {form}: {message}"


def simple_inputs(module):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    return a, inputs


def infer_simple(client, module, name: str = "simple") -> None:
    a, inputs = simple_inputs(module)
    result = client.infer(name, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


INFER_BODY = json.dumps({"inputs": [
    {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")
]}).encode()


def raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    """One request with the path exactly as given (no client-side quoting or normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def index_rows(server, body: bytes = b"{}") -> dict[str, dict]:
    """POST /v2/repository/index (`body` b'{"ready": true}' for the ready models only): name → row."""
    url = f"http://{server.http_url}/v2/repository/index"
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=10) as r:
        return {row["name"]: row for row in json.loads(r.read())}


def index_names(server) -> set[str]:
    return set(index_rows(server))


def ready_names(server) -> set[str]:
    return set(index_rows(server, b'{"ready": true}'))


# ---------------------------------------------------------------------------------------------- unit: names

@pytest.mark.parametrize("name, rule", [
    ("", "must not be empty"),
    (".", "'.' is not a model name"),
    ("..", "'..' is not a model name"),
    ("../evil", "must not contain '/'"),
    ("/tmp/somewhere/evil", "must not contain '/'"),
    ("/", "must not contain '/'"),
    ("a\\b", "must not contain '\\'"),
    ("a\x00b", "control characters (found U+0000)"),
    ("line\nbreak", "control characters (found U+000A)"),
    ("del\x7f", "control characters (found U+007F)"),
    ("x" * (NAME_MAX_BYTES + 1), f"at most {NAME_MAX_BYTES} bytes of UTF-8, this one has 256"),
    ("é" * 128, "this one has 256"),  # 128 characters, 256 bytes
    ("bad\udcff", "valid UTF-8"),  # a lone surrogate: how Python lists a folder whose name is not UTF-8
])
def test_names_that_are_not_one_folder_name_are_rejected_with_the_rule(name: str, rule: str):
    assert rule in (name_problem(name) or "")
    with pytest.raises(EngineError) as e:
        check_model_name(name)
    assert e.value.code is ErrorCode.INVALID_ARG
    assert e.value.message.startswith("invalid model name: ") and rule in e.value.message
    if "/" in name and len(name) > 1:
        assert name not in e.value.message  # a name holding '/' may be a path of ours: never echoed


@pytest.mark.parametrize("name", ["simple", "a.b", ".hidden", "...", "with space", "ünïcödé", "model-1_v2",
                                  "x" * NAME_MAX_BYTES, "é" * 127])
def test_ordinary_names_pass(name: str):
    assert name_problem(name) is None
    check_model_name(name)


def test_file_parameter_names_with_control_characters_are_rejected():
    for key in ("1/mo\x00del.onnx", "1/\nmodel.onnx", "\x001/model.onnx"):
        with pytest.raises(EngineError) as e:
            check_files("m", {key: b"x"})
        assert e.value.code is ErrorCode.INVALID_ARG and "control characters" in e.value.message
    with pytest.raises(EngineError, match="at most 255 bytes"):
        check_files("m", {"1/" + "x" * 256: b"x"})


def test_override_folders_are_named_by_the_server_and_cleaned_up_on_failure(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp creates folders
    folder = write_override("../../escape/evil", {"1/model.onnx": b"x"})
    try:
        assert folder.parent == tmp_path and folder.name.startswith(PREFIX)
        assert "escape" not in folder.name and "evil" not in folder.name
        assert (folder / "1" / "model.onnx").read_bytes() == b"x"
    finally:
        shutil.rmtree(folder)
    # The second file needs `1/a` to be a folder, but the first made it a file: the write fails half-way.
    with pytest.raises(EngineError) as e:
        write_override("m", {"1/a": b"x", "1/a/b": b"y"})
    assert e.value.code is ErrorCode.UNAVAILABLE and "1/a/b" in e.value.message
    assert_no_paths(e.value.message, tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- a real server

@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("names")
    repo, evil = make_layout(base)
    (repo / "linked").symlink_to(evil, target_is_directory=True)  # a model folder that leads outside
    halfway = repo / "halfway"  # its own folder and config, but the version folder leads outside
    halfway.mkdir()
    shutil.copy(evil / "config.pbtxt", halfway / "config.pbtxt")
    (halfway / "1").symlink_to(evil / "1", target_is_directory=True)
    tmpdir = base / "tmpdir"
    tmpdir.mkdir()
    return {"base": base, "repo": repo, "evil": evil, "tmpdir": tmpdir}


@pytest.fixture(scope="module")
def server(layout, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("names_server") / "server.log"
    srv = start_server(layout["repo"], log, "--model-control-mode", "explicit", "--load-model", "simple",
                       env={"TMPDIR": str(layout["tmpdir"])})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http_client(server):
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def grpc_client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


def bad_names(layout: dict[str, Path]) -> list[str]:
    return ["../evil", str(layout["evil"]), "/", ".", "..", "a\\b", "\x00", "x" * 300, "../repository/simple"]


NAME_IDS = ["dotdot-evil", "absolute", "slash", "dot", "dotdot", "backslash", "nul", "long", "dotdot-simple"]


@pytest.mark.parametrize("which", range(len(NAME_IDS)), ids=NAME_IDS)
def test_bad_names_are_400_on_every_http_endpoint(which: int, layout, server, http_client):
    name = bad_names(layout)[which]
    encoded = quote(name, safe="")  # '/' as %2F, NUL as %00: the name reaches the server as one segment
    for method, path, body in [
        ("POST", f"/v2/repository/models/{encoded}/load", b"{}"),
        ("POST", f"/v2/repository/models/{encoded}/unload", b"{}"),
        ("GET", f"/v2/models/{encoded}", None),
        ("GET", f"/v2/models/{encoded}/versions/1", None),
        ("GET", f"/v2/models/{encoded}/ready", None),
        ("GET", f"/v2/models/{encoded}/config", None),
        ("GET", f"/v2/models/{encoded}/stats", None),
        ("POST", f"/v2/models/{encoded}/infer", INFER_BODY),
    ]:
        status, text = raw(server, method, path, body)
        assert status == 400, (method, path, status, text)
        # A name the path itself cannot carry one way only (an encoded '/', a dot segment, a control
        # character: frontend/http/path.py) is refused by the path's rule before it is a name at all.
        error = json.loads(text)["error"]
        assert "invalid model name" in error or "in the request path" in error, error
        assert_no_paths(text, layout["base"], layout["repo"], layout["evil"])
    if "/" not in name:  # tritonclient.http quotes names but leaves '/' as is: those are no model path at all
        with pytest.raises(InferenceServerException) as e:
            http_client.load_model(name)
        assert e.value.status() == "400"
        assert "invalid model name" in e.value.message() or "in the request path" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            http_client.get_model_metadata(name)
        assert e.value.status() == "400"
        assert not http_client.is_model_ready(name)
    assert not any("evil" in n for n in index_names(server))
    infer_simple(http_client, httpclient)


@pytest.mark.parametrize("which", range(len(NAME_IDS)), ids=NAME_IDS)
def test_bad_names_are_invalid_argument_over_grpc(which: int, layout, server, grpc_client):
    name = bad_names(layout)[which]
    _, inputs = simple_inputs(grpcclient)
    for call in (lambda: grpc_client.load_model(name), lambda: grpc_client.unload_model(name),
                 lambda: grpc_client.get_model_metadata(name), lambda: grpc_client.get_model_config(name),
                 lambda: grpc_client.is_model_ready(name), lambda: grpc_client.get_inference_statistics(name),
                 lambda: grpc_client.infer(name, inputs)):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value
        assert "invalid model name" in e.value.message()
        assert_no_paths(e.value.message(), layout["base"], layout["repo"], layout["evil"])
    assert not any("evil" in m.name for m in grpc_client.get_model_repository_index().models)
    infer_simple(grpc_client, grpcclient)


def test_loading_slash_is_refused_at_once(server):
    """The old server scanned the whole file system for `/` (22 s, 585 MB)."""
    start = time.monotonic()
    status, text = raw(server, "POST", "/v2/repository/models/%2F/load", b"{}")
    assert status == 400 and time.monotonic() - start < 5.0, text


def test_a_folder_linked_to_outside_the_repository_is_not_served(layout, server, http_client, grpc_client):
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("linked")
    assert e.value.status() == "400" and "resolves outside the model repository" in e.value.message()
    assert_no_paths(e.value.message(), layout["base"], layout["repo"], layout["evil"])
    with pytest.raises(InferenceServerException) as e:
        grpc_client.load_model("linked")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert not http_client.is_model_ready("linked")
    row = index_rows(server)["linked"]  # marked, with the reason
    assert row["state"] == "UNAVAILABLE" and "outside the model repository" in row["reason"]
    infer_simple(http_client, httpclient)


def test_a_version_folder_linked_to_outside_is_not_served(layout, server, http_client):
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("halfway")
    message = e.value.message()
    # Triton's code for a version that failed (core model_repository_manager.cc)
    assert e.value.status() == "400"
    assert "'halfway/1/model.onnx' resolves outside the model repository" in message
    assert_no_paths(message, layout["base"], layout["repo"], layout["evil"])
    assert not http_client.is_model_ready("halfway")
    infer_simple(http_client, httpclient)


def test_a_config_cannot_point_the_model_file_outside(layout, server, http_client):
    """`default_model_filename` comes from the client with a config override: `../` must not leave."""
    config = {"name": "simple_copy", "backend": "onnxruntime", "max_batch_size": 8,
              "default_model_filename": "../../../evil/1/model.onnx"}
    shutil.copytree(layout["repo"] / "simple" / "1", layout["repo"] / "simple_copy" / "1")
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("simple_copy", config=json.dumps(config))
    assert "resolves outside the model repository" in e.value.message()
    assert_no_paths(e.value.message(), layout["base"], layout["repo"], layout["evil"])
    assert not http_client.is_model_ready("simple_copy")
    infer_simple(http_client, httpclient)


def test_errors_while_loading_name_files_inside_the_repository(layout, server, http_client):
    """A corrupt model file: ORT's message quotes the file, which must read `<model>/<version>/<file>`."""
    folder = layout["repo"] / "corrupt"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("corrupt")
    assert "corrupt/1/model.onnx" in e.value.message()
    assert_no_paths(e.value.message(), layout["base"], layout["repo"])
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("no_such_model")
    assert e.value.status() == "500"  # Triton's code for it (core model_repository_manager.cc)
    assert "failed to load 'no_such_model', failed to poll from model repository" in e.value.message()
    assert_no_paths(e.value.message(), layout["base"], layout["repo"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_nul_in_a_file_parameter_leaves_no_override_folder(protocol, layout, server, http_client,
                                                               grpc_client):
    onnx_bytes = (layout["repo"] / "simple" / "1" / "model.onnx").read_bytes()
    files = {"file:1/mo\x00del.onnx": onnx_bytes}
    if protocol == "http":
        body = json.dumps({"parameters": {"config": json.dumps(SIMPLE_CONFIG),
                                          **{k: base64.b64encode(v).decode() for k, v in files.items()}}})
        status, text = raw(server, "POST", "/v2/repository/models/from_files/load", body.encode())
        # Triton fails a bad file override as any failed poll: INTERNAL (core model_repository_manager.cc)
        assert status == 500 and "failed to load 'from_files'" in text and "control characters" in text, text
        assert_no_paths(text, layout["base"], layout["tmpdir"])
    else:
        with pytest.raises(InferenceServerException) as e:
            grpc_client.load_model("from_files", config=json.dumps(SIMPLE_CONFIG), files=files)
        assert e.value.status() == "StatusCode.INTERNAL" and "control characters" in e.value.message()
    assert list(layout["tmpdir"].glob(f"{PREFIX}*")) == []
    # A good load with files goes through the same folder and leaves nothing behind either.
    http_client.load_model("from_files", config=json.dumps(SIMPLE_CONFIG),
                           files={"file:1/model.onnx": onnx_bytes})
    try:
        infer_simple(http_client, httpclient, "from_files")
    finally:
        http_client.unload_model("from_files")
    assert list(layout["tmpdir"].glob(f"{PREFIX}*")) == []
    infer_simple(http_client, httpclient)


# ---------------------------------------------------------------------------------------------- poll mode

def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_poll_mode_skips_folders_outside_the_repository_and_bad_names(tmp_path: Path):
    repo, evil = make_layout(tmp_path)
    (repo / "linked").symlink_to(evil, target_is_directory=True)
    copy_model(repo / "simple", repo / "a\\b")  # a folder whose name is no model name
    copy_model(repo / "simple", repo / "swapped")  # served, then replaced by a link to outside
    srv = start_server(repo, tmp_path / "server.log", "--model-control-mode", "poll",
                       "--repository-poll-secs", "0.5", "--no-strict-readiness")
    try:
        with httpclient.InferenceServerClient(srv.http_url, network_timeout=60.0) as client:
            assert ready_names(srv) == {"simple", "swapped"}
            rows = index_rows(srv)
            assert rows["linked"]["state"] == "UNAVAILABLE" and "outside" in rows["linked"]["reason"]
            assert "a\\b" not in rows
            # Dropped while serving: a link is not loaded, a real folder dropped with it is.
            (repo / "late_link").symlink_to(evil, target_is_directory=True)
            shutil.copytree(repo / "swapped", repo / "late_ok")
            wait_for(lambda: "late_ok" in ready_names(srv), "late_ok served")
            # A served model whose folder turns into a link to outside is unloaded.
            (repo / "swapped").rename(repo / ".swapped_before")
            (repo / "swapped").symlink_to(evil, target_is_directory=True)
            wait_for(lambda: "swapped" not in ready_names(srv), "swapped unloaded")
            assert ready_names(srv) == {"simple", "late_ok"}
            infer_simple(client, httpclient)
        log = srv.log()
        assert log.count("skipping folder 'linked'") == 1, log
        assert log.count("skipping folder 'a\\\\b'") == 1, log
    finally:
        srv.stop()
