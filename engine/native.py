"""The mypyc-compiled hot path (`make native`: tools/build_native.py), loaded while it matches the sources.

The build compiles the modules in tools/native_modules.txt into build/native/, outside the source folders, and
writes build/native/manifest.json: every extension it made, the Python it was made for, and a hash of every
engine/**/*.py it saw. `install()`, called by engine/__init__.py before any other engine module is imported,
puts a finder ahead of the path finders that serves those extensions, and only when every hash still matches:
mypyc compiles a call from one compiled module to another into C (and may fold in another module's `Final`
constants), so a build whose sources moved on is not loaded at all: compiled and edited code never mix.
Anything else (no build, another
Python, one file changed, added or removed, HUBSERVE_NATIVE=0) leaves the pure-Python modules in charge, and
`status()` says why. Every process that imports `engine` (the server, its frontend workers, a Python model's
stub, the `hubserve` CLI, the tests) decides for itself, from the same files, so they agree.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

MANIFEST_NAME = "manifest.json"
REBUILD_COMMAND = "make native"
# HUBSERVE_NATIVE=0 runs the pure-Python modules even beside a fresh build: for debugging (a traceback with
# source lines, pdb) and for the tests of the fallback. Read once per process, as `engine` is imported.
SWITCH = "HUBSERVE_NATIVE"


@dataclass(frozen=True, slots=True)
class NativeStatus:
    """What this process runs: `modules` compiled from build `build`, or pure Python for `reason`;
    `stale` is true when a build exists but the sources moved on (the server warns, naming the rebuild)."""

    modules: int
    build: str
    reason: str
    stale: bool = False

    @property
    def compiled(self) -> bool:
        return self.modules > 0

    def line(self) -> str:
        """The start-up log's line."""
        if self.compiled:
            return f"native: {self.modules} modules compiled (build {self.build})"
        return f"native: pure Python ({self.reason})"


def source_hashes(root: Path) -> dict[str, str]:
    """sha256 of every engine/**/*.py under `root` (the folder holding `engine`), by its path relative to
    `root` with '/' separators, sorted: what the build records and what `decide` compares."""
    found: dict[str, str] = {}
    for folder, subfolders, files in os.walk(root / "engine"):  # a third of Path.rglob's time: every process
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder, name)
                found[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(found.items()))


def first_difference(built: Mapping[str, str], now: Mapping[str, str]) -> str | None:
    """The first source (in path order) that is not as the build saw it, in words; None if none."""
    for name in sorted(set(built) | set(now)):
        if name not in now:
            return f"{name} was removed"
        if name not in built:
            return f"{name} was added"
        if built[name] != now[name]:
            return f"{name} changed"
    return None


def decide(root: Path, build_dir: Path, switch: str | None) -> tuple[NativeStatus, dict[str, Path]]:
    """Whether this process may load build_dir's extensions for the sources under `root`, and if so the
    file of each module the finder serves (the compiled modules and mypyc's group libraries)."""
    if switch == "0":
        return NativeStatus(0, "", f"{SWITCH}=0"), {}
    manifest_path = build_dir / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return NativeStatus(0, "", f"not built: `{REBUILD_COMMAND}` compiles the hot path"), {}
    except (OSError, ValueError) as exc:
        return NativeStatus(0, "", f"{manifest_path} unreadable: {exc}"), {}
    build = str(manifest.get("build", "?"))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if manifest.get("ext_suffix") != suffix:
        return NativeStatus(0, build, f"build {build} is for {manifest.get('ext_suffix')}, this Python loads "
                                      f"{suffix}; rebuild with `{REBUILD_COMMAND}`", stale=True), {}
    files = {name: build_dir / rel for name, rel in dict(manifest["extensions"]).items()}
    missing = next((path for path in files.values() if not path.is_file()), None)
    if missing is not None:
        return NativeStatus(0, build, f"build {build} lacks {missing}; rebuild with `{REBUILD_COMMAND}`",
                            stale=True), {}
    changed = first_difference(dict(manifest["sources"]), source_hashes(root))
    if changed is not None:
        return NativeStatus(0, build, f"{changed} since build {build}; rebuild with `{REBUILD_COMMAND}`",
                            stale=True), {}
    return NativeStatus(len(manifest["modules"]), build, ""), files


class NativeFinder:
    """A meta-path finder for the compiled modules and their group libraries (`<group>__mypyc`, which each
    module's shim imports by name): ahead of the path finders, so the pure `.py` beside them is not found."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self._files = dict(files)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self._files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.machinery.ModuleSpec(fullname, loader, origin=str(file))

    def invalidate_caches(self) -> None:
        """Nothing cached: the decision is the process's, made once."""


_status: NativeStatus | None = None


def install(root: Path) -> NativeStatus:
    """Decide once per process (engine/__init__.py calls this) and, when the build matches, put the finder
    first on sys.meta_path. Later calls return the first decision."""
    global _status
    if _status is None:
        status, files = decide(root, root / "build" / "native", os.environ.get(SWITCH))
        if files:
            sys.meta_path.insert(0, NativeFinder(files))
        _status = status
    return _status


def status() -> NativeStatus:
    """This process's decision (made when `engine` was imported)."""
    return install(Path(__file__).resolve().parent.parent)

