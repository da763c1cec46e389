"""engine/native.py's decision, on a real build of two modules in two libraries (tools/build_native.py
in a copy of this checkout: about 4 s of CPU): beside it the copy runs both compiled, each module from its
library; one edited or added source, a build for another Python, a missing library or HUBSERVE_NATIVE=0
run every module as pure Python and say why; tools/build_native.py without a compiler writes nothing and says
so in one line. Each case is a fresh interpreter, as a server or its children are: the decision is made
once, as `engine` is imported. tests/functional/test_native_processes.py runs a server's processes on
`make native`'s build."""

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
# One module of each library of the default layout (frontend/ and the rest), so the build has two libraries
# and the modules' shims import both by name.
COMPILED = ("engine.frontend.http.path", "engine.observability.request_ids")
PURE_BESIDE = "engine.dataplane"  # not in the build: found on the path as always

REPORT = """
import importlib, json, sys
import engine.native
modules = {name: importlib.import_module(name) for name in sys.argv[1:]}
status = engine.native.status()
print(json.dumps({"line": status.line(), "stale": status.stale,
                  "loaders": {name: type(m.__spec__.loader).__name__ for name, m in modules.items()},
                  "files": {name: module.__file__ for name, module in modules.items()},
                  "groups": sorted(name for name in sys.modules if name.endswith("__mypyc"))}))
"""


def checkout(into: Path) -> Path:
    """A copy of this checkout's engine/, tools/ and pyproject.toml (mypy's settings, read by the build)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "engine", into / "engine", ignore=ignore)
    shutil.copytree(ROOT / "tools", into / "tools", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", into)
    return into


def build(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "tools" / "build_native.py"), "--opt-level", "0"],
                          cwd=root, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def report(root: Path, *modules: str, switch: str = "") -> dict:
    """What a fresh interpreter importing `engine` from `root` runs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(root), **{native.SWITCH: switch})
    done = subprocess.run([sys.executable, "-c", REPORT, *modules], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout with COMPILED built into its build/native (read only: copy it to change it)."""
    root = checkout(tmp_path_factory.mktemp("built"))
    (root / "tools" / "native_modules.txt").write_text(
        "".join(f"{name.replace('.', '/')}.py\n" for name in COMPILED))
    done = build(root)
    if done.stdout.startswith("native: not compiled"):
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    shutil.copytree(built, tmp_path / "copy", symlinks=True)
    return tmp_path / "copy"


def build_id(root: Path) -> str:
    return json.loads((root / "build" / "native" / native.MANIFEST_NAME).read_text())["build"]


def test_a_fresh_build_serves_its_modules_and_both_libraries(built: Path):
    seen = report(built, *COMPILED, PURE_BESIDE)
    assert seen["line"] == f"native: 2 modules compiled (build {build_id(built)})"
    assert seen["loaders"] == {**dict.fromkeys(COMPILED, "ExtensionFileLoader"),
                               PURE_BESIDE: "SourceFileLoader"}
    assert all(Path(seen["files"][name]).is_relative_to(built / "build" / "native") for name in COMPILED)
    assert seen["groups"] == ["hubserve_core__mypyc", "hubserve_frontend__mypyc"]


def test_the_build_is_up_to_date_while_the_sources_are(built: Path):
    done = build(built)
    assert (done.returncode, done.stdout) == (0, f"native: up to date (2 modules, build {build_id(built)})\n")


def test_an_edited_source_runs_everything_pure_and_names_the_file_and_the_rebuild(copy: Path):
    with (copy / "engine" / "observability" / "request_ids.py").open("a") as source:
        source.write("\n# edited after the build\n")
    seen = report(copy, *COMPILED)
    assert seen["stale"] is True
    assert seen["line"] == ("native: pure Python (engine/observability/request_ids.py changed since build "
                            f"{build_id(copy)}; rebuild with `make native`)")
    # the unedited module too: all or nothing
    assert seen["loaders"] == dict.fromkeys(COMPILED, "SourceFileLoader")
    assert seen["groups"] == []


def test_an_added_source_makes_the_build_stale(copy: Path):
    (copy / "engine" / "scheduling" / "extra.py").write_text("VALUE = 1\n")
    seen = report(copy, *COMPILED)
    assert seen["line"] == (f"native: pure Python (engine/scheduling/extra.py was added since build "
                            f"{build_id(copy)}; rebuild with `make native`)")
    assert seen["loaders"] == dict.fromkeys(COMPILED, "SourceFileLoader")


def test_a_build_for_another_python_or_missing_a_library_is_not_loaded(copy: Path):
    manifest_path = copy / "build" / "native" / native.MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "ext_suffix": ".cpython-399-x86_64-linux-gnu.so"}))
    seen = report(copy, *COMPILED)
    assert seen["line"].startswith(f"native: pure Python (build {manifest['build']} is for "
                                   ".cpython-399-x86_64-linux-gnu.so, this Python loads")
    assert seen["stale"] is True
    manifest_path.write_text(json.dumps(manifest))
    library = copy / "build" / "native" / manifest["extensions"]["hubserve_core__mypyc"]
    library.unlink()
    seen = report(copy, *COMPILED)
    assert seen["line"] == (f"native: pure Python (build {manifest['build']} lacks {library}; "
                            "rebuild with `make native`)")
    assert seen["loaders"] == dict.fromkeys(COMPILED, "SourceFileLoader")


def test_the_switch_runs_pure_python_beside_a_fresh_build(built: Path):
    seen = report(built, *COMPILED, switch="0")
    assert seen == {"line": "native: pure Python (HUBSERVE_NATIVE=0)", "stale": False,
                    "loaders": dict.fromkeys(COMPILED, "SourceFileLoader"),
                    "files": {name: str(built / f"{name.replace('.', '/')}.py") for name in COMPILED},
                    "groups": []}


def test_without_a_compiler_the_build_says_so_in_one_line_and_the_tree_stays_pure(tmp_path: Path):
    root = checkout(tmp_path)
    done = build(root, env={"CC": str(tmp_path / "no-such-cc")})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (f"native: not compiled, no C compiler ({tmp_path / 'no-such-cc'} not found); "
                           "the server runs as pure Python\n")
    assert not (root / "build").exists()
    seen = report(root, *COMPILED)
    assert seen["line"] == "native: pure Python (not built: `make native` compiles the hot path)"
    assert seen["loaders"] == dict.fromkeys(COMPILED, "SourceFileLoader")


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
