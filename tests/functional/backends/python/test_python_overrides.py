"""A config override sent without files (a repository load's `config` parameter) may not choose the code or
the interpreter of a Python model (engine/backends/python/overrides.py): `EXECUTION_ENV_PATH`,
`default_model_filename` and `backend: "python"` stay as the model folder's own config has them unless the
server runs with --allow-python-model-upload. Refused with INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT), and
nothing the override named ever runs: each attack's "interpreter" or script would leave a marker file.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, assert_simple_over_grpc, start_server
from engine.backends.python.overrides import refuse_python_override
from engine.errors import EngineError, ErrorCode
from hubserve_models import examples

MARKER_SCRIPT = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
class TritonPythonModel:
    def execute(self, requests):
        return []
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("overrides")
    repo = base / "repository"
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    (repo / "simple").mkdir(parents=True)
    shutil.copy(EXAMPLES / "simple" / "config.pbtxt", repo / "simple" / "config.pbtxt")
    examples.build_repository(repo, ["simple"])
    marker = base / "RAN"
    for script in (repo / "repeat_stream" / "1" / "other.py", repo / "simple" / "1" / "evil.py"):
        script.write_text(MARKER_SCRIPT.format(marker=str(marker)))
    env = base / "env"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python3"  # records that it ran, then hands over to the real interpreter
    python.write_text(f"#!/bin/sh\necho ran >> {marker}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return {"base": base, "repo": repo, "marker": marker, "env": env}


def attacks(layout: dict[str, Path], own: dict) -> list[tuple[str, str, dict]]:
    return [("repeat_stream", "EXECUTION_ENV_PATH",
             {**own, "parameters": {**own.get("parameters", {}),
                                     "EXECUTION_ENV_PATH": {"string_value": str(layout["env"])}}}),
            ("repeat_stream", "default_model_filename", {**own, "default_model_filename": "other.py"}),
            ("simple", "Python model", {"name": "simple", "backend": "python",
                                        "default_model_filename": "evil.py", "max_batch_size": 0}),
            ("simple", "EXECUTION_ENV_PATH", {"name": "simple", "backend": "onnxruntime",
                                              "parameters": {"EXECUTION_ENV_PATH":
                                                             {"string_value": str(layout["env"])}}})]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_override_cannot_choose_python_code_or_its_interpreter(layout, tmp_path: Path, workers: str):
    srv = start_server(layout["repo"], tmp_path / "server.log", "--workers", workers, "--model-control-mode",
                       "explicit", "--load-model", "repeat_stream", "--load-model", "simple")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        own = http.get_model_config("repeat_stream")
        for model, what, config in attacks(layout, own):
            with pytest.raises(InferenceServerException) as e:
                http.load_model(model, config=json.dumps(config))
            assert e.value.status() == "400", (what, e.value)
            assert f"load of model '{model}' refused: its config override" in e.value.message()
            assert "--allow-python-model-upload" in e.value.message()
            with pytest.raises(InferenceServerException) as e:
                grpc.load_model(model, config=json.dumps(config))
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", (what, e.value)
        assert not layout["marker"].exists(), "an override's interpreter or script ran"
        # what stays allowed: the model's own config sent back, and any override of a model that is not and
        # does not become a Python model
        http.load_model("repeat_stream", config=json.dumps(own))
        grpc.load_model("repeat_stream", config=json.dumps({**own, "parameters": own.get("parameters", {})}))
        http.load_model("simple", config=json.dumps({"name": "simple", "backend": "onnxruntime",
                                                     "max_batch_size": 4}))
        assert http.get_model_config("simple")["max_batch_size"] == 4
        assert http.is_model_ready("repeat_stream") and grpc.is_model_ready("simple")
        assert not layout["marker"].exists()
        assert_simple_over_grpc(srv)
    finally:
        srv.stop()


def test_the_operator_may_allow_it(layout, tmp_path: Path):
    """--allow-python-model-upload: a request may choose Python code, as it may send Python files."""
    srv = start_server(layout["repo"], tmp_path / "server.log", "--model-control-mode", "explicit",
                       "--load-model", "repeat_stream", "--allow-python-model-upload")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        own = http.get_model_config("repeat_stream")
        http.load_model("repeat_stream", config=json.dumps(attacks(layout, own)[0][2]))
        assert http.is_model_ready("repeat_stream")
        assert layout["marker"].read_text().startswith("ran")  # the named interpreter runs the instance
    finally:
        srv.stop()
        layout["marker"].unlink(missing_ok=True)


def test_the_rule_compares_with_the_folders_own_config(tmp_path: Path):
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("")
    (folder / "config.pbtxt").write_text('backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value: '
                                         '{ string_value: "$$TRITON_MODEL_DIRECTORY/env" } }\n')
    env = {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env"}}
    same = {"backend": "python", "parameters": env}
    refuse_python_override("m", folder, same)  # as the operator configured it
    refuse_python_override("m", folder, {**same, "max_batch_size": 8, "default_model_filename": "model.py"})
    for changed in ({"backend": "python"},  # drops the environment: the server's own interpreter instead
                    {**same, "parameters": {"EXECUTION_ENV_PATH": {"string_value": "/opt/other"}}},
                    {**same, "default_model_filename": "other.py"},
                    # no backend: the folder's model.py makes it Python
                    {"parameters": env, "default_model_filename": "x.py"}):
        with pytest.raises(EngineError) as e:
            refuse_python_override("m", folder, changed)
        assert e.value.code is ErrorCode.INVALID_ARG
    config_less = tmp_path / "plain"
    (config_less / "1").mkdir(parents=True)
    (config_less / "1" / "model.onnx").write_bytes(b"")
    refuse_python_override("plain", config_less, {"max_batch_size": 2, "default_model_filename": "o.onnx"})
    with pytest.raises(EngineError):
        refuse_python_override("plain", config_less, {"backend": "python"})
