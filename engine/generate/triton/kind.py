"""The generative kind (engine/repository/kinds.py): a folder whose config declares `generation`, or that
holds a Hugging Face export (serving/hf_folder.py: with no config file, or one that only overrides), serves
Triton's LLM signature (signature.py) over the generation engine (model.py `GenerativeModel`). Registered
when this module is imported (engine/kinds.py).

An export whose files are the folder's own (Optimum writes them so) is version 1, the folder itself
(`version_dir`): dropping the folder into a polled repository serves it, a change to any of its files
reloads version 1, removing it unloads it. An export in `1/` is an ordinary version folder.

Its config is completed from that declaration, not from the model file (`complete`); its versions take
their engine from the repository's `generation` (serving/registry.py's GenerationRegistry, set by the
server): a repository without one refuses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.model_config import ModelConfig
from ...errors import invalid
from ...model import Model
from ...proto import model_config_pb2 as pb
from ...repository.kinds import ModelKind, register
from ..serving.hf_folder import declare_export
from ..serving.model_folder import is_generative
from .model import GenerativeModel
from .signature import complete_generative, is_generative_config

if TYPE_CHECKING:
    from ...repository.lifecycle import ModelRepository


class GenerativeKind(ModelKind):
    name = "generative"
    rank = 20

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        return is_generative(config)

    def recognise(self, msg: pb.ModelConfig, model_dir: Path) -> bool | None:
        export = declare_export(msg, model_dir)
        return None if export is None else export.top_level

    def version_dir(self, config: ModelConfig, model_dir: Path, version: int) -> Path:
        return model_dir if _own_files(config, version) else model_dir / str(version)

    def complete(self, msg: pb.ModelConfig, where: str) -> bool:
        if not is_generative_config(msg):
            return False
        complete_generative(msg, where)
        return True

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        if repository.generation is None:
            raise invalid(f"model '{config.name}' version {version}: generative models are served only by a "
                          "server with a generation registry")
        model_dir = version_dir if _own_files(config, version) else version_dir.parent
        return GenerativeModel(config, version, version_dir / config.default_model_filename,
                               repository.generation, model_dir)


def _own_files(config: ModelConfig, version: int) -> bool:
    """Whether the version is a Hugging Face export's top-level files (serving/hf_folder.py)."""
    return version == 1 and config.parameters.get("hf_export_files") == "."


register(GenerativeKind())
