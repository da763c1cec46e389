"""engine/native.py's decision, on the real build `make native` wrote (build/native): a copy of this
checkout's sources beside it runs the listed modules compiled; one edited or added source, or
HUBSERVE_NATIVE=0, runs every module as pure Python and says why; tools/build_native.py without a compiler
writes nothing and says so in one line. Each case is a fresh interpreter, as a server or its children are:
the decision is made once, as `engine` is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import native

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "native"
BUILT, _ = native.decide(ROOT, BUILD, None)
needs_build = pytest.mark.skipif(not BUILT.compiled, reason=f"{BUILT.line()}: no fresh build to load")

REPORT = """
import importlib, json, sys
import engine.native
modules = {name: importlib.import_module(name) for name in sys.argv[1:]}
status = engine.native.status()
print(json.dumps({"line": status.line(), "stale": status.stale,
                  "files": {name: module.__file__ for name, module in modules.items()},
                  "loaders": sorted({type(module.__spec__.loader).__name__ for module in modules.values()}),
                  "groups": sorted(name for name in sys.modules if name.endswith("__mypyc"))}))
"""


def checkout(into: Path) -> Path:
    """A copy of this checkout's engine/ and tools/, with the real build/native linked beside it."""
    shutil.copytree(ROOT / "engine", into / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tools", into / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    if BUILD.is_dir():
        (into / "build").mkdir()
        (into / "build" / "native").symlink_to(BUILD)
    return into


def report(root: Path, *modules: str, switch: str | None = None) -> dict:
    """What a fresh interpreter importing `engine` from `root` runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", native.SWITCH)}
    env["PYTHONPATH"] = str(root)
    if switch is not None:
        env[native.SWITCH] = switch
    done = subprocess.run([sys.executable, "-c", REPORT, *modules], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def manifest() -> dict:
    return json.loads((BUILD / native.MANIFEST_NAME).read_text())


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkout(tmp_path_factory.mktemp("checkout"))


@needs_build
def test_a_fresh_build_serves_every_listed_module_compiled(copy: Path):
    built = manifest()
    seen = report(copy, *built["modules"])
    assert seen["line"] == f"native: {len(built['modules'])} modules compiled (build {BUILT.build})"
    assert seen["loaders"] == ["ExtensionFileLoader"]
    assert all(Path(file).is_relative_to(copy / "build" / "native") for file in seen["files"].values())
    # the group libraries the modules' shims import by name, served by the finder too
    assert seen["groups"] == sorted(name for name in built["extensions"] if name.endswith("__mypyc"))
    assert seen["groups"]


@needs_build
def test_an_edited_source_runs_everything_pure_and_names_the_file_and_the_rebuild(tmp_path: Path):
    root = checkout(tmp_path)
    with (root / "engine" / "types.py").open("a") as source:
        source.write("\n# edited after the build\n")
    seen = report(root, "engine.types", "engine.dataplane")
    assert seen["stale"] is True
    assert seen["line"] == (f"native: pure Python (engine/types.py changed since build {BUILT.build}; "
                            "rebuild with `make native`)")
    assert seen["loaders"] == ["SourceFileLoader"]  # the unedited dataplane too: one group, all or nothing
    assert seen["groups"] == []


@needs_build
def test_an_added_source_makes_the_build_stale(tmp_path: Path):
    root = checkout(tmp_path)
    (root / "engine" / "scheduling" / "extra.py").write_text("VALUE = 1\n")
    seen = report(root, "engine.dataplane")
    assert seen["line"].startswith("native: pure Python (engine/scheduling/extra.py was added since build")
    assert seen["loaders"] == ["SourceFileLoader"]


def test_the_switch_runs_pure_python_beside_any_build(copy: Path):
    seen = report(copy, "engine.dataplane", switch="0")
    assert seen == {"line": "native: pure Python (HUBSERVE_NATIVE=0)", "stale": False,
                    "files": {"engine.dataplane": str(copy / "engine" / "dataplane.py")},
                    "loaders": ["SourceFileLoader"], "groups": []}


def test_without_a_compiler_the_build_says_so_in_one_line_and_the_tree_stays_pure(tmp_path: Path):
    root = checkout(tmp_path)
    shutil.rmtree(root / "build")
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    done = subprocess.run([sys.executable, str(root / "tools" / "build_native.py")], env=env, cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (f"native: not compiled, no C compiler ({tmp_path / 'no-such-cc'} not found); "
                           "the server runs as pure Python\n")
    assert not (root / "build").exists()
    seen = report(root, "engine.dataplane")
    assert seen["line"] == "native: pure Python (not built: `make native` compiles the hot path)"
    assert seen["loaders"] == ["SourceFileLoader"]


def test_the_first_difference_is_named_in_path_order():
    built = {"engine/a.py": "1", "engine/b.py": "2", "engine/c.py": "3"}
    difference = native.first_difference
    assert difference(built, dict(built)) is None
    assert difference(built, {**built, "engine/b.py": "9", "engine/c.py": "9"}) == "engine/b.py changed"
    assert difference(built, {"engine/b.py": "2", "engine/c.py": "3"}) == "engine/a.py was removed"
    assert difference(built, {**built, "engine/ab.py": "4"}) == "engine/ab.py was added"


def test_the_native_extra_pins_the_mypy_the_test_extra_pins():
    """make serve installs the native extra, make test both: two pins of mypy would flip the venv's mypy,
    and with it the build's C, between the two installs."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    mypy = {extra: [pin for pin in extras[extra] if pin.startswith("mypy==")] for extra in ("native", "test")}
    assert mypy["native"] == mypy["test"] and len(mypy["native"]) == 1
