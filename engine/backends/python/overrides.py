"""What a config override (a repository load's `config` parameter, sent without files) may not change of a
Python model: the code it runs and the interpreter that runs it.

Why: a load request is a client's. A Python model's `EXECUTION_ENV_PATH` names the folder whose
`bin/python3` runs its instances (backends/python/environment.py), and its `default_model_filename` the
script they import; `backend: "python"` makes a folder's `.py` file code the server runs. Sent in an
override, each let a client run any folder's `bin/python3`, or another model's script, in the server's
name. Model files sent with a load are already refused when they would create or replace a Python model
(kind.py `PythonKind.refuse_upload`); this closes the override without files, on the same
flag: only `--allow-python-model-upload` lets a request choose Python code.

What stays allowed: an override that leaves those three as the model folder's own config has them (a client
sending back the config it read, with a changed `max_batch_size` or instance count, say), and any override of
a model that is not and does not become a Python model. The folder's own config is the operator's: the
comparison is always with it, never with what a previous override loaded.

Called through the Python kind (kind.py) by ModelRepository.load on a worker thread (it reads the folder's
config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...config.steps import parse_dict, read_config_proto
from ...errors import EngineError, invalid
from ...proto import model_config_pb2 as pb

ENV_PATH = "EXECUTION_ENV_PATH"
_SCRIPT = "model.py"


def refuse_python_override(name: str, model_dir: Path, config_json: dict[str, Any]) -> None:
    """INVALID_ARG when the override `config_json` of model `name` (folder `model_dir`) would set or change
    the interpreter or the script of a Python model, or make the folder's files a Python model."""
    override = pb.ModelConfig()
    try:
        parse_dict(config_json, override, f"model '{name}' (config override)")
    except EngineError:
        return  # the load itself reports the malformed override, in its own words
    try:
        folder = read_config_proto(model_dir, name)
    except EngineError:
        folder = pb.ModelConfig()  # an unreadable config: compare with none (the defaults)
    script = _has_script(model_dir)
    folder_python = _is_python(folder, script)
    why = None
    if _env_path(override) != _env_path(folder):
        why = f"sets parameter '{ENV_PATH}' (the Python environment that would run the model) to a value " \
              "the model's own config does not have"
    elif _is_python(override, script) and not folder_python:
        why = "would make the model's files a Python model, which its own config does not"
    elif _is_python(override, script) and _filename(override) != _filename(folder):
        why = "changes 'default_model_filename', the Python file the model runs"
    if why is not None:
        raise invalid(f"load of model '{name}' refused: its config override {why}; a config override may not "
                      f"choose the code or the interpreter of a Python model ({ENV_PATH}, "
                      "default_model_filename, backend 'python') unless the server runs with "
                      "--allow-python-model-upload")


def _env_path(msg: pb.ModelConfig) -> str:
    param = msg.parameters.get(ENV_PATH)
    return param.string_value if param is not None else ""


def _filename(msg: pb.ModelConfig) -> str:
    return msg.default_model_filename or _SCRIPT


def _is_python(msg: pb.ModelConfig, folder_has_script: bool) -> bool:
    """Whether a config makes a Python model: it says so, or it names no backend and the folder's latest
    version holds model.py and no model.onnx (how the repository tells a config-less folder's kind)."""
    if msg.backend or msg.platform:
        return msg.backend == "python"
    return folder_has_script


def _has_script(model_dir: Path) -> bool:
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                      key=lambda p: int(p.name))
    latest = versions[-1] if versions else model_dir
    return (latest / _SCRIPT).is_file() and not (latest / "model.onnx").exists()


__all__ = ["ENV_PATH", "refuse_python_override"]
