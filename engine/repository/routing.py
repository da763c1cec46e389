"""Routing and the index: which loaded version a request goes to, and what the repository lists.

`RoutingTable` holds every model known to the server (`ModelEntry`: its serving versions, failures and the
folder fingerprint of its last load) and answers the questions asked on every request and by the
repository API: `get` (the version a request goes to), readiness, `load_failure`, and `index` (every model on
disk or loaded, one row per version, as Triton lists them). It changes nothing; `ModelRepository`
(engine/repository/lifecycle.py), which loads and unloads, is a `RoutingTable` and writes its entries. Error
messages begin with Triton's words, which clients match on.

What may be a model folder is decided here too, because the index lists folders on disk: a model name is one
folder name (engine/names.py), and its folder must resolve inside the repository root, symbolic links
followed. A folder that breaks either rule is skipped with one warning, and listed UNAVAILABLE in the index
with the reason when its name is a model name.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mypy_extensions import mypyc_attr

from ..errors import EngineError, ErrorCode, invalid, not_found, unavailable
from ..model import Model, ModelState
from ..names import name_problem
from .fingerprint import Fingerprint, fingerprint

log = logging.getLogger("hubserve.repository")


@dataclass(slots=True)
class IndexEntry:
    """One row of the repository index: a model version (or "" for the model as a whole) and its state."""

    name: str
    version: str
    state: ModelState
    reason: str = ""


@dataclass(eq=False)
class ModelEntry:
    """Everything known about one model. `versions` holds the versions that serve traffic; `fingerprint` is
    the repository folder as it was when the model was last loaded (None: no such folder), which the watcher
    compares with the disk; `version_keys` say what each serving version was built from, so a reload rebuilds
    only the versions whose files or config changed."""

    name: str
    versions: dict[int, Model] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason
    error: str = ""  # a model-level failure (bad config, no versions, an ensemble's composing models)
    composing_error: bool = False  # `error` is an ensemble's, against its composing models
    state: ModelState = ModelState.LOADING
    fingerprint: Fingerprint | None = None
    version_keys: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The version a request without one goes to, and the `versions` it was picked from: asked on every
    # request, so worked out once per change. A load replaces `versions` (never mutates it) and every version
    # enters it READY, so the cache holds while `versions` is the same object and the pick is still READY.
    _routed: tuple[dict[int, Model], Model] | None = field(default=None, repr=False)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, m in self.versions.items() if m.state is ModelState.READY)

    def routed(self) -> Model | None:
        """The highest READY version, or None when no version is READY."""
        cached = self._routed
        if cached is not None and cached[0] is self.versions and cached[1].state is ModelState.READY:
            return cached[1]
        ready = self.ready_versions()
        if not ready:
            self._routed = None
            return None
        model = self.versions[ready[-1]]
        self._routed = (self.versions, model)
        return model


def parse_version(version: str) -> int:
    """A requested version string as a number, refused in Triton's words (server src/common.cc)."""
    if version.isascii() and version.isdigit():
        return int(version)
    if version.startswith("-") and version[1:].isascii() and version[1:].isdigit():
        raise invalid(f"invalid model version specified '{version}' , "
                      "version should be an integral value > 0")
    raise invalid(f"failed to get model version from specified version string '{version}', "
                  "version should be an integral value > 0")


