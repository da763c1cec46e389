"""What a non-editable install gets: the wheel `pip wheel --no-deps .` builds from this checkout's tracked
files holds every module of the server, the load tester, the harness and the model builders (so every
package has its __init__.py). Built in a temporary copy, so the checkout gets no build/ or egg-info."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

SHIPPED = ("engine/", "perf/hubserve_perf/", "perf/hubserve_harness/", "perf/hubserve_models/")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, timeout=60)
    return [name for name in out.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def test_the_wheel_holds_every_module(tmp_path: Path) -> None:
    source = tmp_path / "source"
    files = tracked_files()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=300, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("hubserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    want = {name.removeprefix("perf/") for name in files
            if name.startswith(SHIPPED) and name.endswith((".py", ".pyi"))}
    assert want and want <= names, sorted(want - names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "hubserve = engine.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not [n for n in names if n.startswith(("tests/", "model_repository/", "perf/bench"))]
