"""Every process of a server runs what engine/native.py decides for this checkout: beside a fresh build
(`make native`), the server, its two `--workers` frontends and a Python model's stub each map the build's
group libraries; with HUBSERVE_NATIVE=0 in the server's environment, which its children inherit, none does.
Read from /proc/<pid>/maps (Linux)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, start_server
from engine import native

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "native"
BUILT, _ = native.decide(ROOT, BUILD, None)
pytestmark = pytest.mark.skipif(not BUILT.compiled, reason=f"{BUILT.line()}: no fresh build to load")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, then theirs."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone since the listing
            continue
        parents[int(text.split()[0])] = int(text.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def mapped_groups(pid: int) -> set[str]:
    """The mypyc group libraries (`<group>__mypyc`) mapped into process `pid`."""
    names = (Path(line.split()[-1]).name for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    return {name.split(".")[0] for name in names if "__mypyc." in name}


def command(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`simple` and a Python model (`repeat_stream`, whose stub starts as the model loads)."""
    root = tmp_path_factory.mktemp("repository")
    for name in ("simple", "repeat_stream"):
        shutil.copytree(EXAMPLES / name, root / name)
    return root


@pytest.mark.parametrize(("switch", "compiled"), [("", True), ("0", False)])
def test_the_server_its_workers_and_a_python_models_stub_decide_alike(repository: Path, tmp_path: Path,
                                                                      switch: str, compiled: bool):
    manifest = json.loads((BUILD / native.MANIFEST_NAME).read_text())
    groups = {name.rsplit(".", 1)[-1] for name in manifest["extensions"] if name.endswith("__mypyc")}
    srv = start_server(repository, tmp_path / "server.log", "--workers", "2", env={native.SWITCH: switch})
    try:
        processes = [srv.process.pid, *children(srv.process.pid)]
        kinds = sorted(command(pid).split(" -m ")[-1].split()[0] for pid in processes[1:])
        assert kinds == ["engine.backends.python.stub", "engine.workers.frontend", "engine.workers.frontend"]
        assert {pid: mapped_groups(pid) for pid in processes} == {
            pid: groups if compiled else set() for pid in processes}
    finally:
        srv.stop()