def inside(path: Path, base: Path) -> bool:
    """Whether `path` lies in `base`, both with symbolic links resolved (`path` need not exist)."""
    try:
        return path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError, ValueError):  # a symbolic-link loop, a NUL byte: not a usable path
        return False


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in modules mypyc leaves uncompiled
class RoutingTable:
    """The models known to the server, read on every request. Written only by `ModelRepository`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, ModelEntry] = {}
        # Versions that served and were unloaded since (by an unload, or a reload that dropped them), listed
        # in the index as Triton lists them until they serve again.
        self._retired: dict[str, set[int]] = {}
        self._warned: set[str] = set()  # folders skipped with a warning already

    def get(self, name: str, version: str = "") -> Model:
        """The model version a request goes to: the named one, or the highest ready one. The messages start
        with Triton's words (core model_repository_manager.cc / model_lifecycle.cc, server common.cc), which
        clients match on; ours follow them."""
        entry = self._models.get(name)
        if entry is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version:
            number = parse_version(version)
            model = entry.versions.get(number)
            if model is None:
                if number in entry.failed:
                    raise unavailable(f"Request for unknown model: '{name}' version {number} is not at ready "
                                      f"state: {entry.failed[number]}")
                raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
            if model.state is not ModelState.READY:
                why = f": {model.reason}" if model.reason else f" ({model.state.value.lower()})"
                raise unavailable(f"Request for unknown model: '{name}' version {number} is not at ready "
                                  f"state{why}")
            return model
        model = entry.routed()
        if model is None:
            reason = entry.error or "; ".join(f"version {v}: {r}" for v, r in sorted(entry.failed.items())) \
                or "; ".join(f"version {v}: {m.reason}" for v, m in sorted(entry.versions.items())
                             if m.reason)
            raise unavailable(f"Request for unknown model: '{name}' has no available versions"
                              + (f": {reason}" if reason else f" (it is {entry.state.value.lower()})"))
        return model

    def load_failure(self, name: str) -> EngineError | None:
        """Why the last load of `name` failed, in Triton's words and codes (core model_repository_manager.cc):
        a model that could not be read is INTERNAL "failed to load 'X', failed to poll from model repository";
        versions that failed are INVALID_ARG "load failed for model 'X': version N is at UNAVAILABLE state:
        ...;". None when it loaded. A failed reload is a failure even though what served keeps serving."""
        entry = self._models.get(name)
        if entry is None:
            return EngineError(ErrorCode.INTERNAL,
                               f"failed to load '{name}', failed to poll from model repository")
        if entry.error and entry.composing_error:  # Triton's form for an ensemble's dependency check
            return invalid(f"load failed for model '{name}': {entry.error}")
        if entry.error:
            return EngineError(ErrorCode.INTERNAL,
                               f"failed to load '{name}', failed to poll from model repository: "
                               f"{entry.error}")
        if entry.failed:
            states = "".join(f"version {v} is at UNAVAILABLE state: {r};"
                             for v, r in sorted(entry.failed.items()))
            return invalid(f"load failed for model '{name}': {states}")
        if not entry.ready_versions():
            return EngineError(ErrorCode.INTERNAL, f"failed to load '{name}', no version is available")
        return None

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
        """Every model on disk or loaded, one row per version, as Triton lists them: serving versions with
        their state, versions whose last (re)load failed as UNAVAILABLE with the reason (beside the one
        still serving, if any), versions unloaded since as UNAVAILABLE "unloaded"."""
        out: list[IndexEntry] = []
        on_disk, refused = self._scan()
        names = sorted(set(self._models) | set(on_disk) | set(refused))
        for name in names:
            entry = self._models.get(name)
            retired = self._retired.get(name, set())
            if entry is None:
                rows = [IndexEntry(name, str(v), ModelState.UNAVAILABLE, "unloaded") for v in sorted(retired)]
                out += rows or [IndexEntry(name, "", ModelState.UNAVAILABLE, refused.get(name, "not loaded"))]
                continue
            rows = [IndexEntry(name, str(v), m.state, m.reason) for v, m in entry.versions.items()]
            rows += [IndexEntry(name, str(v), ModelState.UNAVAILABLE, r) for v, r in entry.failed.items()]
            rows += [IndexEntry(name, str(v), ModelState.UNAVAILABLE, "unloaded") for v in retired
                     if v not in entry.versions and v not in entry.failed]
            rows.sort(key=lambda r: int(r.version))
            if entry.error:  # a failure no version can be blamed for (e.g. the config), beside what serves
                rows.append(IndexEntry(name, "", ModelState.UNAVAILABLE if entry.versions else entry.state,
                                       entry.error))
            out += rows or [IndexEntry(name, "", entry.state)]
        if ready_only:
            out = [r for r in out if r.state is ModelState.READY]
        return out

    def _on_disk(self) -> list[str]:
        return self._scan()[0]

    def _scan(self) -> tuple[list[str], dict[str, str]]:
        """The model folders on disk that can be served, and those refused with the reason (a folder that
        resolves outside the repository). Folders whose names are no model names are left out of both.
        Each skipped folder is logged once."""
        try:
            folders = [p.name for p in self.root.iterdir() if not p.name.startswith(".") and p.is_dir()]
        except OSError as e:
            log.error("cannot list the model repository: %s", e.strerror or e)
            return [], {}
        servable: list[str] = []
        refused: dict[str, str] = {}
        for name in folders:
            problem = self.folder_problem(name)
            if problem is None:
                servable.append(name)
                continue
            if name_problem(name) is None:
                refused[name] = problem
            if name not in self._warned:
                self._warned.add(name)
                log.warning("skipping folder %r of the model repository: %s", name, problem)
        return sorted(servable), refused

    def folder_problem(self, name: str) -> str | None:
        """Why `<root>/<name>` cannot be a model folder (a name that is not one folder name; a folder that
        resolves outside the repository), or None. Says nothing of whether the folder exists."""
        problem = name_problem(name)
        if problem is not None:
            return f"invalid model name: {problem}"
        if not inside(self.root / name, self.root):
            return (f"the folder of model '{name}' resolves outside the model repository (a symbolic link to "
                    "elsewhere?); models are served only from folders inside the repository")
        return None

    def folder_fingerprint(self, name: str) -> Fingerprint | None:
        """The fingerprint of model `name`'s folder; None when there is none or it cannot be a model folder
        (so the watcher treats it as absent, and never scans a tree outside the repository). Runs on a
        worker thread."""
        if self.folder_problem(name) is not None:
            return None
        return fingerprint(self.root / name)
