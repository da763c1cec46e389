"""The ensemble kind (engine/repository/kinds.py): a `platform: "ensemble"` model's versions run their steps
on other models (driver.py `EnsembleModel`). Registered when this module is imported (engine/kinds.py).

Its part in a load (loading.py): the composing models load first (`load_first`), the plan is built once
against them as they serve now (`prepare`; an `EnsembleFailure` fails the ensemble alone), and every version
runs that plan. `unload_dependents` takes its composing models no other ensemble uses (`dependents`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.model_config import ModelConfig
from ...model import Model
from ...repository.kinds import ModelKind, register
from . import loading
from .driver import EnsembleModel
from .plan import EnsemblePlan

if TYPE_CHECKING:
    from ...repository.lifecycle import ModelRepository


class EnsembleKind(ModelKind):
    name = "ensemble"
    rank = 10

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        return config.ensemble is not None

    def prepare(self, repository: ModelRepository, config: ModelConfig) -> EnsemblePlan:
        return loading.plan_ensemble(repository, config)

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        return EnsembleModel(config, version, version_dir, prepared, repository)  # the folder holds nothing

    async def load_first(self, repository: ModelRepository, name: str, model_dir: Path,
                         config_json: dict[str, Any] | None) -> None:
        await loading.load_composing(repository, name, model_dir, config_json)

    def dependents(self, repository: ModelRepository, name: str) -> list[str]:
        return loading.dependents(repository, name)


register(EnsembleKind())
