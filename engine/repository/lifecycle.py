"""The model repository's lifecycle: load, reload and unload. Routing and the index:
engine/repository/routing.py; folder fingerprints: engine/repository/fingerprint.py.

Layout (Triton's): `<root>/<model>/config.pbtxt|config.yaml` and `<root>/<model>/<version>/<model file>`; a
folder a kind knows by its own files (`ModelKind.recognise`: a Hugging Face export) may instead hold version
1's files at its top level, with no config file, and its fingerprint is then all version 1's.
Loading runs off the event loop (model files are read and sessions built on worker threads). A reload builds
the new or changed versions beside the serving ones (versions whose files and config did not change are kept)
and switches routing in one step once they are READY, warm-up included; the old versions then drain, unload
and give their memory back (engine/memory.py). A model that fails to load is UNAVAILABLE with the reason and
never takes others down; a failed reload keeps what was serving. Called by the repository API (dataplane.py)
and, in poll mode, by the watcher (watcher.py), which decides when a folder has settled; `ModelEntry.lock`
serializes the loads and unloads of one model.

Only folders inside the repository are served. A model name is one folder name (engine/names.py; the data
plane rejects other names from clients), and, independently of that check, a model folder, its config, version
folders and model files must resolve inside the root, symbolic links followed: a link to elsewhere is refused
on an explicit load and skipped (with one warning, and marked UNAVAILABLE in the index) by `load_all` and the
watcher. Messages that reach clients name files by their path inside the repository (`simple/1/model.onnx`),
never by the server's absolute paths.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from .. import backends
from ..config.model_config import ENSEMBLE_PLATFORM, ModelConfig
from ..config.steps import (
    CONFIG_FILES,
    autocomplete,
    backend_of,
    default_filename,
    parse_dict,
    read_config_proto,
    validate,
    version_policy_of,
)
from ..errors import EngineError, ErrorCode, invalid, not_found
from ..heap import collect_retired
from ..instances.rate_limiter import RateLimiter
from ..lifecycle_log import reload_line
from ..memory import release_freed_memory
from ..model import Model, ModelState
from ..names import name_problem
from ..proto import model_config_pb2 as pb
from ..scheduling.sequence.policy import DEFAULT_BACKLOG, BacklogLimits
from .fingerprint import Fingerprint, fingerprint, split_fingerprint
from .kinds import ComposingFailure, ModelKind, kind_of, kinds
from .load_errors import load_failure_text
from .overrides import remove_override, write_override
from .routing import ModelEntry, RoutingTable, inside

log = logging.getLogger("hubserve.repository")


class _VersionFailure(EngineError):
    """A failure of one version's files met while reading the config (auto-complete reads the latest)."""

    def __init__(self, version: int, error: EngineError) -> None:
        super().__init__(error.code, error.message)
        self.version = version


