"""Compiles the hot path (tools/native_modules.txt) with mypyc into build/native/ (`make native`).

Run by the Makefile before the server or the suite starts; engine/native.py loads the result only while
build/native/manifest.json, written here last, matches the sources. Where there is no C compiler, no Python
headers or no mypyc, it says so in one line and exits 0: the server then runs as pure Python, as it does from
any tree without a build. A compile that fails where the tools exist is a bug in the sources (mypyc rejects
something mypy accepts) and fails the step, with the end of the compiler's log (with --fallback, which
`make serve` passes, it says so and exits 0: the sources moved on since any earlier build, so that one is
stale and the server runs pure Python).

    python tools/build_native.py             # compile unless build/native matches the sources already
    python tools/build_native.py --status    # what a process started from this tree would run, in one line
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import os
import resource
import shlex
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LIST = ROOT / "tools" / "native_modules.txt"
BUILD_DIR = ROOT / "build" / "native"
WORK_DIR = ROOT / "build" / "native-work"  # the C sources, objects and log; kept, so a rebuild can be read

os.environ["HUBSERVE_NATIVE"] = "0"  # this process only reads the sources: it never loads a build
sys.path.insert(0, str(ROOT))
from engine import native  # noqa: E402  (after the switch, so importing engine installs no finder)

# How the modules are grouped into shared libraries (measured in perf/README.md, "The compiled hot path"):
# "two" (the default): the frontends and the rest, compiled side by side with -j 2; a call from one library
# into the other stays a C call, through mypyc's export table, and the CPU per inference is the same as
# "one"'s, a single library (one gcc process on one 23 MB C file, about 1.4 times the wall and CPU time);
# "separate": a library per module (mypyc's separate=True), each with its own copy of mypyc's runtime, the
# slowest to compile.
LAYOUTS = ("one", "two", "separate")


def missing_toolchain() -> str | None:
    """Why this machine cannot compile, in words; None when it can."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    executable = shlex.split(compiler)[0]
    if shutil.which(executable) is None:
        return f"no C compiler ({executable} not found)"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no Python headers ({header} not found: the python3-dev package)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "no mypyc (it comes with mypy, pinned in pyproject.toml's native and test extras)"
    return None


