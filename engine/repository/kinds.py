"""Which kind of served version a model folder is: the kind registry, asked by the repository (lifecycle.py).

A kind says which configs it serves (`matches`) and builds their versions (`build`); the repository asks
the registry once per load, after the config is read (`kind_of`), and builds every version of the load with
the kind it got. Kinds, in the order they are asked (`rank`):

    ensembles          engine/scheduling/ensemble/kind.py   steps on other models (`EnsembleModel`)
    generative models  engine/generate/triton/kind.py       requests handed to the generation engine
    Python models      engine/backends/python/kind.py       instances in their own processes (`PythonModel`)
    embedding models   engine/embed/kind.py                 ONNX instances whose folder adds a tokenizer and
                                                            pooling for /v1/embeddings (`EmbeddingModel`)
    instance models    here                                  any other backend's instances (`InstanceModel`)

The first four are plug-ins: each registers itself when its module is imported, and engine/kinds.py (which
the server imports) imports them all. Instance models are the core's own and claim whatever no plug-in
claims, so nothing here, in engine/model.py or in the rest of the repository imports a plug-in. A
repository made without engine/kinds.py imported serves only instance models: a Python model is then
UNAVAILABLE with the reason, its code never run (the backend table names the kind each backend needs:
engine/backends/__init__.py).

Besides building, a kind may take part in a load before its config is frozen (`recognise`: a folder known
by its own files, whose version 1 may be the folder itself, `version_dir`; `complete`, `complete_from_file`:
auto-complete), before it is read (`refuse_upload`, `refuse_override`, `load_first`) and
when a model is unloaded with its dependents (`dependents`). Every registered kind is asked those, in rank
order; the defaults do nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends import BACKENDS
from ..config.model_config import ModelConfig
from ..errors import EngineError, ErrorCode
from ..model import InstanceModel, Model
from ..proto import model_config_pb2 as pb

if TYPE_CHECKING:
    from .lifecycle import ModelRepository


class ComposingFailure(EngineError):
    """A version that cannot be built with the models it is made of as they serve now (an ensemble's steps:
    scheduling/ensemble/loading.py `EnsembleFailure`). INVALID_ARG; the load records it as the model's
    failure, composed of others (`ModelEntry.composing_error`)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)


class ModelKind:
    """One kind of served version. Subclasses override `matches` and `build`, and the hooks they need."""

    name = ""
    rank = 0  # asked in ascending order; the instance kind, asked last, claims everything

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        """Whether versions of `config` (a model in `model_dir`) are this kind's."""
        return False

    def prepare(self, repository: ModelRepository, config: ModelConfig) -> Any:
        """What every version of this load needs and is checked against the other models once (an
        ensemble's plan); passed to `build`. Raises ComposingFailure when the models it needs do not serve.
        Called on the loop, under the model's lock, after `kind_of`."""
        return None

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        """A LOADING version (the repository starts it) from `version_dir` (`<model folder>/<version>`; its
        model file is `version_dir / config.default_model_filename`). Raises EngineError for a version this
        server cannot serve."""
        raise NotImplementedError

    def recognise(self, msg: pb.ModelConfig, model_dir: Path) -> bool | None:
        """Declare, in `msg` (the folder's config as read; empty without a config file), a folder this kind
        knows by its own files rather than by its config (a Hugging Face export: a generative model), before
        its backend and versions are read. None: not this kind's folder; True: its version 1 is the folder's
        own top-level files (it need have no version folders); False: its versions are its version folders.
        On a worker thread."""
        return None

    def version_dir(self, config: ModelConfig, model_dir: Path, version: int) -> Path:
        """Where a version's files are: `<model folder>/<version>`, or the folder itself for a version 1
        that `recognise` said is the folder's own files."""
        return model_dir / str(version)

    def complete(self, msg: pb.ModelConfig, where: str) -> bool:
        """Auto-complete a config this kind declares itself (a generative model's signature), in place;
        False when it is not this kind's, and the backend's model file is then described instead. On a worker
        thread."""
        return False

    def complete_from_file(self, msg: pb.ModelConfig, backend: str, model_file: Path, model_dir: Path,
                           name: str) -> None:
        """After the backend described the latest model file: what this kind adds (a Python model's own
        `auto_complete_config`). On a worker thread; an EngineError is the latest version's failure."""

    def refuse_upload(self, name: str, config_json: dict[str, Any], files: Mapping[str, bytes],
                      serving: Sequence[ModelConfig]) -> None:
        """INVALID_ARG when model files sent with a load (`files`, `<version>/<name>` → bytes, with
        `config_json`) would create or replace a version of this kind, whose code the server would run;
        `serving`: the configs of the model's versions loaded now. Asked on the loop, before the files are
        written, only when the server does not allow that (--allow-python-model-upload)."""

    def refuse_override(self, name: str, model_dir: Path, config_json: dict[str, Any]) -> None:
        """INVALID_ARG when a client's config override (a load without files) would make this kind run
        code the operator did not choose. Asked only when the server does not allow that
        (--allow-python-model-upload); on a worker thread."""

    async def load_first(self, repository: ModelRepository, name: str, model_dir: Path,
                         config_json: dict[str, Any] | None) -> None:
        """Before `name` loads: load what it is made of (an ensemble's composing models). On the loop,
        before the model's lock is taken."""

    def dependents(self, repository: ModelRepository, name: str) -> list[str]:
        """What the repository API's `unload_dependents` unloads with `name`."""
        return []


class InstanceKind(ModelKind):
    """A backend's instances behind the dynamic or sequence batcher (engine/model.py `InstanceModel`)."""

    name = "instances"
    rank = 1000

    def matches(self, config: ModelConfig, model_dir: Path) -> bool:
        return True

    def build(self, repository: ModelRepository, config: ModelConfig, version: int, version_dir: Path,
              prepared: Any) -> Model:
        entry = BACKENDS.get(config.backend)
        if entry is not None and entry.kind:  # a repository made without engine/kinds.py imported
            raise EngineError(ErrorCode.UNAVAILABLE, f"model '{config.name}' version {version}: backend "
                              f"'{config.backend}' is served by the {entry.kind} kind, which this server has "
                              "not registered (engine/kinds.py)")
        return InstanceModel(config, version, version_dir / config.default_model_filename, repository.gpus,
                             repository.limiter, repository.backlog)


_KINDS: list[ModelKind] = [InstanceKind()]


def register(kind: ModelKind) -> None:
    """Add a kind; called once by each plug-in's module when it is imported."""
    _KINDS.append(kind)
    _KINDS.sort(key=lambda k: k.rank)


def kinds() -> tuple[ModelKind, ...]:
    """Every registered kind, in the order they are asked."""
    return tuple(_KINDS)


def kind_of(config: ModelConfig, model_dir: Path) -> ModelKind:
    """The kind that serves `config`: the first, in rank order, that matches it."""
    return next(kind for kind in _KINDS if kind.matches(config, model_dir))


__all__ = ["ComposingFailure", "InstanceKind", "ModelKind", "kind_of", "kinds", "register"]
