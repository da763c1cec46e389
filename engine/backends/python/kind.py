"""The Python kind (engine/repository/kinds.py): a `backend: "python"` model's versions are `PythonModel`s
(model.py). Registered when this module is imported (engine/kinds.py); the instance processes never import
it.

Its part in a load: the model's own static `auto_complete_config`, run in a process of its own
(autocomplete.py, with the interpreter environment.py picks), after the backend table's description of the
file; and, unless the server runs with --allow-python-model-upload, the refusal of what a client's load would
make the server run: model files that create or replace a Python model (`refuse_upload`), a config override
that chooses its interpreter or script (`refuse_override`, overrides.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.model_config import ModelConfig
from ...errors import invalid
from ...model import Model
from ...proto import model_config_pb2 as pb
from ...repository.kinds import ModelKind, register
from . import autocomplete, environment
from .model import PythonModel
from .overrides import refuse_python_override

if TYPE_CHECKING:
    from ...repository.lifecycle import ModelRepository


class PythonKind(ModelKind):
    name = "python"
    rank = 30

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        return config.backend == "python"

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        return PythonModel(config, version, version_dir / config.default_model_filename, repository.gpus,
                           repository.limiter, repository, repository.backlog)

    def complete_from_file(self, msg: pb.ModelConfig, backend: str, model_file: Path, model_dir: Path,
                           name: str) -> None:
        if backend != "python":
            return
        params = {k: v.string_value for k, v in msg.parameters.items()}
        python = environment.options(params, model_dir, f"model '{name}'").interpreter
        autocomplete.complete(msg, model_file, model_dir, name, python)

    def refuse_upload(self, name: str, config_json: dict[str, Any], files: Mapping[str, bytes],
                      serving: Sequence[ModelConfig]) -> None:
        backend = str(config_json.get("backend", "")) or str(config_json.get("platform", ""))
        script = next((f for f in sorted(files) if f.endswith(".py")), None)
        replaced = any(config.backend == "python" for config in serving)
        why = ("its config names backend 'python'" if backend == "python" else
               f"it sends the Python file '{script}'" if script is not None else
               f"it would replace the Python model '{name}'" if replaced else "")
        if why:
            raise invalid(f"load of model '{name}' refused: {why}, and Python models are code the server "
                          "would run; model files sent with a load may not create or replace a Python model "
                          "unless the server runs with --allow-python-model-upload")

    def refuse_override(self, name: str, model_dir: Path, config_json: dict[str, Any]) -> None:
        refuse_python_override(name, model_dir, config_json)


register(PythonKind())
