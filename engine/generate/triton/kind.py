"""The generative kind (engine/repository/kinds.py): a folder whose config declares `generation` serves
Triton's LLM signature (signature.py) over the generation engine (model.py `GenerativeModel`). Registered
when this module is imported (engine/kinds.py).

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
        return GenerativeModel(config, version, version_dir / config.default_model_filename,
                               repository.generation)


register(GenerativeKind())
