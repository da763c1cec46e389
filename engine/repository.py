"""The model repository: what is on disk, what is loaded, and routing a request to a ready version.

Layout (Triton's): `<root>/<model>/config.pbtxt|config.yaml` and `<root>/<model>/<version>/<model file>`.
Loading runs off the event loop (model files are read and sessions built on worker threads). A reload builds
the new versions beside the old ones and switches routing only when they are READY; the old versions then
drain and unload. A model that fails to load is UNAVAILABLE with the reason, and never takes others down.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import backends
from .config import (ModelConfig, autocomplete, backend_of, default_filename, parse_dict, read_config_proto,
                     validate, version_policy_of)
from .errors import EngineError, ErrorCode, invalid, not_found, unavailable
from .model import Model, ModelState
from .proto import model_config_pb2 as pb
from .scheduler import RateLimiter

log = logging.getLogger("hubserve.repository")


@dataclass(slots=True)
class IndexEntry:
    name: str
    version: str
    state: ModelState
    reason: str = ""


@dataclass(eq=False)
class ModelEntry:
    """Everything known about one model folder. `versions` holds the versions that serve traffic."""

    name: str
    versions: dict[int, Model] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason
    error: str = ""  # a model-level failure (bad config, no versions)
    state: ModelState = ModelState.LOADING
    fingerprint: Any = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, m in self.versions.items() if m.state is ModelState.READY)


def fingerprint(model_dir: Path) -> tuple:
    """What changes when a user edits, adds or removes files: (relative path, size, mtime) of each file."""
    items = []
    for path in sorted(model_dir.rglob("*")):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            items.append((str(path.relative_to(model_dir)), st.st_size, st.st_mtime_ns))
    return tuple(items)


class ModelRepository:
    def __init__(self, root: Path, limiter: RateLimiter, gpus: tuple[int, ...] = ()) -> None:
        self.root = root
        self._limiter = limiter
        self._gpus = gpus
        self._models: dict[str, ModelEntry] = {}

    # ------------------------------------------------------------------ routing

    def get(self, name: str, version: str = "") -> Model:
        """The model version a request goes to: the named one, or the highest ready one."""
        entry = self._models.get(name)
        if entry is None:
            raise not_found(f"unknown model '{name}'")
        if version:
            try:
                number = int(version)
            except ValueError:
                raise invalid(f"model version must be a number, got '{version}'") from None
            model = entry.versions.get(number)
            if model is None:
                if number in entry.failed:
                    raise unavailable(f"model '{name}' version {number} is unavailable: {entry.failed[number]}")
                raise not_found(f"unknown version {number} of model '{name}'")
            if model.state is not ModelState.READY:
                raise unavailable(f"model '{name}' version {number} is {model.state.value.lower()}")
            return model
        ready = entry.ready_versions()
        if not ready:
            reason = entry.error or "; ".join(f"version {v}: {r}" for v, r in sorted(entry.failed.items()))
            raise unavailable(f"model '{name}' is not ready" + (f": {reason}" if reason else ""))
        return entry.versions[ready[-1]]

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except EngineError:
            return False
        return True

    def versions(self, name: str) -> list[int]:
        entry = self._models.get(name)
        return entry.ready_versions() if entry else []

    def all_ready(self) -> bool:
        return all(e.ready_versions() for e in self._models.values())

    def loaded_models(self) -> list[Model]:
        return [m for e in self._models.values() for m in e.versions.values()]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        out: list[IndexEntry] = []
        names = sorted(set(self._models) | set(self._on_disk()))
        for name in names:
            entry = self._models.get(name)
            if entry is None:
                out.append(IndexEntry(name, "", ModelState.UNAVAILABLE, "not loaded"))
                continue
            rows = [IndexEntry(name, str(v), m.state) for v, m in sorted(entry.versions.items())]
            rows += [IndexEntry(name, str(v), ModelState.UNAVAILABLE, r) for v, r in sorted(entry.failed.items())]
            if not rows:
                rows = [IndexEntry(name, "", entry.state, entry.error)]
            out += rows
        if ready_only:
            out = [r for r in out if r.state is ModelState.READY]
        return out

    def _on_disk(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        await asyncio.gather(*(self.load(name) for name in self._on_disk()))

    async def poll(self) -> None:
        """Reconcile with the disk: load new or changed models once their files stop changing, unload
        removed ones. Never raises: a failure is recorded on that model."""
        on_disk = set(self._on_disk())
        for name in sorted(set(self._models) - on_disk):
            await self.unload(name)
        pending = []
        for name in sorted(on_disk):
            fp = await asyncio.to_thread(fingerprint, self.root / name)
            entry = self._models.get(name)
            if entry is None or entry.fingerprint != fp:
                pending.append((name, fp))
        if not pending:
            return
        await asyncio.sleep(0.2)  # a copy in progress is not a model: load only what stopped changing
        stable = [name for name, fp in pending if await asyncio.to_thread(fingerprint, self.root / name) == fp]
        await asyncio.gather(*(self.load(name) for name in stable))

    async def load(self, name: str, config_json: dict[str, Any] | None = None) -> None:
        """Load or reload a model: every version its policy selects. New versions become READY beside the
        old ones before routing moves; the old ones then drain and unload."""
        model_dir = self.root / name
        if not model_dir.is_dir():
            raise not_found(f"no model folder '{name}' in repository {self.root}")
        entry = self._models.setdefault(name, ModelEntry(name))
        async with entry.lock:
            fp = await asyncio.to_thread(fingerprint, model_dir)
            try:
                config, selected = await asyncio.to_thread(self._read_config, name, model_dir, config_json)
            except EngineError as e:
                self._record_model_failure(entry, e.message)
                entry.fingerprint = fp
                return
            entry.error = ""
            entry.fingerprint = fp
            old = entry.versions
            new: dict[int, Model] = {}
            failed: dict[int, str] = {}
            results = await asyncio.gather(
                *(self._load_version(config, model_dir, v) for v in selected), return_exceptions=True
            )
            for version, result in zip(selected, results):
                if isinstance(result, Model):
                    new[version] = result
                else:
                    failed[version] = result.message if isinstance(result, EngineError) else repr(result)
                    log.error("model %s version %d UNAVAILABLE: %s", name, version, failed[version])
            # Keep an old version serving when its replacement failed (a failed reload is not an outage).
            for version, reason in list(failed.items()):
                if version in old and old[version].state is ModelState.READY:
                    new[version] = old[version]
                    log.warning("model %s version %d: reload failed, keeping the loaded one: %s",
                                name, version, reason)
                    del failed[version]
            entry.versions = new
            entry.failed = failed
            entry.state = ModelState.READY if new else ModelState.UNAVAILABLE
            for version, model in new.items():
                if old.get(version) is not model:
                    log.info("model %s version %d READY", name, version)
            retired = [m for v, m in old.items() if new.get(v) is not m]
        await asyncio.gather(*(self._retire(m) for m in retired))

    def _record_model_failure(self, entry: ModelEntry, reason: str) -> None:
        entry.error = reason
        if not entry.versions:
            entry.state = ModelState.UNAVAILABLE
        log.error("model %s UNAVAILABLE: %s", entry.name, reason)

    def _read_config(self, name: str, model_dir: Path, config_json: dict[str, Any] | None
                     ) -> tuple[ModelConfig, list[int]]:
        """Parse → auto-complete → validate, and pick the versions to serve. Runs on a worker thread."""
        where = f"model '{name}'"
        if config_json is not None:
            msg = pb.ModelConfig()
            parse_dict(config_json, msg, f"{where} (config override)")
        else:
            msg = read_config_proto(model_dir)
        if msg.name and msg.name != name:
            raise invalid(f"{where}: config name '{msg.name}' does not match the folder name '{name}'")
        backend = backend_of(msg, where)
        if not backend and not msg.backend:
            backend = "onnxruntime"  # a config-less folder holding model.onnx
            msg.backend = backend
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
        if not versions:
            raise invalid(f"{where}: no version folders (e.g. '{model_dir}/1/model.onnx')")
        selected = version_policy_of(msg).select(versions)
        if not selected:
            raise invalid(f"{where}: the version policy selects none of the versions {versions}")
        filename = msg.default_model_filename or default_filename(backend)
        io = None
        latest_file = model_dir / str(selected[-1]) / filename
        if latest_file.exists():
            io = backends.describe(backend, latest_file)
        autocomplete(msg, io, name)
        return validate(msg, where), selected

    async def _load_version(self, config: ModelConfig, model_dir: Path, version: int) -> Model:
        path = model_dir / str(version) / config.default_model_filename
        if config.backend != "identity" and not path.exists():
            raise invalid(f"model '{config.name}' version {version}: missing model file {path}")
        log.info("model %s version %d LOADING", config.name, version)
        model = Model(config, version, path, self._gpus, self._limiter)
        await model.start()
        return model

    async def _retire(self, model: Model) -> None:
        log.info("model %s version %d UNLOADING", model.name, model.version)
        await model.stop()
        log.info("model %s version %d unloaded", model.name, model.version)

    async def unload(self, name: str) -> None:
        entry = self._models.get(name)
        if entry is None:
            raise not_found(f"unknown model '{name}'")
        async with entry.lock:
            retired = list(entry.versions.values())
            for model in retired:
                model.state = ModelState.UNLOADING
            del self._models[name]
        await asyncio.gather(*(self._retire(m) for m in retired))

    async def close(self) -> None:
        await asyncio.gather(*(self.unload(name) for name in list(self._models)), return_exceptions=True)


__all__ = ["ModelRepository", "IndexEntry", "ErrorCode"]
