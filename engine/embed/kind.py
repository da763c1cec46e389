"""The embedding kind (engine/repository/kinds.py): a folder whose config says `embedding` "true" serves an
ONNX encoder as an instance model (`EmbeddingModel`) whose folder is read while it loads. Registered when
this module is imported (engine/kinds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.model_config import ModelConfig
from ..errors import invalid
from ..model import Model
from ..repository.kinds import ModelKind, register
from .folder import is_embedding
from .model import EmbeddingModel

if TYPE_CHECKING:
    from ..repository.lifecycle import ModelRepository

BACKEND = "onnxruntime"


class EmbeddingKind(ModelKind):
    name = "embedding"
    rank = 40  # after ensembles, generative and Python models; before the instance kind that takes the rest

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        return is_embedding(config)

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        if config.backend != BACKEND:
            raise invalid(f"model '{config.name}': an embedding model is an ONNX export served by the "
                          f"'{BACKEND}' backend, not '{config.backend}'")
        return EmbeddingModel(config, version, version_dir / config.default_model_filename, repository.gpus,
                              repository.limiter, repository.backlog)


register(EmbeddingKind())
