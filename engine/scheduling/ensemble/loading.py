"""How the repository loads and unloads ensembles (called through the ensemble kind, kind.py, by
engine/repository/lifecycle.py `ModelRepository`).

- `load_composing`: before an ensemble loads, its composing models that serve nothing yet are loaded, as
  Triton's explicit mode does ("loading an ensemble loads its composing models"); in poll mode and at start-up
  they are loading anyway, and the ensemble's load waits for theirs.
- `plan_ensemble`: the ensemble's plan, checked against the composing models that serve now. What fails here
  fails the ensemble alone, in Triton's words ("ensemble e contains models that are not available or
  ambiguous: m", "circular dependency between ensembles: ...", a mapping or tensor mismatch), as an
  `EnsembleFailure`, which the load answers as Triton does: INVALID_ARG "load failed for model 'e': <reason>".
- `dependents`: what the repository API's `unload_dependents` unloads with an ensemble.

A chain of ensembles being loaded is kept in a context variable, so an ensemble that (through others)
contains itself is refused, never loaded forever.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.model_config import ENSEMBLE_PLATFORM, ModelConfig
from ...config.steps import parse_dict, read_config_proto
from ...errors import EngineError
from ...proto import model_config_pb2 as pb
from ...repository.kinds import ComposingFailure
from .plan import EnsemblePlan

if TYPE_CHECKING:
    from ...repository.lifecycle import ModelRepository

log = logging.getLogger("hubserve.repository")

_LOADING: ContextVar[tuple[str, ...]] = ContextVar("hubserve_ensembles_loading", default=())


class EnsembleFailure(ComposingFailure):
    """An ensemble that cannot serve with the composing models there are (INVALID_ARG)."""


def composing_names(model_dir: Path, config_json: dict[str, Any] | None) -> list[str]:
    """The models the ensemble in `model_dir` (or `config_json`) names in its steps; [] for any other model,
    and for a config that cannot be read (its own load says why). Runs on a worker thread."""
    msg = pb.ModelConfig()
    try:
        if config_json is not None:
            parse_dict(config_json, msg, "")
        else:
            msg = read_config_proto(model_dir)
    except (EngineError, OSError):
        return []
    if msg.platform != ENSEMBLE_PLATFORM:
        return []
    return list(dict.fromkeys(step.model_name for step in msg.ensemble_scheduling.step if step.model_name))


async def load_composing(repository: ModelRepository, name: str, model_dir: Path,
                         config_json: dict[str, Any] | None) -> None:
    """Load each composing model of ensemble `name` that has a folder and no ready version. A failure is the
    composing model's own (in the index and its load's answer); the ensemble then reports it unavailable."""
    names = await asyncio.to_thread(composing_names, model_dir, config_json)
    if not names:
        return
    chain = (*_LOADING.get(), name)
    token = _LOADING.set(chain)
    try:
        for composing in names:
            if composing in chain or repository.versions(composing):
                continue
            if repository.folder_problem(composing) is None and (repository.root / composing).is_dir():
                try:
                    await repository.load(composing)
                except EngineError as e:
                    log.error("model %s (in ensemble %s): %s", composing, name, e.message)
    finally:
        _LOADING.reset(token)


def plan_ensemble(repository: ModelRepository, config: ModelConfig) -> EnsemblePlan:
    """The plan of ensemble `config` against the composing versions that serve now; EnsembleFailure if it
    cannot be built."""
    assert config.ensemble is not None
    name = config.name
    composing: list[ModelConfig] = []
    missing: list[str] = []
    for step in config.ensemble.steps:
        try:
            composing.append(repository.get(step.model_name, step.version_str).config)
        except EngineError:
            missing.append(step.model_name)
    loading = _LOADING.get()
    for model in missing:
        if model == name or model in loading or _in_cycle_with(repository, model, name):
            raise EnsembleFailure(f"circular dependency between ensembles: {name} -> ... -> {model} -> "
                                  f"{name}")
    if missing:
        raise EnsembleFailure(f"ensemble {name} contains models that are not available or ambiguous: "
                              f"{', '.join(dict.fromkeys(missing))}")
    cycle = _reaches(repository, name, config, set())
    if cycle is not None:
        raise EnsembleFailure(f"circular dependency between ensembles: {name} -> ... -> {cycle} -> {name}")
    try:
        return EnsemblePlan.build(config, composing)
    except EngineError as e:
        raise EnsembleFailure(e.message) from None


def _in_cycle_with(repository: ModelRepository, model: str, name: str) -> bool:
    """Whether `model` failed to load for a cycle of ensembles that passes through `name`."""
    failure = repository.load_failure(model)
    text = failure.message if failure is not None else ""
    return "circular dependency between ensembles: " in text and f" {name} -> " in text


def _reaches(repository: ModelRepository, target: str, config: ModelConfig, seen: set[str]) -> str | None:
    """The ensemble, among those `config` contains (at any depth, as they serve now), that has `target` as
    a step; None when there is none."""
    assert config.ensemble is not None
    for step in config.ensemble.steps:
        if step.model_name == target:
            return config.name
        if step.model_name in seen:
            continue
        seen.add(step.model_name)
        try:
            inner = repository.get(step.model_name, step.version_str).config
        except EngineError:
            continue
        if inner.ensemble is not None:
            found = _reaches(repository, target, inner, seen)
            if found is not None:
                return found
    return None


def dependents(repository: ModelRepository, name: str) -> list[str]:
    """The models `unload_dependents` unloads with ensemble `name`: its composing models, at any depth, that
    no other loaded ensemble uses. [] when `name` is no loaded ensemble."""
    loaded = {model.name: model.config for model in repository.loaded_models()}
    closure = {name}
    todo = [name]
    while todo:
        config = loaded.get(todo.pop())
        if config is None or config.ensemble is None:
            continue
        for step in config.ensemble.steps:
            if step.model_name not in closure:
                closure.add(step.model_name)
                todo.append(step.model_name)
    used_elsewhere = {step.model_name for other, config in loaded.items()
                      if other not in closure and config.ensemble is not None
                      for step in config.ensemble.steps}
    return sorted(n for n in closure if n != name and n in loaded and n not in used_elsewhere)