def read_modules() -> list[str]:
    lines = (line.strip() for line in MODULE_LIST.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def groups(paths: list[str], layout: str) -> bool | list[tuple[list[str], str | None]]:
    """mypycify's `separate` for a layout."""
    if layout == "separate":
        return True
    if layout == "two":
        frontend = [p for p in paths if p.startswith("engine/frontend/")]
        return [(frontend, "hubserve_frontend"), ([p for p in paths if p not in frontend], "hubserve_core")]
    return False


def build_config(paths: list[str], layout: str, opt_level: str) -> dict[str, object]:
    """What, besides the sources, makes two builds the same build."""
    import mypy.version

    return {"modules": [module_name(p) for p in paths], "layout": layout, "opt_level": opt_level,
            "mypy": mypy.version.__version__, "ext_suffix": importlib.machinery.EXTENSION_SUFFIXES[0]}


def up_to_date(config: dict[str, object], sources: dict[str, str]) -> str | None:
    """The build id of build/native when it is this build of these sources already."""
    try:
        manifest = json.loads((BUILD_DIR / native.MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("config") != config or manifest.get("sources") != sources:
        return None
    status, _ = native.decide(ROOT, BUILD_DIR, None)
    return status.build if status.compiled else None


def compile_into(lib: Path, paths: list[str], layout: str, opt_level: str, jobs: int) -> None:
    """mypyc's C for `paths`, compiled by setuptools' build_ext into `lib`; the compiler's output to the
    work folder's build.log (the end of it printed if the compile fails)."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    # mypy's cache apart from `make lint`'s .mypy_cache: other options, and both may run at once
    cache = ["--cache-dir", str(WORK_DIR / "mypy_cache")]
    extensions = mypycify([*cache, *paths], opt_level=opt_level, debug_level="1", strict_dunder_typing=False,
                          separate=groups(paths, layout), target_dir=str(WORK_DIR / "c"),
                          group_name="hubserve" if layout == "one" else None)
    dist = Distribution({"name": "hubserve-native", "ext_modules": extensions, "script_name": "build_native",
                         "script_args": ["build_ext", "--build-lib", str(lib),
                                         "--build-temp", str(WORK_DIR / "temp"), "--parallel", str(jobs)]})
    dist.parse_command_line()
    dist.run_commands()


def run_logged(log: Path, action: Callable[[], None]) -> None:
    """Runs `action()` with this process's stdout and stderr (gcc's too) sent to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            action()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def extensions_in(lib: Path, suffix: str) -> dict[str, str]:
    """Every extension module build_ext wrote, by its module name: the compiled modules' shims and the
    groups' `<name>__mypyc` libraries the shims import."""
    found: dict[str, str] = {}
    for path in sorted(lib.rglob(f"*{suffix}")):
        relative = path.relative_to(lib).as_posix()
        found[relative.removesuffix(suffix).replace("/", ".")] = relative
    return found


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"


def build(layout: str, opt_level: str, jobs: int, force: bool, fallback: bool) -> int:
    os.chdir(ROOT)  # mypycify takes the paths as given and reads [tool.mypy] from pyproject.toml here
    reason = missing_toolchain()
    if reason is not None:
        print(f"native: not compiled, {reason}; the server runs as pure Python")
        return 0
    paths = read_modules()
    stray = sorted((ROOT / "engine").rglob(f"*{importlib.machinery.EXTENSION_SUFFIXES[0]}"))
    for path in stray:  # from a `build_ext --inplace` beside the sources: the path finder would prefer them
        path.unlink()
    if stray:
        print(f"native: removed {len(stray)} extension files under engine/ (an in-place build's, e.g. "
              f"{stray[0].relative_to(ROOT)}): they would shadow the .py files whatever the manifest says")
    sources = native.source_hashes(ROOT)  # before the compile: an edit during it makes the build stale
    config = build_config(paths, layout, opt_level)
    current = None if force else up_to_date(config, sources)
    if current is not None:
        print(f"native: up to date ({len(paths)} modules, build {current})")
        return 0
    print(f"native: compiling {len(paths)} modules with mypyc ({layout} library layout, -j {jobs}); "
          f"minutes, log in {WORK_DIR.relative_to(ROOT)}/build.log", flush=True)
    lib = WORK_DIR / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    load_before, started, cpu_before = os.getloadavg()[0], time.monotonic(), cpu_seconds()
    log = WORK_DIR / "build.log"
    try:
        run_logged(log, lambda: compile_into(lib, paths, layout, opt_level, jobs))
    except BaseException as exc:  # SystemExit from setuptools, CompileError, mypyc's type errors
        print("\n".join(log.read_text().splitlines()[-40:]))
        print(f"native: the compile failed ({type(exc).__name__}: {str(exc)[:300]}); the log: {log}",
              file=sys.stderr)
        if fallback:  # what a server started now runs: pure Python, unless an earlier build still matches
            print(native.decide(ROOT, BUILD_DIR, None)[0].line())
            return 0
        return 1
    wall, cpu = time.monotonic() - started, cpu_seconds() - cpu_before
    suffix = str(config["ext_suffix"])
    build_id = hashlib.sha256(json.dumps([config, sources], sort_keys=True).encode()).hexdigest()[:12]
    manifest = {"build": build_id, "ext_suffix": suffix, "modules": config["modules"], "config": config,
                "extensions": extensions_in(lib, suffix), "sources": sources,
                "compile": {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}}
    (lib / native.MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    lib.rename(BUILD_DIR)
    print(f"native: {len(paths)} modules compiled in {minutes(wall)} ({minutes(cpu)} CPU; load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after), build {build_id}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--status", action="store_true", help="say what a process started here would run")
    parser.add_argument("--layout", choices=LAYOUTS, default="two")
    parser.add_argument("--opt-level", default="3", help="gcc's -O level (mypyc's opt_level)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="libraries compiled at once")
    parser.add_argument("--force", action="store_true", help="compile even if build/native is up to date")
    parser.add_argument("--fallback", action="store_true",
                        help="a failed compile is pure Python, not a failure (make serve)")
    args = parser.parse_args()
    if args.status:
        status, _ = native.decide(ROOT, BUILD_DIR, None)
        print(status.line())
        return 0
    return build(args.layout, args.opt_level, args.jobs, args.force, args.fallback)


if __name__ == "__main__":
    sys.exit(main())