class ModelRepository(RoutingTable):
    """Loads, reloads and unloads models; routing and the index are the `RoutingTable` it is."""

    def __init__(self, root: Path, limiter: RateLimiter, gpus: tuple[int, ...] = (),
                 allow_python_uploads: bool = False, backlog: BacklogLimits = DEFAULT_BACKLOG,
                 files_root: Path | None = None) -> None:
        super().__init__(root)
        # Where the repository's links may lead besides the repository itself: the folder of a one-model
        # repository (single_model.py), whose files the repository made here links to. None: nowhere.
        self.files_root = files_root
        # What a kind builds an instance model with (kinds.py): the rate limiter, the GPUs, and how many
        # sequences may wait for a slot, per sequence model version.
        self.limiter = limiter
        self.gpus = gpus
        self.backlog = backlog
        # Whether a repository `load` may send a Python model's files (--allow-python-model-upload): a Python
        # model is code the server runs, so by default only the operator's repository folder may hold one.
        self._allow_python_uploads = allow_python_uploads
        # Where a generative model's requests go (engine/generate/serving/registry.py's GenerationRegistry,
        # read by the generative kind: engine/generate/triton/kind.py); set by the server, which makes the
        # registry over this repository. None: such a model fails to load.
        self.generation: Any = None

    async def load_all(self) -> None:
        await asyncio.gather(*(self.load(name) for name in self._on_disk()))

    def loaded_fingerprints(self) -> dict[str, Fingerprint | None]:
        """For the watcher: each loaded model's folder as it was at its last load (None: no folder). The
        repository API cannot load or unload in poll mode (dataplane.py), so the folders alone decide."""
        return {name: entry.fingerprint for name, entry in self._models.items()}

    def folder_names(self) -> set[str]:
        """Every name the watcher looks at: folders on disk and models known here."""
        return set(self._on_disk()) | set(self._models)

    async def reconcile(self, name: str) -> None:
        """Make a model match its folder: (re)load it when the folder exists, unload it when it is gone.
        Called by the watcher once the folder has settled. Never raises: a failure is recorded on that
        model."""
        try:
            if self.folder_problem(name) is None and (self.root / name).is_dir():
                await self.load(name)
            else:
                if name in self._models:
                    await self.unload(name)
                self._retired.pop(name, None)  # the index lists only folders on disk and loaded models
        except EngineError as e:
            log.error("model %s: %s", name, e.message)
        except Exception:
            log.exception("model %s: reconciling with its folder failed", name)

    async def load(self, name: str, config_json: dict[str, Any] | None = None,
                   files: dict[str, bytes] | None = None) -> None:
        """Load or reload a model: every version its policy selects. New or changed versions become READY
        (warm-up included) beside the old ones before routing moves; unchanged ones keep serving; the old
        ones then drain and unload. `files` (`<version>/<name>` → bytes, from the repository API) are loaded
        instead of the repository folder and need `config_json`, as in Triton. INVALID_ARG for a name that is
        not one folder name or a folder that resolves outside the repository; NOT_FOUND for no folder."""
        problem = name_problem(name)
        if problem is not None:
            raise invalid(f"invalid model name: {problem}")
        if files:
            # Triton fails a bad file override as it fails any poll: INTERNAL "failed to load '<name>', failed
            # to poll from model repository" (core model_repository_manager.cc), which its examples match on.
            failed = f"failed to load '{name}', failed to poll from model repository: "
            if config_json is None:
                raise EngineError(ErrorCode.INTERNAL, f"{failed}model '{name}': loading model files needs "
                                                      "the 'config' parameter as well")
            if not self._allow_python_uploads:  # the client's code choice: refused
                entry = self._models.get(name)
                serving = [m.config for m in entry.versions.values()] if entry is not None else []
                for kind in kinds():
                    kind.refuse_upload(name, config_json, files, serving)
            try:
                override = await _write_override(name, files)
            except EngineError as e:
                raise EngineError(ErrorCode.INTERNAL, failed + e.message) from None
            except OSError as e:
                # e.g. a name longer than the file system allows; no server path in the answer
                raise EngineError(ErrorCode.INTERNAL, f"{failed}could not write the model files: {e.strerror}"
                                  ) from None
            try:
                await self._load(name, override, config_json, override)
            finally:  # the sessions hold what they need: the files are not read again after loading
                await asyncio.to_thread(remove_override, override)
            return
        problem = self.folder_problem(name)
        if problem is not None:
            raise invalid(f"failed to load '{name}': {problem}")
        if not (self.root / name).is_dir():
            raise EngineError(ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model "
                              f"repository: it has no folder '{name}'")
        if config_json is not None and not self._allow_python_uploads:  # the client's code choice: refused
            await asyncio.to_thread(_refuse_override, name, self.root / name, config_json)
        await self._load(name, self.root / name, config_json, self.root)

    async def _load(self, name: str, model_dir: Path, config_json: dict[str, Any] | None, base: Path) -> None:
        """Load from `model_dir`, whose files must all resolve inside `base` (the repository root, or the
        override folder)."""
        for kind in kinds():
            await kind.load_first(self, name, model_dir, config_json)
        while True:
            entry = self._models.setdefault(name, ModelEntry(name))
            async with entry.lock:
                if self._models.get(name) is not entry:
                    continue  # unloaded while this load waited: start over with a fresh entry
                retired = await self._load_locked(entry, model_dir, config_json, base)
                break
        await self._retire_all(retired)

    async def _load_locked(self, entry: ModelEntry, model_dir: Path, config_json: dict[str, Any] | None,
                           base: Path) -> list[Model]:
        """The steps of a load, under the model's lock; returns the versions to retire."""
        name = entry.name
        # 1. Remember the folder as it is now: a change made while loading makes the watcher load again.
        entry.fingerprint = await asyncio.to_thread(self.folder_fingerprint, name)
        source = entry.fingerprint if model_dir == self.root / name else \
            await asyncio.to_thread(fingerprint, model_dir)
        try:
            config, selected = await asyncio.to_thread(self._read_config, name, model_dir, config_json, base)
            kind = kind_of(config, model_dir)  # which kind of version every one of this load is
            prepared = kind.prepare(self, config)
        except ComposingFailure as e:
            reason = load_failure_text(e, model_dir, name, self.root)
            self._record_model_failure(entry, reason, composing=True)
            return []
        except _VersionFailure as e:
            self._record_model_failure(entry, load_failure_text(e, model_dir, name, self.root), e.version)
            return []
        except (EngineError, OSError) as e:  # OSError: a folder or file the server may not read
            self._record_model_failure(entry, load_failure_text(e, model_dir, name, self.root))
            return []
        entry.error, entry.composing_error = "", False
        # 2. Build what changed beside what serves; keep a version built from the same files and config.
        parts = split_fingerprint(source)
        keys = {v: (str(model_dir), parts.get(""), parts.get(str(v)), config.proto_bytes) for v in selected}
        old = entry.versions
        new = {v: old[v] for v in selected
               if v in old and old[v].state is ModelState.READY and entry.version_keys.get(v) == keys[v]}
        to_load = [v for v in selected if v not in new]
        failed: dict[int, str] = {}
        results = await asyncio.gather(
            *(self._load_version(config, model_dir, v, base, kind, prepared) for v in to_load),
            return_exceptions=True
        )
        for version, result in zip(to_load, results, strict=True):
            if isinstance(result, Model):
                new[version] = result
                log.info("model %s version %d READY", name, version)
            else:
                failed[version] = load_failure_text(result, model_dir, name, self.root)
                log.error("model %s version %d UNAVAILABLE: %s", name, version, failed[version])
        version_keys = {v: keys[v] for v in new}
        # 3. A failed reload is not an outage: while anything failed, every version that served keeps serving.
        if failed:
            for version, model in old.items():
                if new.get(version) is None and model.state is ModelState.READY:
                    new[version] = model
                    version_keys[version] = entry.version_keys.get(version, ())
                    log.warning("model %s version %d keeps serving: the reload failed", name, version)
        # 4. Switch routing in one step, then hand back what no longer serves.
        line = reload_line(name, {v: entry.version_keys.get(v, ()) for v in old}, version_keys,
                           kept=[v for v in new if old.get(v) is new[v]]) if old and not failed else None
        if line is not None:  # a reload that went through and changed something
            log.info("%s", line)
        entry.versions, entry.failed, entry.version_keys = new, failed, version_keys
        retired = self._retired.setdefault(name, set())
        retired.difference_update(new)
        retired.update(v for v in old if v not in new)
        entry.state = ModelState.READY if new else ModelState.UNAVAILABLE
        return [m for v, m in old.items() if new.get(v) is not m]

    def _record_model_failure(self, entry: ModelEntry, reason: str, version: int | None = None,
                              composing: bool = False) -> None:
        """A failure before any version could be built (config, auto-complete, an ensemble's composing
        models): what served keeps serving. The reason goes to that `version` when the failure was in its
        files, else to the model."""
        entry.composing_error = composing
        if version is None:
            entry.error = reason
        else:
            entry.error, entry.failed = "", {version: reason}
        what = f"model {entry.name}" + ("" if version is None else f" version {version}")
        if entry.versions:
            log.error("%s: reload failed: %s", what, reason)
            for v in sorted(entry.versions):
                log.warning("model %s version %d keeps serving: the reload failed", entry.name, v)
            return
        entry.state = ModelState.UNAVAILABLE
        log.error("%s UNAVAILABLE: %s", what, reason)

    def _outside(self, where: str, path: Path, shown: str, base: Path) -> None:
        """INVALID_ARG when `path` resolves outside `base`: a symbolic link (or a `../` in the config's
        default_model_filename) must not make the server read files outside the repository."""
        allowed = inside(path, base) or (base == self.root and self.files_root is not None
                                          and inside(path, self.files_root))
        if not allowed:
            raise invalid(f"{where}: '{shown}' resolves outside the model repository (a symbolic link to "
                          "elsewhere?); model files are read only from inside the repository")

    def _read_config(self, name: str, model_dir: Path, config_json: dict[str, Any] | None, base: Path
                     ) -> tuple[ModelConfig, list[int]]:
        """Parse → auto-complete → validate, and pick the versions to serve. Runs on a worker thread."""
        where = f"model '{name}'"
        if config_json is not None:
            msg = pb.ModelConfig()
            parse_dict(config_json, msg, f"{where} (config override)")
        else:
            for filename in CONFIG_FILES:
                if os.path.lexists(model_dir / filename):
                    self._outside(where, model_dir / filename, f"{name}/{filename}", base)
            msg = read_config_proto(model_dir, name)
        if msg.name and msg.name != name:
            raise invalid(f"{where}: config name '{msg.name}' does not match the folder name '{name}'")
        # a folder a kind knows by its own files (a Hugging Face export: engine/generate/triton/kind.py)
        recognised = [r for r in (kind.recognise(msg, model_dir) for kind in kinds()) if r is not None]
        backend = backend_of(msg, where)
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
        if not versions and any(recognised):  # its own top-level files are its version 1
            versions = [1]
        if not backend and not msg.backend:
            # A config-less folder: model.onnx, or a Python model's model.py (as Triton tells them apart).
            latest = model_dir / str(versions[-1]) if versions else model_dir
            script = (latest / "model.py").is_file() and not (latest / "model.onnx").exists()
            backend = "python" if script else "onnxruntime"
            msg.backend = backend
        if not versions:
            raise invalid(f"{where}: no version folders (e.g. '{name}/1/model.onnx')")
        selected = version_policy_of(msg).select(versions)
        if not selected:
            raise invalid(f"{where}: the version policy selects none of the versions {versions}")
        filename = msg.default_model_filename or default_filename(backend)
        io = None
        latest_file = model_dir / str(selected[-1]) / filename
        # a kind that completes its config from its declaration (a generative model's Triton LLM signature)
        completed = any(kind.complete(msg, where) for kind in kinds())
        if not completed and latest_file.exists() and backend != ENSEMBLE_PLATFORM:
            try:
                self._outside(where, latest_file, f"{name}/{selected[-1]}/{filename}", base)
                io = backends.describe(backend, latest_file, name)
                for kind in kinds():  # e.g. a Python model's own auto_complete_config
                    kind.complete_from_file(msg, backend, latest_file, model_dir, name)
            except EngineError as e:
                raise _VersionFailure(selected[-1], e) from None
        autocomplete(msg, io, name)
        return validate(msg, where, model_dir), selected

    async def _load_version(self, config: ModelConfig, model_dir: Path, version: int, base: Path,
                            kind: ModelKind, prepared: Any) -> Model:
        version_dir = kind.version_dir(config, model_dir, version)
        path = version_dir / config.default_model_filename
        where = f"model '{config.name}' version {version}"
        shown = "/".join((config.name, *version_dir.relative_to(model_dir).parts,
                          config.default_model_filename))
        self._outside(where, path, shown, base)
        entry = backends.BACKENDS.get(config.backend)  # none for an ensemble: its steps run other models
        if entry is not None and entry.needs_file and not path.exists():
            raise invalid(f"{where}: missing model file {shown}")
        log.info("model %s version %d LOADING", config.name, version)
        model = kind.build(self, config, version, version_dir, prepared)
        await model.start()
        return model

    async def _retire_all(self, models: list[Model]) -> None:
        """Drain and free versions that no longer receive requests, then give their memory back."""
        if not models:
            return
        await asyncio.gather(*(self._retire(m) for m in models))
        collect_retired()  # their cycles, frozen with the rest when the server started (engine/heap.py)
        await asyncio.to_thread(release_freed_memory)

    async def _retire(self, model: Model) -> None:
        entry = self._models.get(model.name)
        if entry is not None and entry.versions.get(model.version) not in (None, model):
            # A reload replaced this copy (its line said so): the version serves on, so no UNLOADING.
            await model.stop()
            log.info("model %s version %d: the previous copy drained and freed", model.name, model.version)
            return
        log.info("model %s version %d UNLOADING", model.name, model.version)
        await model.stop()
        log.info("model %s version %d unloaded", model.name, model.version)

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop routing to every version of the model, then drain and free them. With `unload_dependents`
        (the repository API's parameter), an ensemble's composing models that no other loaded ensemble uses
        are unloaded too."""
        entry = self._models.get(name)
        if entry is None:
            raise not_found(f"unknown model '{name}'")
        if unload_dependents:
            composing = [other for kind in kinds() for other in kind.dependents(self, name)]
            await self.unload(name)
            for other in composing:
                if other in self._models:
                    await self.unload(other)
            return
        async with entry.lock:
            if self._models.get(name) is not entry:
                return  # unloaded by another call while this one waited
            retired = list(entry.versions.values())
            for model in retired:
                model.state = ModelState.UNLOADING
            self._retired.setdefault(name, set()).update(entry.versions)
            del self._models[name]
        await self._retire_all(retired)

    async def close(self) -> None:
        await asyncio.gather(*(self.unload(name) for name in list(self._models)),
                             return_exceptions=True)


def _refuse_override(name: str, model_dir: Path, config_json: dict[str, Any]) -> None:
    """INVALID_ARG when a client's config override would choose code the server runs (a Python model's:
    engine/backends/python/overrides.py, through its kind). On a worker thread."""
    for kind in kinds():
        kind.refuse_override(name, model_dir, config_json)


async def _write_override(name: str, files: dict[str, bytes]) -> Path:
    """`write_override` on a worker thread. Should the caller be cancelled (a client that went away) while the
    files are written, the folder is removed once written rather than left behind."""
    future = asyncio.get_running_loop().run_in_executor(None, write_override, name, files)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        def remove(f: asyncio.Future[Path]) -> None:
            if not f.cancelled() and f.exception() is None:
                remove_override(f.result())  # a quick rmtree of what the request had sent

        future.add_done_callback(remove)
        raise


__all__ = ["ModelRepository"]
